"""What the offline API and the server share to run beam search over the engine, one step at a time.

Each step every running beam of every prompt is one engine request whose prompt is the beam's tokens,
generating one token with the K best logprobs (vLLM's LLM.beam_search does the same); all of them are added
together, so the engine serves the beams of all prompts in the same steps. Their blocks are shared through the
prefix cache: a beam's request finds the full blocks of the prompt and of its own earlier tokens cached (its
parent's request registered them), so memory grows by each beam's own tokens only and each step computes at
most a block's worth of tokens per beam.
"""

from __future__ import annotations

from jaxllm.beam_search import BeamSearchParams, BeamSearchSequence
from jaxllm.beam_search_state import BeamSearchInstance
from jaxllm.outputs import Logprob, RequestOutput
from jaxllm.sampling_params import SamplingParams


def step_sampling_params(params: BeamSearchParams, eos_token_ids: tuple[int, ...]) -> SamplingParams:
    """One beam's request in one step: a single token, with its beam's K best logprobs."""
    params.check_width(len(eos_token_ids))
    return SamplingParams(max_tokens=1, logprobs=params.candidates_per_beam(len(eos_token_ids)),
                          temperature=params.temperature, detokenize=False)


def new_instance(prompt_token_ids: list[int], params: BeamSearchParams, eos_token_ids: tuple[int, ...],
                 max_model_len: int, lora_request=None) -> BeamSearchInstance:
    """ValueError (naming max_tokens) when a beam could outgrow the context."""
    total = len(prompt_token_ids) + params.max_tokens
    if total > max_model_len:
        raise ValueError(f"max_tokens {params.max_tokens} with a prompt of {len(prompt_token_ids)} tokens "
                         f"({total}) exceeds max_model_len {max_model_len}")
    return BeamSearchInstance(prompt_token_ids, params, eos_token_ids, params.max_tokens, lora_request)


def step_prompts(instances: list[BeamSearchInstance]) -> list[tuple[BeamSearchInstance, list[int]]]:
    """(instance, beam tokens) for every running beam of every unfinished instance, in order."""
    return [(inst, tokens) for inst in instances if not inst.done for tokens in inst.beam_prompts()]


def advance_all(batch: list[tuple[BeamSearchInstance, list[int]]], outputs: list[RequestOutput]) -> None:
    """Hand each instance its beams' candidates (outputs in the order of `batch`)."""
    tops: dict[int, list[dict[int, Logprob]]] = {}
    instances = {}
    for (inst, _), output in zip(batch, outputs, strict=True):
        tops.setdefault(id(inst), []).append(_candidates(output))
        instances[id(inst)] = inst
    for key, inst in instances.items():
        inst.advance(tops[key])


def _candidates(output: RequestOutput) -> dict[int, Logprob]:
    completion = output.outputs[0]
    if not completion.logprobs:
        raise RuntimeError(f"beam request {output.request_id} ended without a token ({completion.finish_reason})")
    return completion.logprobs[0]


def decode_sequences(instance: BeamSearchInstance, tokenizer) -> list[BeamSearchSequence]:
    """The instance's best hypotheses, text decoded from all of their tokens (vLLM's LLM.beam_search)."""
    sequences = instance.sequences()
    for sequence in sequences:
        sequence.text = None if tokenizer is None else tokenizer.decode(sequence.tokens)
    return sequences
