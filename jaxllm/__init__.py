"""jaxllm: an LLM inference engine in JAX and Pallas."""

from jaxllm.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from jaxllm.config import ModelConfig
from jaxllm.errors import ModelLoadError, ModelNotFoundError
from jaxllm.llm import LLM
from jaxllm.loaders import LoadedModel, load_model
from jaxllm.lora import LoRARequest
from jaxllm.outputs import CompletionOutput, RequestOutput
from jaxllm.sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = ["LLM", "LoRARequest", "SamplingParams", "BeamSearchParams", "BeamSearchOutput", "BeamSearchSequence", "RequestOutput", "CompletionOutput", "ModelConfig", "ModelLoadError",
           "ModelNotFoundError", "LoadedModel", "load_model", "__version__"]
