"""Beam search's parameters and outputs, with vLLM's names: BeamSearchParams, BeamSearchSequence, BeamSearchOutput.

The search itself (beam_search_state.py) follows Hugging Face's `generate(num_beams=W, do_sample=False)`, which
differs from vLLM's LLM.beam_search in three ways (README, "Beam search"):

    score of a finished hypothesis   HF, here: cum_logprob / generated_len ** length_penalty, the EOS counted
                                     vLLM:     cum_logprob / (prompt_len + generated_len) ** length_penalty,
                                               the EOS not counted
    which EOS candidates finish      HF, here: those among the step's W best candidates (of all beams)
                                     vLLM:     every EOS among each beam's 2W best
    when the search stops            HF, here: early_stopping (False: when no running beam can beat the worst
                                               of W finished ones at its current length; True: once W have
                                               finished; "never": only at max_tokens, or at its best length
                                               bound when length_penalty > 0)
                                     vLLM:     after max_tokens steps (or when no beam is left)

With length_penalty = 0 and early_stopping = "never" both rank by cum_logprob alone and stop at max_tokens.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from jaxllm.outputs import Logprob
from jaxllm.sampling_params import MAX_LOGPROBS


@dataclasses.dataclass
class BeamSearchParams:
    """vLLM's BeamSearchParams, plus Hugging Face's early_stopping (see the module docstring).

    beam_width: beams kept per prompt, and sequences returned.
    max_tokens: most tokens a beam generates.
    ignore_eos: EOS is an ordinary token (beams end only at max_tokens).
    temperature: passed to each step's sampling as vLLM does; the beams are chosen by the model's raw
        logprobs, so it changes nothing (beam search is deterministic).
    length_penalty: finished hypotheses are ranked by cum_logprob / generated_len ** length_penalty.
    include_stop_str_in_output: vLLM's field; there are no stop strings in beam search, so it only keeps the EOS
        token in the server's output.
    early_stopping: True, False or "never", as Hugging Face's generate.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        _require_int("beam_width", self.beam_width, 1)
        _require_int("max_tokens", self.max_tokens, 1)
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        _require_real("temperature", self.temperature, ">= 0", lambda v: v >= 0)
        _require_real("length_penalty", self.length_penalty, "a finite number", lambda v: True)
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")

    def candidates_per_beam(self, num_eos: int) -> int:
        """K: the candidates kept each step, HF's max(2, 1 + number of EOS ids) * beam_width; each beam asks for
        its own K best tokens (the step's K best of all beams are among them)."""
        return max(2, 1 + (0 if self.ignore_eos else num_eos)) * self.beam_width

    def check_width(self, num_eos: int) -> None:
        k = self.candidates_per_beam(num_eos)
        if k > MAX_LOGPROBS:
            factor = k // self.beam_width
            raise ValueError(f"beam_width must be <= {MAX_LOGPROBS // factor} (each beam reads its {factor} x "
                             f"beam_width best tokens, at most {MAX_LOGPROBS}), got {self.beam_width}")


@dataclasses.dataclass
class BeamSearchSequence:
    """One returned hypothesis (vLLM's fields): tokens are the prompt's followed by the generated ones (the EOS
    included when it ended on one); logprobs holds, per generated token, the logprobs its beam read (its K best
    tokens); text decodes `tokens` (vLLM's LLM.beam_search); finish_reason "stop" (EOS, stop_reason its id) or
    "length"."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    lora_request: object | None = None
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    score: float | None = None  # cum_logprob / generated_len ** length_penalty (what ranks it)
    num_prompt_tokens: int = 0

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens:]


@dataclasses.dataclass
class BeamSearchOutput:
    """The best beam_width hypotheses of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def get_beam_search_score(generated_len: int, cum_logprob: float, length_penalty: float = 1.0) -> float:
    """Hugging Face's score of a finished hypothesis: generated_len counts its generated tokens, the EOS
    included (vLLM's function divides by the whole sequence's length, the prompt included, the EOS not)."""
    return cum_logprob / (generated_len ** length_penalty)


def _require_int(name: str, value, low: int) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _require_real(name: str, value, what: str, ok) -> None:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value) or not ok(value):
        raise ValueError(f"{name} must be {what}, got {value!r}")
