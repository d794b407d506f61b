"""RequestGrammar: one request's progress through its grammar (host side, beside the scheduler's Request).

    ready          its grammar is compiled (the scheduler admits the request only then)
    accept(token)  a sampled token advances the matcher (False: the grammar does not allow it)
    fill(bitmask, row, budget)  the tokens allowed next, as bits: bitmask [S, ceil(V / 32)] int32, bit t % 32 of
                        word t // 32 set when token t may follow; a finished grammar allows every token (its
                        request ends, and the token of a step scheduled ahead is dropped); budget: the tokens the
                        request may still produce, this one included (None: not known), read by a BudgetCloser
    closed_by_budget  a BudgetCloser forced the output's end (the request finishes with "length")
    rollback(n)    undo the last n accepted tokens (speculative decoding's rejected drafts)
    is_terminated  the grammar is complete and has accepted a stop token, or has nothing more to take

step_bitmask builds one step's bitmask from its sampled requests' grammars, each over its sampler rows (one,
or k + 1 with k proposals).

With a BudgetCloser (a forced tool call's JSON) the last tokens of the budget may be forced to close the JSON
(budget_closing.py): fill then allows the closing's next token alone.

The matcher is made when the grammar is first used; n > 1 samples of a prompt each have their own.

With a ReasoningGate (a reasoning model's output: <think>...</think> then the answer) the grammar applies to the
answer only: until the reasoning's end marker has appeared in the output, every token is allowed and none reaches
the matcher; the token that completes the marker opens the gate, and the grammar constrains the tokens after it.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Callable

import numpy as np

from jaxllm import optional_deps
from jaxllm.structured_outputs.budget_closing import BudgetCloser
from jaxllm.spec_decode.sampler_rows import first_sampler_rows

class ReasoningGate:
    """Whether a reasoning output has reached its answer: open once `marker` (e.g. "</think>") appears in the
    text of the tokens pushed, read through `decode` (token ids -> text) over a short window of the last tokens
    (a marker may span several tokens)."""

    WINDOW = 16  # tokens: a marker's length in characters bounds its length in tokens, plus a few of them

    def __init__(self, marker: str, decode: Callable[[list[int]], str], *, open: bool = False):
        self._marker, self._decode = marker, decode
        self._window: list[int] = []
        self.open = open

    def push(self, token_id: int) -> None:
        self._window = (self._window + [token_id])[-max(self.WINDOW, len(self._marker) + 2):]
        if self._marker in self._decode(self._window):
            self.open, self._window = True, []


class RequestGrammar:
    def __init__(self, compiled: Future, gate: ReasoningGate | None = None, closer: BudgetCloser | None = None):
        self._compiled = compiled
        self._matcher = None
        self._gate = gate  # None: the grammar applies from the output's first token
        self._closer = closer  # None: the output is cut where the budget ends
        self._accepted: list[int] = []  # the tokens the matcher has taken

    @property
    def num_accepted(self) -> int:
        return len(self._accepted)

    @property
    def closed_by_budget(self) -> bool:
        return self._closer is not None and self._closer.used

    @property
    def active(self) -> bool:
        """Whether the grammar constrains the next token (False while the output is still reasoning)."""
        return self._gate is None or self._gate.open

    @property
    def ready(self) -> bool:
        return self._compiled.done()

    @property
    def error(self) -> BaseException | None:
        """Why the grammar could not be compiled (None: compiled, or not yet done)."""
        if not self._compiled.done():
            return None
        return RuntimeError("cancelled") if self._compiled.cancelled() else self._compiled.exception()

    @property
    def matcher(self):
        if self._matcher is None:
            xgr = optional_deps.require("xgrammar", optional_deps.STRUCTURED_OUTPUTS)
            self._matcher = xgr.GrammarMatcher(self._compiled.result())  # rollback: any number of tokens
        return self._matcher

    @property
    def is_terminated(self) -> bool:
        return self.active and self.matcher.is_terminated()

    def accept(self, token_id: int) -> bool:
        if not self.active:
            self._gate.push(token_id)
            return True
        if self.matcher.is_terminated() or not self.matcher.accept_token(token_id):
            return False
        self._accepted.append(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        num_tokens = min(num_tokens, self.num_accepted)  # tokens of the reasoning never reached the matcher
        if not num_tokens:
            return
        self.matcher.rollback(num_tokens)
        del self._accepted[-num_tokens:]

    def fill(self, bitmask: np.ndarray, row: int, budget: int | None = None) -> None:
        if not self.active or self.matcher.is_terminated():
            bitmask[row] = -1
            return
        forced = None if self._closer is None or budget is None else \
            self._closer.forced_token(self._accepted, budget, self.matcher)
        if forced is None:
            self.matcher.fill_next_token_bitmask(bitmask, row)
        else:
            bitmask[row] = 0
            bitmask[row].view(np.uint32)[forced // 32] = np.uint32(1 << (forced % 32))


def step_bitmask(grammars: list[RequestGrammar | None], proposals: list[list[int]], width: int,
                 budgets: list[int | None] | None = None) -> np.ndarray:
    """[R, width] int32: a step's token bitmask over its R sampler rows, for its sampled chunks in order (each one's
    grammar, None where unconstrained, its proposals and its budget: the tokens it may still produce). A chunk with
    k proposals owns k + 1 rows (spec_decode/sampler_rows.py): row i holds its grammar's mask after proposals
    1 .. i. Rows of no grammar allow every token."""
    first_rows, num_rows = first_sampler_rows(np.asarray([len(p) for p in proposals], np.int64))  # [N], R
    bitmask = np.full((num_rows, width), -1, np.int32)  # [R, W]
    for row, grammar, drafts, budget in zip(first_rows, grammars, proposals, budgets or [None] * len(grammars)):
        if grammar is not None:
            fill_proposal_rows(grammar, drafts, bitmask, int(row), budget)
    return bitmask


def fill_proposal_rows(grammar: RequestGrammar, proposals: list[int], bitmask: np.ndarray, row: int,
                       budget: int | None = None) -> None:
    """Rows row .. row + len(proposals) of bitmask: each the grammar's mask after the proposals before it, the
    grammar left as it was. From a proposal the grammar refuses on, the rows stay as they were (allowing every
    token): the target's row before it cannot sample that proposal, so it is rejected and the rows after it are
    never read. Proposals reach the matcher only while the grammar is active (the scheduler does not speculate
    for a request whose reasoning gate is closed)."""
    grammar.fill(bitmask, row, budget)
    if not grammar.active:
        return
    taken = 0
    for token in proposals:
        if not grammar.accept(token):
            break
        taken += 1
        grammar.fill(bitmask, row + taken, None if budget is None else budget - taken)
    grammar.rollback(taken)
