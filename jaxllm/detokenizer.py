"""Incremental detokenization of one request's output, with stop strings.

Text comes from decoding a short sliding window of token ids with the tokenizer's own `decode` (the
prefix-offset / read-offset technique): the window starts a few tokens before the text already produced, so
merges across tokens (SentencePiece leading spaces, byte-level BPE, byte fallback) decode exactly as in a full
decode, and a token that ends inside a multi-byte character yields nothing until the character completes.

tokenizers' DecodeStream does the same in Rust, but it keeps the pending ids to itself: a request that ends
inside an incomplete character could not release its last bytes as `decode` does (U+FFFD).

Streaming with stop strings: the returned deltas hold back the longest tail of the text that could still
grow into a stop string; nothing past a matched stop string is ever returned. The stop strings are found by the
request's StopMatcher (stop_strings.py), one character at a time, at a cost that does not grow with their number.
"""

from __future__ import annotations

from typing import Sequence

from jaxllm.sampling_params import SamplingParams

CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output so the first output token merges correctly
REPLACEMENT_CHAR = "\ufffd"  # what decode makes of an incomplete UTF-8 sequence


class IncrementalDetokenizer:
    """Turns one request's output token ids into text deltas.

        detok = IncrementalDetokenizer(tokenizer, prompt_token_ids, params)
        delta = detok.update([token_id])                        # "" while a character or stop is pending
        delta = detok.update([token_id], finished=True)         # last token: release everything held back
        detok.finished_by_stop                                  # the stop string that ended it, or None

    `output_text` is the full text so far, cut at a matched stop string (kept if include_stop_str_in_output).
    Stop strings are matched in text produced after the first min_tokens output tokens, as in vLLM.
    """

    def __init__(self, tokenizer, prompt_token_ids: Sequence[int], params: SamplingParams):
        self._tokenizer = tokenizer
        self._decode_kwargs = dict(skip_special_tokens=params.skip_special_tokens,
                                   spaces_between_special_tokens=params.spaces_between_special_tokens,
                                   clean_up_tokenization_spaces=False)
        self._stops = params.stop_matcher()  # None without stop strings
        self._stop_state = 0  # the matcher's state after output_text
        self._include_stop = params.include_stop_str_in_output
        self._min_tokens = params.min_tokens
        # Window of ids: [0, read) is already text; [read, end) is pending.
        self._window = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self._read = len(self._window)
        self._read_text = self._decode(self._window)
        self._num_tokens = 0
        self._stop_check_from = 0  # a stop string must end after this offset of output_text
        self._emitted = 0  # chars of output_text returned so far
        self.output_text = ""
        self.finished_by_stop: str | None = None
        self.finished = False

    def update(self, new_token_ids: Sequence[int], *, finished: bool = False, stop_terminated: bool = False) -> str:
        """Add output tokens; return the text that became final since the last call.

        finished: these are the request's last tokens; release all held-back text.
        stop_terminated: the last id is the EOS or a stop_token_id that ended the request; like vLLM, its text
            is left out unless include_stop_str_in_output. Implies finished.
        """
        if self.finished:
            raise RuntimeError("update() called on a finished detokenizer")
        ids = list(new_token_ids)
        if stop_terminated and not self._include_stop:
            ids = ids[:-1]
        for token_id in ids:
            self._num_tokens += 1
            self._append(self._decode_next(token_id))
            if self.finished_by_stop is not None:
                break
        if (finished or stop_terminated) and self.finished_by_stop is None:
            self._append(self._flush())
        self.finished = finished or stop_terminated or self.finished_by_stop is not None
        return self._take_delta()

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, **self._decode_kwargs)

    def _decode_next(self, token_id: int) -> str:
        """Text the window gains with `token_id`; "" while it ends in an incomplete character."""
        self._window.append(token_id)
        text = self._decode(self._window)
        if len(text) <= len(self._read_text) or text.endswith(REPLACEMENT_CHAR):
            return ""
        # Slide: the ids read so far leave; the ids just turned into text become the new context.
        self._window = self._window[self._read:]
        self._read = len(self._window)
        new_text, self._read_text = text[len(self._read_text):], self._decode(self._window)
        return new_text

    def _flush(self) -> str:
        """Whatever the pending ids decode to, incomplete characters included (as a full decode shows them)."""
        if self._read == len(self._window):
            return ""
        return self._decode(self._window)[len(self._read_text):]

    def _append(self, text: str) -> None:
        start = len(self.output_text)
        self.output_text += text
        if self._num_tokens <= self._min_tokens:
            self._stop_check_from = len(self.output_text)
        if self._stops is not None:
            self._match_stop(text, start)

    def _match_stop(self, text: str, start: int) -> None:
        """Read `text` (output_text from `start` on) into the matcher; cut the output at the first stop string
        to end after _stop_check_from (earliest end, then earliest start: the longest one ending there), so the
        result does not depend on how the text was split into tokens."""
        state = self._stop_state
        for offset, char in enumerate(text):
            state = self._stops.step(state, char)
            end, length = start + offset + 1, self._stops.longest_stop[state]
            if length and end > self._stop_check_from:
                stop = self.output_text[end - length:end]
                self.output_text = self.output_text[:end if self._include_stop else end - length]
                self.finished_by_stop = stop
                break
        self._stop_state = state

    def _take_delta(self) -> str:
        end = len(self.output_text)
        if not self.finished and not self._include_stop:
            end -= self._held_back()
        delta = self.output_text[self._emitted:end]
        self._emitted = max(self._emitted, end)
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of output_text that is a proper prefix of a stop string."""
        return 0 if self._stops is None else self._stops.held_back[self._stop_state]
