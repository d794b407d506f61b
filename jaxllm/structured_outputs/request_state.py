"""RequestGrammar: one request's progress through its grammar (host side, beside the scheduler's Request).

    ready          its grammar is compiled (the scheduler admits the request only then)
    accept(token)  a sampled token advances the matcher (False: the grammar does not allow it)
    fill(bitmask, row)  the tokens allowed next, as bits: bitmask [S, ceil(V / 32)] int32, bit t % 32 of word
                        t // 32 set when token t may follow; a finished grammar allows every token (its request
                        ends, and the token of a step scheduled ahead is dropped)
    rollback(n)    undo the last n accepted tokens (speculative decoding's rejected drafts)
    is_terminated  the grammar is complete and has accepted a stop token, or has nothing more to take

The matcher is made when the grammar is first used; n > 1 samples of a prompt each have their own.
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from jaxllm import optional_deps

class RequestGrammar:
    def __init__(self, compiled: Future):
        self._compiled = compiled
        self._matcher = None
        self.num_accepted = 0

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
        return self.matcher.is_terminated()

    def accept(self, token_id: int) -> bool:
        if self.matcher.is_terminated() or not self.matcher.accept_token(token_id):
            return False
        self.num_accepted += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)
        self.num_accepted -= num_tokens

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        if self.matcher.is_terminated():
            bitmask[row] = -1
        else:
            self.matcher.fill_next_token_bitmask(bitmask, row)
