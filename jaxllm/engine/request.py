"""Host-side state of one request: plain Python ints and lists, never device arrays."""

from __future__ import annotations

import dataclasses
import enum
import time

from jaxllm.sampling_params import SamplingParams
from jaxllm.spec_decode.eligibility import AcceptanceTracker
from jaxllm.structured_outputs.request_state import RequestGrammar


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, to be recomputed from scratch (its output so far is kept)
    FINISHED_STOPPED = "stop"  # EOS, a stop token id or a stop string
    FINISHED_LENGTH = "length"  # max_tokens or the model's context
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in _FINISHED


# A module tuple, not a class lookup per call: an Enum member looked up on its class is slow (asked per request
# per step).
_FINISHED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)


@dataclasses.dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = dataclasses.field(default_factory=time.monotonic)
    priority: int = 0  # lower runs first when the scheduler's policy is "priority"
    eos_token_ids: tuple[int, ...] = ()  # every id that ends the generation (unless ignore_eos)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the pool (or will be, by steps already dispatched)
    num_pending: int = 0  # tokens sampled by dispatched steps whose values have not come back yet
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first scheduling
    num_preemptions: int = 0
    num_prompt_logprob_positions: int = 0  # prompt positions whose logprobs a dispatched step computes
    num_blocks_sent: int | None = None  # blocks the runner has been told of; None: the runner does not hold it
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    sample_index: int = 0  # which of the parent's samples (n, or best_of) this is
    ranked: bool = False  # one of best_of > n samples: its cumulative logprob decides whether it is returned
    rng_stream: int = 0  # distinct per request: unseeded sampling noise is drawn from (engine seed, stream)
    lora_int_id: int = 0  # the LoRA adapter it runs with (LoRARequest.lora_int_id); 0: the base model
    wait_for: "Request | None" = None  # a sibling whose prompt must be computed first (n > 1 prefix sharing)
    first_token_time: float | None = None
    length_limit: int = 0  # max_total_tokens under the scheduler's max_model_len (set when it is added)
    grammar: RequestGrammar | None = None  # structured outputs: the grammar its output follows
    spec: AcceptanceTracker | None = None  # speculative decoding: None, it never speculates
    num_spec_in_flight: int = 0  # proposals in a dispatched step, verified when its results come back

    def __post_init__(self):
        self._all_token_ids = self.prompt_token_ids + self.output_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output tokens (kept as one list, extended by append_output: never rebuilt)."""
        return self._all_token_ids

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def truncate_output(self, num_output: int) -> None:
        """Keep the first num_output outputs (a stop string ended it inside a run of speculated tokens)."""
        del self.output_token_ids[num_output:]
        del self._all_token_ids[self.num_prompt_tokens + num_output:]

    @property
    def needs_sample_logprobs(self) -> bool:
        """The sampled tokens' logprobs are needed: the user asked for them, or they rank this sample."""
        return self.ranked or self.sampling_params.logprobs is not None

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_prefill_done(self) -> bool:
        return self.num_computed_tokens >= self.num_prompt_tokens

    def max_total_tokens(self, max_model_len: int) -> int:
        """The length this request can reach: prompt + max_tokens, capped by the context."""
        max_tokens = self.sampling_params.max_tokens
        limit = max_model_len if max_tokens is None else self.num_prompt_tokens + max_tokens
        return min(limit, max_model_len)
