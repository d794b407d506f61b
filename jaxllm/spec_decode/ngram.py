"""N-gram proposals (vLLM's NgramProposer, prompt lookup decoding): the suffix of the context (prompt + output)
is looked up earlier in the context, and the tokens that followed it are proposed.

    context:   a b c d x y b c d       suffix "b c d" (n = 3) occurred at 1..3
    proposal:  x y b c                 the k = 4 tokens after that occurrence (fewer if the context ends first)

The longest n in [prompt_lookup_min, prompt_lookup_max] with an earlier occurrence wins; among that n's
occurrences, the earliest (vLLM's choice: its matcher keeps the earliest position of the longest match). An
occurrence may overlap the suffix itself (a periodic run proposes its own continuation).

Vectorized numpy: the positions holding the context's last token are found once, and each further suffix token
filters them, so the cost is one pass over the context plus work on the candidates.
"""

from __future__ import annotations

import numpy as np


def propose_ngram(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> np.ndarray:
    """[<= k] int32 tokens proposed after `tokens` [L]; empty when no n-gram matches."""
    length = len(tokens)
    if length < min_n + 1 or k <= 0:
        return tokens[:0]
    # ends: positions e < L - 1 where an occurrence ends (tokens[e - j] == tokens[L - 1 - j] for j < n)
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # [C] matches of length 1
    best = ends if min_n <= 1 else None
    for j in range(1, min(max_n, length - 1)):
        ends = ends[ends >= j]
        ends = ends[tokens[ends - j] == tokens[length - 1 - j]]  # those matching j + 1 tokens
        if not len(ends):
            break
        if j + 1 >= min_n:
            best = ends
    if best is None or not len(best):
        return tokens[:0]
    start = int(best[0]) + 1  # the earliest occurrence of the longest match
    return tokens[start:start + k]
