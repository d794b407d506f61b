"""Fused int4 dequantize-matmul for NVIDIA GPUs (Pallas, Triton backend): y = x @ W with W in the AWQPacked layout.

Same contract as `awq_matmul_reference`: x [..., K] in bf16, f16 or f32, one layer's AWQPacked -> [..., N] float32.
The weights stay packed in memory; each program dequantizes its tile in registers and feeds the tensor cores.

Program (i, j, s) owns rows i*BM .. of x, columns j*BN .. of W and one K split (split-K), and walks that split in
steps of BK rows, BK/8 packed words:

    words  qweight[r0 : r0 + BK/8, cols]                 [BK/8, BN] int32, loaded once per step
    zeros, scales of group (8r) // G for each word row   [BK/8, BN]  (eight rows of a word share a group)
    for j in 0..7:                                       nibble j of word r is row 8r + j of W
        w_j = (q_j - zeros) * scales                     [BK/8, BN] in x's dtype, exact before one rounding
        x_j = x[rows, 8r + j]                            [BM, BK/8]  (a stride-8 gather of the activations)
        acc += dot(x_j, w_j)                             float32 accumulator [BM, BN]

so a step is eight dots of depth BK/8 (>= 16: BK >= 128). Rows past M, columns past N and rows past the split's
end are masked lanes: never dereferenced, read as 0, never stored. Each program stores its [BM, BN] partial sum
into partials [S, M, N] float32; with S > 1 an XLA sum over S finishes the job.

Dequantization, with no float conversion per weight when the scales are in x's dtype and that is bf16 or f16
(`layout.with_scale_dtype` casts them once on the host). The 16-bit pattern M | q, q in 0..15, with M = 0x4300 for
bf16 (the number 128: exponent 2^7, one unit per step of the low mantissa bits) or M = 0x6400 for f16 (1024), *is*
the number M + q, so

    w = (bits(M | q) - (M + z)) * s        the subtraction exact (|q - z| <= 15), only the product rounds

which is round((q - z) * s) exactly, as the float32 path below gives it. On the GPU one inline-PTX block per nibble
turns two words of a thread's registers into one packed pair of weights, four instructions for two weights:

    prmt.b32  t, word_a, word_b, sel          byte j//2 of word_a -> bits 0..7, of word_b -> bits 16..23
    lop3.b32  t, t, 0x000F000F, M|M<<16       (t & 0x000F000F) | the magic: two halves M + q
    fma.rn.{bf16x2,f16x2}  t, t, 1, -(M + z)  q - z, exact
    fma.rn.{bf16x2,f16x2}  w, t, s, -0        (q - z) * s, rounded once

(fma with 1 and -0 rather than sub and mul: bf16x2 sub and mul need sm_90, bf16x2 fma sm_80.) The odd nibbles read
words >> 4 (one shift per word for all four), and -(M + z) is built from the int8 zero by integer ops and a bitcast
once per word. Interpret mode (no PTX) runs the same arithmetic as jnp integer ops and bitcasts. Float32
activations, or scales of another dtype (bf16 activations with the checkpoint's fp16 scales), take the float32
path: ((q - z) as float32) * s, exact, rounded once to x's dtype; it costs a conversion per weight.

Two entry points, one body:
    awq_matmul_small_m   decode (M <= 16): one 16-row tile (M padded by masking) and split-K, so that
                         cdiv(N, BN) * S programs fill the GPU even when N / BN alone would not
    awq_matmul_large_m   prefill: BM x BN output tiles, the M tile fastest in the grid so that programs running
                         together share a weight tile in L2; split-K only when there are few tiles and the
                         partials stay small beside the weights
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas.triton import elementwise_inline_asm

from pallas_kernels.awq_matmul.layout import AWQPacked
from pallas_kernels.sizes import pow2_at_least
from pallas_kernels.triton_compat import compiler_params, load, store

SMALL_M_MAX = 16  # awq_matmul uses the small-M (decode) kernel up to this many rows
MAGIC = {jnp.dtype(jnp.bfloat16): 0x4300, jnp.dtype(jnp.float16): 0x6400}  # the bits of 128.0 and of 1024.0
TARGET_PROGRAMS = 4 * 132  # about four programs per SM of an H200
MAX_PARTIAL_RATIO = 0.25  # split-K partial traffic (8 * S * M * N bytes) at most this fraction of the weight bytes


def awq_matmul(x: jax.Array, packed: AWQPacked, *, interpret: bool = False, small_m_max: int = SMALL_M_MAX,
               **knobs) -> jax.Array:
    """x [..., K] @ W -> [..., N] float32, through the small-M kernel when M <= small_m_max, else the large-M one.

    knobs: block_m, block_n, block_k, split_k, num_warps, num_stages; those the chosen kernel has no use for are
    dropped (block_m on the small-M path), so one set of knobs serves both.
    """
    unknown = set(knobs) - {"block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages"}
    if unknown:
        raise TypeError(f"unknown awq_matmul knobs {sorted(unknown)}")
    m = _rows(x)
    if m <= small_m_max:
        knobs.pop("block_m", None)
        return awq_matmul_small_m(x, packed, interpret=interpret, **knobs)
    return awq_matmul_large_m(x, packed, interpret=interpret, **knobs)


def awq_matmul_small_m(x: jax.Array, packed: AWQPacked, *, block_n: int = 128, block_k: int = 256,
                       split_k: int | None = None, num_warps: int = 4, num_stages: int = 2,
                       interpret: bool = False) -> jax.Array:
    """Decode kernel: x [..., K] with few rows -> [..., N] float32; split_k None picks `default_split_k`."""
    block_m = max(16, pow2_at_least(_rows(x)))
    return _matmul(x, packed, block_m=block_m, block_n=block_n, block_k=block_k, split_k=split_k,
                   num_warps=num_warps, num_stages=num_stages, interpret=interpret)


def awq_matmul_large_m(x: jax.Array, packed: AWQPacked, *, block_m: int = 64, block_n: int = 128,
                       block_k: int = 128, split_k: int | None = None, num_warps: int = 4, num_stages: int = 3,
                       interpret: bool = False) -> jax.Array:
    """Prefill kernel: x [..., K] -> [..., N] float32; block_m shrinks to the padded M when M is smaller."""
    block_m = max(16, min(block_m, pow2_at_least(_rows(x))))
    return _matmul(x, packed, block_m=block_m, block_n=block_n, block_k=block_k, split_k=split_k,
                   num_warps=num_warps, num_stages=num_stages, interpret=interpret)


def default_split_k(m: int, k: int, n: int, *, block_m: int, block_n: int, block_k: int) -> int:
    """Splits of K: enough programs for TARGET_PROGRAMS, at least one BK step per split, and partial sums
    (written and read back in float32) within MAX_PARTIAL_RATIO of the packed weight bytes. Unmeasured on a GPU."""
    tiles = pl.cdiv(m, block_m) * pl.cdiv(n, block_n)
    wanted = pl.cdiv(TARGET_PROGRAMS, tiles)
    partial_cap = int(MAX_PARTIAL_RATIO * (k * n / 2) / (8 * max(m, 1) * n))
    split_k = max(1, min(wanted, partial_cap, pl.cdiv(k, block_k)))
    return pl.cdiv(k // 8, _split_words(k, split_k, block_k))  # whole steps per split may leave fewer splits


def awq_partials_into(partials: jax.Array, x: jax.Array, packed: AWQPacked, *, block_m: int, block_n: int,
                      block_k: int, num_warps: int = 4, num_stages: int = 2, interpret: bool = False) -> jax.Array:
    """The kernel itself, writing each split's partial sums into `partials` [S, M, N] float32 in place (the tests
    pass a NaN-filled buffer: every element must come back written). x: [M, K]."""
    return _call(x, packed, partials, block_m=block_m, block_n=block_n, block_k=block_k,
                 split_words=_split_words(packed.k, partials.shape[0], block_k), num_warps=num_warps,
                 num_stages=num_stages, interpret=interpret)


def _matmul(x, packed: AWQPacked, *, block_m, block_n, block_k, split_k, num_warps, num_stages, interpret):
    """[..., K] -> [..., N] float32 through the kernel and, for S > 1 splits, an XLA sum of the partials."""
    k, n = packed.k, packed.n
    _check(x, packed, block_m, block_n, block_k)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)  # [M, K]
    m = x2.shape[0]
    if m == 0:
        return jnp.zeros((*lead, n), jnp.float32)
    if split_k is None:
        split_k = default_split_k(m, k, n, block_m=block_m, block_n=block_n, block_k=block_k)
    split_words = _split_words(k, split_k, block_k)
    splits = pl.cdiv(k // 8, split_words)  # rounding each split up to whole steps may leave fewer splits
    partials = _call(x2, packed, None, block_m=block_m, block_n=block_n, block_k=block_k, split_words=split_words,
                     num_warps=num_warps, num_stages=num_stages, interpret=interpret, splits=splits)  # [S, M, N]
    y = partials[0] if splits == 1 else partials.sum(axis=0)  # [M, N]
    return y.reshape(*lead, n)


def _call(x, packed: AWQPacked, out, *, block_m, block_n, block_k, split_words, num_warps, num_stages, interpret,
          splits=None):
    """One pallas_call over the grid (M tiles, N tiles, splits) -> partials [S, M, N] float32, written into `out`
    in place when it is given."""
    m, k = x.shape
    n = packed.n
    splits = out.shape[0] if out is not None else splits
    kernel = functools.partial(_kernel, m=m, k=k, n=n, group=packed.group_size, block_m=block_m, block_n=block_n,
                               block_k=block_k, split_words=split_words, use_asm=not interpret)
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    args = (x, packed.qweight, packed.zeros, packed.scales) + ((out,) if out is not None else ())
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(m, block_m), pl.cdiv(n, block_n), splits),
        in_specs=[any_spec] * len(args),
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct((splits, m, n), jnp.float32),
        input_output_aliases={4: 0} if out is not None else {},
        compiler_params=compiler_params(num_warps, num_stages),
        interpret=interpret,
        name="awq_matmul",
    )(*args)


def _kernel(x_ref, qweight_ref, zeros_ref, scales_ref, *refs, m, k, n, group, block_m, block_n, block_k,
            split_words, use_asm):
    """Program (i, j, s): partials[s, rows, cols] = x[rows, split s] @ W[split s, cols] (module docstring).
    use_asm: the 16-bit dequantization in inline PTX (GPU) rather than jnp (interpret mode)."""
    o_ref = refs[-1]  # refs: (aliased input, output) or (output,)
    rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)  # [BM]
    cols = pl.program_id(1) * block_n + jnp.arange(block_n, dtype=jnp.int32)  # [BN]
    split = pl.program_id(2)
    row_ok, col_ok = rows < m, cols < n  # [BM], [BN]
    step_words = block_k // 8
    first = split * split_words  # the split's first word row
    end = jnp.minimum(first + split_words, k // 8)
    x_dtype = x_ref.dtype

    def step(i, acc):  # acc: [BM, BN] float32
        words = first + i * step_words + jnp.arange(step_words, dtype=jnp.int32)  # [BW] word rows
        word_ok = words < end  # [BW]
        w_mask = word_ok[:, None] & col_ok[None, :]  # [BW, BN]
        packed = load(qweight_ref.at[words[:, None], cols[None, :]], mask=w_mask, other=0)  # [BW, BN] int32
        groups = jax.lax.div(words, group // 8)[:, None]  # [BW, 1]: rows 8r .. 8r+7 share group 8r // G
        zero = load(zeros_ref.at[groups, cols[None, :]], mask=w_mask, other=0).astype(jnp.int32)  # [BW, BN]
        scale = load(scales_ref.at[groups, cols[None, :]], mask=w_mask, other=0)  # [BW, BN] scale dtype
        nibble = nibble_weights(packed, zero, scale, x_dtype, use_asm=use_asm)
        x_mask = row_ok[:, None] & word_ok[None, :]  # [BM, BW]
        for j in range(8):  # nibble j of word r is row 8r + j
            x_j = load(x_ref.at[rows[:, None], (8 * words + j)[None, :]], mask=x_mask, other=0)  # [BM, BW]
            w_j = nibble(j)  # [BW, BN] x dtype
            acc = acc + jax.lax.dot_general(x_j, w_j, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return acc

    num_steps = jax.lax.div(jnp.maximum(end - first, 0) + step_words - 1, step_words)
    acc = jax.lax.fori_loop(0, num_steps, step, jnp.zeros((block_m, block_n), jnp.float32))
    store(o_ref.at[split, rows[:, None], cols[None, :]], acc, mask=row_ok[:, None] & col_ok[None, :])


def nibble_weights(packed, zero, scale, x_dtype, *, use_asm: bool):
    """One step's dequantizer: words [BW, BN] int32, zeros [BW, BN] int32, scales [BW, BN] -> j -> nibble j's
    weights [BW, BN] in x_dtype, (q - z) * s rounded once (the 16-bit path where `fast_dequant`, else float32).
    Masked lanes (words, zeros and scales 0) give w = 0 either way."""
    if fast_dequant(x_dtype, scale.dtype):
        return functools.partial(_nibble_16bit, (packed, packed >> 4), _minus_magic_zero(zero, x_dtype), scale,
                                 use_asm=use_asm)
    return functools.partial(_nibble_f32, packed, zero, scale.astype(jnp.float32), x_dtype)


def fast_dequant(x_dtype, scale_dtype) -> bool:
    """Whether the 16-bit dequantization applies: bf16 or f16 activations with scales of the same dtype."""
    return jnp.dtype(x_dtype) in MAGIC and jnp.dtype(scale_dtype) == jnp.dtype(x_dtype)


def _nibble_f32(packed, zero, scale, x_dtype, j: int):
    """Nibble j's weights through float32: [BW, BN] int32 words, int32 zeros, float32 scales -> [BW, BN] x_dtype.
    (q - z) * s is exact in float32 for 16-bit scales (5 bits times 11), so the cast to x_dtype is the one rounding."""
    q = ((packed >> (4 * j)) & 0xF) - zero  # [BW, BN] int32 in -15..15
    return (q.astype(jnp.float32) * scale).astype(x_dtype)


def _minus_magic_zero(zero, dtype):
    """[BW, BN] int32 zeros in 0..15 -> [BW, BN] dtype holding -(M + z): the sign bit, the magic and z, as bits."""
    bits = (zero | (0x8000 | MAGIC[jnp.dtype(dtype)])).astype(jnp.uint16)  # [BW, BN]
    return jax.lax.bitcast_convert_type(bits, dtype)


def _nibble_16bit(words, minus_mz, scale, j: int, *, use_asm: bool):
    """Nibble j's weights, (q - z) * s rounded once, with no float conversion (module docstring).

    words: (packed, packed >> 4) [BW, BN] int32, nibble j being the low nibble of byte j // 2 of words[j % 2];
    minus_mz: [BW, BN] -(M + z); scale: [BW, BN]; both in the activation dtype, which the result shares."""
    dtype = scale.dtype
    source, byte = words[j % 2], j // 2
    if use_asm:
        one = jnp.full(scale.shape, 1, dtype)  # constants: materialized once, outside the loop
        minus_zero = jnp.full(scale.shape, -0.0, dtype)
        [w] = elementwise_inline_asm(nibble_asm(byte, dtype), args=[source, minus_mz, scale, one, minus_zero],
                                     constraints="=r," + ",".join(["r"] * 6), pack=2,
                                     result_shape_dtypes=[jax.ShapeDtypeStruct(scale.shape, dtype)])
        return w
    bits = ((source >> (8 * byte)) & 0xF) | MAGIC[jnp.dtype(dtype)]  # [BW, BN] int32: the bits of M + q
    return (jax.lax.bitcast_convert_type(bits.astype(jnp.uint16), dtype) + minus_mz) * scale


def nibble_asm(byte: int, dtype) -> str:
    """Inline PTX for `elementwise_inline_asm(pack=2)`: the weights in the low nibble of byte `byte` of two words.

    Operands ($0 the result): $1, $2 the two words (int32); then packed pairs of 16-bit values, the first element in
    the low half: $3 -(M + z), $4 the scales, $5 ones, $6 negative zeros. $0 = ((M + q) * 1 + -(M + z)) * s + -0."""
    magic = MAGIC[jnp.dtype(dtype)]
    kind = {jnp.dtype(jnp.bfloat16): "bf16x2", jnp.dtype(jnp.float16): "f16x2"}[jnp.dtype(dtype)]
    select = byte | byte << 4 | (4 + byte) << 8 | (4 + byte) << 12  # result bytes 0, 1 <- $1's; 2, 3 <- $2's
    return (f"{{ .reg .b32 t; prmt.b32 t, $1, $2, {select:#06x}; "
            f"lop3.b32 t, t, 0x000F000F, {magic * 0x10001:#010x}, 0xEA; "  # 0xEA: (a & b) | c
            f"fma.rn.{kind} t, t, $5, $3; fma.rn.{kind} $0, t, $4, $6; }}")


def _split_words(k: int, split_k: int, block_k: int) -> int:
    """Word rows per split: K/8 cut into split_k pieces, each rounded up to whole BK/8-word steps."""
    step_words = block_k // 8
    return pl.cdiv(pl.cdiv(k // 8, max(split_k, 1)), step_words) * step_words


def _check(x, packed: AWQPacked, block_m: int, block_n: int, block_k: int) -> None:
    """Reject inputs the kernel cannot tile."""
    if packed.qweight.ndim != 2:
        raise ValueError(f"the kernel takes one layer's weights (qweight [K/8, N]), got {packed.qweight.shape}")
    if x.shape[-1] != packed.k:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {packed.k} rows")
    for name, value, least in (("block_m", block_m, 16), ("block_n", block_n, 16), ("block_k", block_k, 128)):
        if value < least or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= {least} (a Triton dot dimension), got {value}")


def _rows(x: jax.Array) -> int:
    return math.prod(x.shape[:-1])
