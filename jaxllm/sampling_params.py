"""SamplingParams: how one request is sampled and when it stops (host side; vLLM's field names and semantics).

Every field is checked in `__post_init__`; a bad value raises ValueError naming the field and its allowed range.
Checks that need the model's vocabulary size live in `validate_for_vocab`.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import numbers

from jaxllm.stop_strings import StopMatcher
from jaxllm.structured_outputs.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

SAMPLING_EPS = 1e-5  # temperatures below this mean greedy sampling
MIN_TEMPERATURE = 1e-2  # smaller positive temperatures are raised to this (they overflow float32 logits)
MAX_LOGPROBS = 20  # the most top-N logprobs a request may ask for, per token
MAX_BAD_WORDS = 64  # token sequences of bad_words per request (a word may give two: with and without a space)
MAX_BAD_WORD_LEN = 16  # tokens per bad word


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclasses.dataclass
class SamplingParams:
    """Sampling parameters of one request (see vLLM's SamplingParams; the OpenAI API's fields).

    n: outputs to return for the prompt.
    best_of: sequences to sample (None: n); must be >= n. When it exceeds n, the n with the highest cumulative
        logprob (the sum of the sampled tokens' logprobs) are returned, best first, and only once all finished.
    presence_penalty / frequency_penalty: in [-2, 2]; subtracted from the logit of every token already in the
        output, once (presence) or once per occurrence (frequency). Positive values discourage repetition.
    repetition_penalty: > 0; logits of tokens in the prompt or the output are divided by it when positive and
        multiplied by it when negative. 1 disables it.
    temperature: >= 0; below 1e-5 means greedy; values in [1e-5, 0.01) are raised to 0.01.
    top_p: in (0, 1]; keep the smallest set of most likely tokens whose probability reaches top_p.
    top_k: keep the k most likely tokens; 0 or -1 disables it (normalised to 0).
    min_p: in [0, 1]; drop tokens less likely than min_p times the most likely one.
    seed: per-request seed; the same seed gives the same tokens whatever else is batched with the request.
    stop: strings that end the generation; not part of the output unless include_stop_str_in_output.
    stop_token_ids: tokens that end the generation.
    ignore_eos: keep generating after an EOS token (the model may declare several).
    max_tokens: most tokens to generate; None means up to the model's context.
    min_tokens: EOS and stop_token_ids cannot be sampled, nor stop strings match, before this many tokens.
    logprobs: None, or the number of top logprobs per output token (0: only the sampled token's).
    logprob_token_ids: the token ids whose logprobs are reported at every output position instead of the top
        `logprobs` (beside the sampled token's); needs logprobs (vLLM's field).
    prompt_logprobs: None, or the number of top logprobs per prompt token.
    skip_special_tokens / spaces_between_special_tokens: detokenization options.
    include_stop_str_in_output: keep the matched stop string at the end of the output text.
    logit_bias: token id -> value added to its logit before sampling.
    allowed_token_ids: None, or the only tokens that may be sampled.
    bad_words: words that may not be generated: a word's last token is banned wherever the output's latest tokens
        are the rest of it (each word tokenized as it is and with a leading space; update_from_tokenizer).
    detokenize: produce output text (stop strings need it).
    structured_outputs: None, or the constraint the output follows (a JSON schema, a regex, a choice, a grammar:
        StructuredOutputsParams); enforced by masking the tokens the grammar does not allow at each step.
    """

    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    logprob_token_ids: list[int] | None = None
    detokenize: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stop, (str, list, tuple, type(None))):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, (list, tuple, type(None))):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}")
        self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        self._bad_words_token_ids: list[list[int]] = []  # derived by update_from_tokenizer, not a field
        self._stop_matcher: StopMatcher | None = None  # built by stop_matcher(), then kept
        if self.top_k == -1:
            self.top_k = 0
        self._validate()
        if SAMPLING_EPS <= self.temperature < MIN_TEMPERATURE:
            logger.warning("temperature %s raised to %s", self.temperature, MIN_TEMPERATURE)
            self.temperature = MIN_TEMPERATURE
        if self.sampling_type == SamplingType.GREEDY:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n != 1:
                raise ValueError(f"n must be 1 when sampling greedily (temperature 0), got {self.n}")
            if self.num_sequences != 1:
                raise ValueError(f"best_of must be 1 when sampling greedily (temperature 0), got {self.best_of}")

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def num_sequences(self) -> int:
        """Sequences sampled for the prompt: best_of, or n when best_of is None."""
        return self.n if self.best_of is None else self.best_of

    @property
    def ranks_sequences(self) -> bool:
        """More sequences are sampled than returned: the n best by cumulative logprob are kept."""
        return self.num_sequences > self.n

    @property
    def biases_logits(self) -> bool:
        """A per-token addition to the logits: logit_bias, or -inf outside allowed_token_ids."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def stop_matcher(self) -> StopMatcher | None:
        """The automaton that finds the stop strings in the output (None without them); built at the first call,
        in time linear in the stop strings' length, and kept (copies of these params share it)."""
        if self._stop_matcher is None and self.stop:
            self._stop_matcher = StopMatcher(self.stop)
        return self._stop_matcher

    @property
    def bad_words_token_ids(self) -> list[list[int]]:
        """bad_words as token sequences (after update_from_tokenizer)."""
        return self._bad_words_token_ids

    def update_from_tokenizer(self, tokenizer) -> None:
        """Tokenize bad_words as vLLM does: each word without its leading spaces, then with one space before it
        where that gives a different first token but as many tokens (a word inside a sentence)."""
        sequences = []
        for word in self.bad_words or []:
            if tokenizer is None:
                raise ValueError("bad_words need a tokenizer; this engine runs without one")
            plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if not 1 <= len(plain) <= MAX_BAD_WORD_LEN:
                raise ValueError(f"bad_words: {word!r} is {len(plain)} tokens; at most {MAX_BAD_WORD_LEN} are allowed")
            sequences.append(plain)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                sequences.append(spaced)
        if len(sequences) > MAX_BAD_WORDS:
            raise ValueError(f"bad_words: at most {MAX_BAD_WORDS} token sequences, got {len(sequences)} from "
                             f"{len(self.bad_words)} words (a word may give two: with and without a leading space)")
        self._bad_words_token_ids = sequences

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Raise ValueError if logit_bias, stop_token_ids, allowed_token_ids or bad_words name a token outside
        [0, vocab_size)."""
        for name, ids in (("logit_bias", self.logit_bias or {}), ("stop_token_ids", self.stop_token_ids),
                          ("allowed_token_ids", self.allowed_token_ids or []),
                          ("bad_words", [i for ids in self._bad_words_token_ids for i in ids]),
                          ("logprob_token_ids", self.logprob_token_ids or [])):
            bad = [i for i in ids if not 0 <= i < vocab_size]
            if bad:
                raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), got {bad}")

    def _validate(self) -> None:
        _require_int("n", self.n, low=1)
        if self.best_of is not None:
            _require_int("best_of", self.best_of, low=1)
            if self.best_of < self.n:
                raise ValueError(f"best_of must be >= n ({self.n}), got {self.best_of}")
        _require_range("presence_penalty", self.presence_penalty, -2.0, 2.0, "in [-2, 2]")
        _require_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, "in [-2, 2]")
        _require_range("repetition_penalty", self.repetition_penalty, 0.0, math.inf, "> 0", low_open=True)
        _require_range("temperature", self.temperature, 0.0, math.inf, ">= 0")
        _require_range("top_p", self.top_p, 0.0, 1.0, "in (0, 1]", low_open=True)
        _require_int("top_k", self.top_k, low=0, what="0 or -1 (disabled), or >= 1")
        _require_range("min_p", self.min_p, 0.0, 1.0, "in [0, 1]")
        if self.seed is not None:
            _require_int("seed", self.seed)
        if self.max_tokens is not None:
            _require_int("max_tokens", self.max_tokens, low=1)
        _require_int("min_tokens", self.min_tokens, low=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name), low=0, high=MAX_LOGPROBS)
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True")
        for token in self.stop_token_ids:
            _require_int("stop_token_ids", token, low=0)
        self._validate_logit_bias()
        if self.allowed_token_ids is not None:
            if not isinstance(self.allowed_token_ids, (list, tuple)) or not self.allowed_token_ids:
                raise ValueError(f"allowed_token_ids must be a non-empty list of token ids, got "
                                 f"{self.allowed_token_ids!r}")
            for token in self.allowed_token_ids:
                _require_int("allowed_token_ids", token, low=0)
        self._validate_logprob_token_ids()
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}")
        if self.bad_words is not None and (not isinstance(self.bad_words, (list, tuple)) or not all(
                isinstance(w, str) and w.strip() for w in self.bad_words)):
            raise ValueError(f"bad_words must be a list of non-blank strings, got {self.bad_words!r}")

    def _validate_logprob_token_ids(self) -> None:
        ids = self.logprob_token_ids
        if ids is None:
            return
        if not isinstance(ids, (list, tuple)) or not 1 <= len(ids) <= MAX_LOGPROBS:
            raise ValueError(f"logprob_token_ids must be a list of 1 to {MAX_LOGPROBS} token ids, got {ids!r}")
        for token in ids:
            _require_int("logprob_token_ids", token, low=0)
        if len(set(ids)) != len(ids):
            raise ValueError(f"logprob_token_ids must not repeat a token id, got {ids!r}")
        if self.logprobs is None:
            raise ValueError("logprob_token_ids needs logprobs (the ids' logprobs are reported with the sampled "
                             "token's)")

    def _validate_logit_bias(self) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {type(self.logit_bias).__name__}")
        for token, bias in self.logit_bias.items():
            _require_int("logit_bias", token, low=0, what="keyed by token ids >= 0")
            _require_range("logit_bias", bias, -math.inf, math.inf, "finite values")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _require_int(name: str, value, low: int | None = None, high: int | None = None, what: str | None = None) -> None:
    if _is_int(value) and (low is None or value >= low) and (high is None or value <= high):
        return
    if what is None:
        bounds = {(True, True): "an int", (False, True): f"an int >= {low}", (True, False): f"an int <= {high}",
                  (False, False): f"an int in [{low}, {high}]"}[(low is None, high is None)]
        what = bounds
    raise ValueError(f"{name} must be {what}, got {value!r}")


def _require_range(name: str, value, low: float, high: float, what: str, low_open: bool = False) -> None:
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
          and (value > low if low_open else value >= low) and value <= high)
    if not ok:
        raise ValueError(f"{name} must be {what}, got {value!r}")
