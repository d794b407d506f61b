"""Calibration and evaluation text -> fixed-length token sequences.

AWQ only needs a few thousand tokens of ordinary text to estimate which input channels matter. Without
--calibration, a short built-in text (calibration.txt: English prose and some Python) is used; held_out.txt is a
different passage, kept for measuring perplexity (quality.py) on text the calibration never saw.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")
HELD_OUT_TEXT = Path(__file__).with_name("held_out.txt")
MIN_TOKENS = 32


def read_text(path: str | os.PathLike | None) -> str:
    """The calibration file's text (UTF-8), or the built-in calibration text when path is None."""
    path = CALIBRATION_TEXT if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"calibration file {path} not found (give a plain UTF-8 text file)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"calibration file {path} is not UTF-8 text ({e})") from e


def token_sequences(tokenizer, text: str, seq_len: int, max_tokens: int, vocab_size: int) -> np.ndarray:
    """The text's first max_tokens tokens as int32 [S, T], T <= seq_len: S = ceil(tokens / seq_len) sequences of
    equal length, so a short text loses fewer than S tokens."""
    ids = tokenizer.encode(text, add_special_tokens=False)[:max_tokens]
    if len(ids) < MIN_TOKENS:
        raise ValueError(f"calibration text too short: {len(ids)} tokens, at least {MIN_TOKENS} needed")
    if max(ids) >= vocab_size:
        raise ValueError(f"the tokenizer produced token id {max(ids)}, beyond the model's vocabulary of {vocab_size}: "
                         f"it is not this model's tokenizer")
    count = math.ceil(len(ids) / seq_len)
    length = len(ids) // count
    return np.asarray(ids[:count * length], dtype=np.int32).reshape(count, length)


def chunks(sequences: np.ndarray, tokens_per_chunk: int) -> list[np.ndarray]:
    """[S, T] -> batches of whole sequences of about tokens_per_chunk tokens (at least one sequence each)."""
    per_chunk = max(1, tokens_per_chunk // sequences.shape[1])
    return [sequences[i:i + per_chunk] for i in range(0, len(sequences), per_chunk)]
