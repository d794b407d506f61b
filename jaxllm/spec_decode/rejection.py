"""Verification of one sequence's proposals against the target model's k + 1 sampled rows.

Row i of a sequence with proposals d_1 .. d_k holds the target's distribution after its pending token and
d_1 .. d_i; the sampler draws y_i from it, exactly as plain decoding would (same parameters, and the noise of
the token it would be, output index num_output + i). The run keeps y_0 .. y_a where d_{i+1} = y_i for i < a,
ending at the first mismatch (its y is the target's token) or with the bonus token y_k when all k match:

    proposals          d1  d2  d3  d4
    sampled rows   y0  y1  y2  y3  y4
    y0 = d1, y1 = d2, y2 != d3   ->  run  y0 y1 y2   (2 accepted, y2 the target's own)

Greedy: accept while the argmax equals the proposal. Random: an n-gram proposal is a point mass (so is a draft
model's: its greedy argmax is deterministic given the context, spec_decode/draft_model.py), for which the
standard rule (accept d with probability min(1, p(d) / q(d)) = p(d), else draw from (p - q)+ normalized = p
without d, renormalized) is the same as drawing y ~ p and accepting when y = d: P(y = d) = p(d), and y given
y != d follows p without d, renormalized. Every emitted token is therefore drawn from the target's distribution
given the tokens before it, and with the noise plain decoding would use at that output index, so a seeded
request's output is the same with and without speculation.
"""

from __future__ import annotations

import numpy as np


def accept_run(proposals: np.ndarray, sampled: np.ndarray) -> np.ndarray:
    """The verified tokens [a + 1]: proposals [k], sampled [k + 1] (the sequence's sampler rows, in order)."""
    mismatch = np.flatnonzero(proposals != sampled[:len(proposals)])
    accepted = int(mismatch[0]) if len(mismatch) else len(proposals)
    return sampled[:accepted + 1]
