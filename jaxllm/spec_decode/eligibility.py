"""Which requests speculate, and when a request stops.

A request speculates unless its sampling needs per-token state that proposals would have to thread through the
k + 1 rows of one step, which jaxllm does not do (the request then decodes one token per step, as without
speculation): penalties, logit bias / allowed_token_ids, bad_words, min_tokens (its EOS mask counts the tokens
sampled) and logprob_token_ids. Structured outputs speculate: row i's bitmask is the grammar's after it took
proposals 1 .. i, rolled back after the bitmask is filled (structured_outputs/request_state.py step_bitmask), and
the verified tokens advance it; while a reasoning model's output is still in its reasoning (the grammar's gate
closed) the request does not speculate (scheduler.py).

Low acceptance: proposals cost a longer query and a step the host must wait for (no async overlap), so a
request whose proposals are rarely right stops speculating: after ACCEPTANCE_WINDOW steps in which it was
eligible, if it gained fewer than MIN_ACCEPTED_PER_STEP accepted tokens per such step, it decodes plainly for
the rest of its life.
"""

from __future__ import annotations

from jaxllm.sampling_params import SamplingParams

ACCEPTANCE_WINDOW = 16  # eligible steps before a request's acceptance is judged
MIN_ACCEPTED_PER_STEP = 0.5  # accepted tokens per eligible step below which a request stops speculating


def can_speculate(params: SamplingParams) -> bool:
    """Whether a request with these parameters may speculate at all."""
    return not (params.needs_penalties or params.biases_logits or params.bad_words_token_ids
                or params.min_tokens > 0 or params.logprob_token_ids)


class AcceptanceTracker:
    """One request's record: eligible steps and accepted tokens; off once acceptance stays low."""

    __slots__ = ("steps", "accepted", "off")

    def __init__(self):
        self.steps = 0
        self.accepted = 0
        self.off = False

    def record(self, num_accepted: int) -> None:
        """An eligible step ended with num_accepted proposals accepted (0 when it had none)."""
        self.steps += 1
        self.accepted += num_accepted
        if self.steps >= ACCEPTANCE_WINDOW and self.accepted < MIN_ACCEPTED_PER_STEP * self.steps:
            self.off = True
