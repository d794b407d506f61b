"""The routed MoE's grouped matmuls over AWQ int4 expert stacks (Pallas, Triton backend): kernel.py's two launches
with each weight tile dequantized in registers, as pallas_kernels/awq_matmul/kernel.py does it.

Same grid and layout as kernel.py (tile i of one expert e = tile_expert[i], column block j). The stacks are
awq.py's: qweight [E, K/8, N] (word [r, n] holds rows 8r .. 8r+7 of column n), zeros / scales [E, K/G, N]. Each
program walks K in steps of BK rows = BW = BK/8 word rows:

    words  qweight[e, r0 : r0 + BW, cols]                 [BW, BN] int32 (gate_up: gate cols and up cols I + cols)
    zeros, scales of group (8r) // G for each word row    [BW, BN]
    for j in 0..7:                                        nibble j of word r is row 8r + j of W
        w_j = (q_j - z) * s                               [BW, BN] in x's dtype, rounded once (awq_matmul's nibble)
        x_j = rows[:, 8r + j]                             [BM, BW]  (a stride-8 gather of the tile's rows)
        acc += dot(x_j, w_j)                              [BM, BN] float32

so a step is eight dots of depth BW (>= 16: BK >= 128). Masked lanes (K past its end, columns past N, padding
rows) read 0 and give w = 0. The weights are those `awq.dense_experts` gives (each rounded once to x's dtype), so
against the reference on those weights only the order of the float32 sums differs. Then, as kernel.py:

    gate_up  hidden[rows, cols] = act(round(gate)) * round(up), rounded to x's dtype        -> [P, I]
    down     out_rows[rows, cols] = round(hidden[rows] @ W_down[e][:, cols])                 -> [P, H]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.awq_matmul.kernel import nibble_weights
from pallas_kernels.awq_matmul.layout import AWQPacked
from pallas_kernels.moe.launch import down_cost, gate_up_cost, launch
from pallas_kernels.moe.reference import ACTIVATIONS
from pallas_kernels.triton_compat import load, store

MIN_BLOCK_K = 128  # BK / 8 word rows are a Triton dot's depth: at least 16


def gate_up_call_awq(x, row_token, tile_expert, w: AWQPacked, activation, *, block_m, block_n, block_k,
                     num_warps, num_stages, interpret):
    """x [T, H], row_token [P], tile_expert [NT], w: qweight [E, H/8, 2I] ... -> hidden [P, I] in x's dtype."""
    rows, num_tiles, (hidden, inter) = row_token.shape[0], tile_expert.shape[0], (w.k, w.n // 2)
    kernel = functools.partial(_gate_up_kernel, block_m=block_m, block_n=block_n, block_k=block_k,
                               act=ACTIVATIONS[activation], use_asm=not interpret)
    return launch(kernel, (x, row_token, tile_expert, w.qweight, w.zeros, w.scales),
                  (num_tiles, pl.cdiv(inter, block_n)), jax.ShapeDtypeStruct((rows, inter), x.dtype),
                  "moe_gate_up_int4", gate_up_cost(rows, hidden, inter, num_tiles, x.dtype.itemsize), num_warps,
                  num_stages, interpret)


def down_call_awq(hidden_rows, tile_expert, w: AWQPacked, *, block_m, block_n, block_k, num_warps, num_stages,
                  interpret):
    """hidden [P, I], tile_expert [NT], w: qweight [E, I/8, H] ... -> out_rows [P, H] in hidden's dtype."""
    (rows, inter), num_tiles, hidden = hidden_rows.shape, tile_expert.shape[0], w.n
    kernel = functools.partial(_down_kernel, block_m=block_m, block_n=block_n, block_k=block_k,
                               use_asm=not interpret)
    return launch(kernel, (hidden_rows, tile_expert, w.qweight, w.zeros, w.scales),
                  (num_tiles, pl.cdiv(hidden, block_n)), jax.ShapeDtypeStruct((rows, hidden), hidden_rows.dtype),
                  "moe_down_int4", down_cost(rows, hidden, inter, num_tiles, hidden_rows.dtype.itemsize),
                  num_warps, num_stages, interpret)


def _weight_step(q_ref, z_ref, s_ref, expert, words, cols, mask, group, x_dtype, use_asm):
    """One step's dequantizer for the word rows `words` [BW] and columns `cols` [BN] of `expert` (j -> [BW, BN])."""
    groups = jax.lax.div(words, group // 8)[:, None]  # [BW, 1]: rows 8r .. 8r+7 share group 8r // G
    packed = load(q_ref.at[expert, words[:, None], cols[None, :]], mask=mask, other=0)  # [BW, BN] int32
    zero = load(z_ref.at[expert, groups, cols[None, :]], mask=mask, other=0).astype(jnp.int32)  # [BW, BN]
    scale = load(s_ref.at[expert, groups, cols[None, :]], mask=mask, other=0)  # [BW, BN]
    return nibble_weights(packed, zero, scale, x_dtype, use_asm=use_asm)


def _gate_up_kernel(x_ref, token_ref, expert_ref, q_ref, z_ref, s_ref, o_ref, *, block_m, block_n, block_k, act,
                    use_asm):
    """Program (i, j): hidden[tile i rows, cols j] = act(gate) * up of the tile's int4 expert."""
    (num_tokens, hidden), (num_experts, words_k, two_inter) = x_ref.shape, q_ref.shape
    inter, group = two_inter // 2, hidden // z_ref.shape[1]
    rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)  # [BM]
    cols = pl.program_id(1) * block_n + jnp.arange(block_n, dtype=jnp.int32)  # [BN]
    col_ok = cols < inter  # [BN]
    expert = load(expert_ref.at[pl.program_id(0)])  # []
    out_at = o_ref.at[rows[:, None], cols[None, :]]  # [BM, BN] lanes
    step_words = block_k // 8

    @pl.when(expert < num_experts)
    def _():
        tokens = load(token_ref.at[rows])  # [BM]
        row_ok = tokens < num_tokens

        def step(s, accs):  # accs: gate, up [BM, BN] float32
            words = s * step_words + jnp.arange(step_words, dtype=jnp.int32)  # [BW]
            word_ok = words < words_k
            mask = word_ok[:, None] & col_ok[None, :]  # [BW, BN]
            weights = functools.partial(_weight_step, q_ref, z_ref, s_ref, expert, words, mask=mask, group=group,
                                        x_dtype=x_ref.dtype, use_asm=use_asm)
            gate_j, up_j = weights(cols), weights(inter + cols)
            gate, up = accs
            for j in range(8):  # nibble j of word r is row 8r + j
                xt = load(x_ref.at[tokens[:, None], (8 * words + j)[None, :]],
                          mask=row_ok[:, None] & word_ok[None, :], other=0)  # [BM, BW]
                gate, up = gate + _dot(xt, gate_j(j)), up + _dot(xt, up_j(j))
            return gate, up

        zero = jnp.zeros((block_m, block_n), jnp.float32)
        gate, up = jax.lax.fori_loop(0, pl.cdiv(words_k, step_words), step, (zero, zero))
        dtype = o_ref.dtype  # x's: round as the reference does, then the activation in float32
        gate, up = gate.astype(dtype).astype(jnp.float32), up.astype(dtype).astype(jnp.float32)
        store(out_at, (act(gate) * up).astype(dtype), mask=col_ok[None, :])

    @pl.when(expert >= num_experts)
    def _():
        store(out_at, jnp.zeros((block_m, block_n), o_ref.dtype), mask=col_ok[None, :])


def _down_kernel(h_ref, expert_ref, q_ref, z_ref, s_ref, o_ref, *, block_m, block_n, block_k, use_asm):
    """Program (i, j): out_rows[tile i rows, cols j] = hidden[rows] @ W_down[e][:, cols], rounded."""
    inter, (num_experts, words_k, hidden) = h_ref.shape[1], q_ref.shape
    group = inter // z_ref.shape[1]
    rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)  # [BM]
    cols = pl.program_id(1) * block_n + jnp.arange(block_n, dtype=jnp.int32)  # [BN]
    col_ok = cols < hidden  # [BN]
    expert = load(expert_ref.at[pl.program_id(0)])  # []
    out_at = o_ref.at[rows[:, None], cols[None, :]]  # [BM, BN] lanes
    step_words = block_k // 8

    @pl.when(expert < num_experts)
    def _():
        def step(s, acc):  # acc: [BM, BN] float32
            words = s * step_words + jnp.arange(step_words, dtype=jnp.int32)  # [BW]
            word_ok = words < words_k
            w_j = _weight_step(q_ref, z_ref, s_ref, expert, words, cols, word_ok[:, None] & col_ok[None, :], group,
                               h_ref.dtype, use_asm)
            for j in range(8):
                ht = load(h_ref.at[rows[:, None], (8 * words + j)[None, :]], mask=word_ok[None, :], other=0)
                acc = acc + _dot(ht, w_j(j))  # [BM, BW] @ [BW, BN]
            return acc

        acc = jax.lax.fori_loop(0, pl.cdiv(words_k, step_words), step, jnp.zeros((block_m, block_n), jnp.float32))
        store(out_at, acc.astype(o_ref.dtype), mask=col_ok[None, :])

    @pl.when(expert >= num_experts)
    def _():
        store(out_at, jnp.zeros((block_m, block_n), o_ref.dtype), mask=col_ok[None, :])


def _dot(a, b):
    """a [M, K] @ b [K, N] -> [M, N] float32."""
    return jax.lax.dot_general(a, b.astype(a.dtype), (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
