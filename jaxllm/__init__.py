"""jaxllm: an LLM inference engine in JAX and Pallas."""

from jaxllm.config import ModelConfig
from jaxllm.errors import ModelLoadError, ModelNotFoundError
from jaxllm.loaders import LoadedModel, load_model

__version__ = "0.1.0"

__all__ = ["ModelConfig", "ModelLoadError", "ModelNotFoundError", "LoadedModel", "load_model", "__version__"]
