"""BudgetCloser: a forced tool call's JSON finished within the request's token budget.

tool_choice "required" or a named function constrains the reply to a JSON schema so that every call is valid
whatever the model; but a model may write a string argument that never closes (a 135M model at temperature 1
sometimes does), and max_tokens or the end of the context then cuts the call. So in the last WINDOW tokens of the
budget the closer works out the shortest closing of the JSON written so far (json_closing.py), as tokens of the
vocabulary, and the longest closing the model's next token could lead to (it may begin another call or argument
instead of closing: JsonPrefix.closings). Once that would no longer fit with MARGIN tokens to spare, each step is
forced to the shortest closing's next token (checked against the grammar; the token bitmask allows that token
alone). The reply then ends with its calls complete and valid, and the request finishes with finish_reason
"length": the budget, not the model, ended it.

A closing longer than the tokens left is never started (the reply is cut as before), and nothing changes while the
budget is far: a reply that ends by itself before the last WINDOW tokens is the model's own.
"""

from __future__ import annotations

from concurrent.futures import Future

from jaxllm.structured_outputs.json_closing import JsonPrefix

WINDOW = 64  # tokens before the budget's end from which the closing is worked out
MARGIN = 2  # tokens of slack beyond the longest closing one more token of the model's may need


class TokenBytes:
    """The vocabulary's tokens as bytes (xgrammar's decoded vocabulary: what the grammar matches), and bytes back
    to tokens (greedy, longest first, special tokens left out)."""

    MAX_TOKEN_BYTES = 16  # the longest token looked up when splitting bytes into tokens

    def __init__(self, decoded_vocab: list[bytes], special_token_ids: list[int]):
        self._bytes = decoded_vocab
        special = set(special_token_ids)
        self._ids: dict[bytes, int] = {}
        for token_id, data in enumerate(decoded_vocab):
            if data and token_id not in special and len(data) <= self.MAX_TOKEN_BYTES:
                self._ids.setdefault(data, token_id)
        self._longest = max((len(data) for data in self._ids), default=0)

    def join(self, token_ids: list[int]) -> bytes:
        return b"".join(self._bytes[token_id] for token_id in token_ids)

    def split(self, data: bytes) -> list[int] | None:
        """Token ids whose bytes make data (None: a byte no token holds alone)."""
        tokens, i = [], 0
        while i < len(data):
            for length in range(min(self._longest, len(data) - i), 0, -1):
                token_id = self._ids.get(data[i:i + length])
                if token_id is not None:
                    tokens.append(token_id)
                    i += length
                    break
            else:
                return None
        return tokens


class BudgetCloser:
    """One request's closing. forced_token() is asked before each of its constrained samples. vocab: the
    vocabulary's TokenBytes, as a Future (GrammarCompiler.token_bytes(); nothing is forced until it is done)."""

    def __init__(self, schema: dict, vocab: Future):
        self._schema, self._vocab = schema, vocab
        self._prefix, self._num_read = JsonPrefix(schema), 0  # the first _num_read accepted tokens, read
        self.used = False  # a token was forced: the budget ended the reply

    def forced_token(self, accepted: list[int], budget: int, matcher) -> int | None:
        """The token the next sample must be (None: the model's choice under the grammar). accepted: the tokens
        the grammar has taken; budget: the tokens the request may still produce, this one included; matcher: the
        grammar's matcher after `accepted` (left as it was)."""
        if budget > WINDOW or not self._vocab.done():
            return None
        vocab = self._vocab.result()
        self._read(accepted, vocab)
        found = self._prefix.closings()
        closing = None if found is None else vocab.split(found[0])
        if not closing or len(closing) > budget:
            return None  # complete, not closable, or too long to fit: the model's choice
        longest = vocab.split(found[1]) or closing
        if max(len(closing), len(longest)) + MARGIN < budget:
            return None  # room for the model's next token, whatever it begins
        if not _grammar_takes(matcher, closing):
            return None
        self.used = True
        return closing[0]

    def _read(self, accepted: list[int], vocab: TokenBytes) -> None:
        if len(accepted) < self._num_read:  # tokens rolled back (speculative decoding): read again
            self._prefix, self._num_read = JsonPrefix(self._schema), 0
        self._prefix.feed(vocab.join(accepted[self._num_read:]))
        self._num_read = len(accepted)


def _grammar_takes(matcher, tokens: list[int]) -> bool:
    """Whether the grammar accepts tokens and is then complete (the matcher is left as it was)."""
    taken = 0
    for token in tokens:
        if not matcher.accept_token(token):
            break
        taken += 1
    complete = taken == len(tokens) and matcher.is_completed()
    if taken:
        matcher.rollback(taken)
    return complete
