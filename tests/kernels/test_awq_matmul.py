"""Int4 AWQ matmul: the layout and the reference against an independent unpacker of the AutoAWQ format, the Pallas
kernels (interpret mode) against the reference and against exact dequantized values, the inline PTX of the 16-bit
dequantization run by a small emulator, and the CUDA lowering at Llama-3-8B shapes.

The unpacker below is written from the format's definition (nibble j of a word holds column [0, 2, 4, 6, 1, 3, 5,
7][j] of its group of eight; W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]), not from layout.py; the rounding
oracles from IEEE round-to-nearest-even on the bits (bfloat16) and numpy's float16 conversion, not from jax.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.awq_matmul import (AWQPacked, awq_matmul, awq_matmul_large_m, awq_matmul_reference,
                                       awq_matmul_small_m, dequantize, repack, with_scale_dtype)
from pallas_kernels.awq_matmul import kernel as awq_kernel
from pallas_kernels.awq_matmul.kernel import awq_partials_into, default_split_k
from pallas_kernels.awq_matmul.layout import pack_rows, to_awq, unpack, unpack_rows
from pallas_kernels.awq_matmul.testing import random_activations, random_awq_tensors, random_packed, relative_error
from tests.cuda_lowering import lower_for_cuda

COLUMN_OF_NIBBLE = [0, 2, 4, 6, 1, 3, 5, 7]
BF16, F16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32)
INTERPRET_TOLERANCE = 1e-5  # kernel vs reference in interpret mode: the same weights, float32 sums in another order


def awq_unpack_oracle(words: np.ndarray) -> np.ndarray:
    """[R, C/8] int32 AutoAWQ words -> [R, C] int64 nibbles, one nibble at a time."""
    words = words.astype(np.int64) & 0xFFFFFFFF
    out = np.zeros((words.shape[0], 8 * words.shape[1]), np.int64)
    for j, column in enumerate(COLUMN_OF_NIBBLE):
        out[:, column::8] = (words >> (4 * j)) & 0xF
    return out


def dense_oracle(qweight, qzeros, scales, group_size) -> np.ndarray:
    """W [K, N] float64 from AutoAWQ tensors."""
    q, z = awq_unpack_oracle(qweight), awq_unpack_oracle(qzeros)  # [K, N], [K/G, N]
    groups = np.arange(q.shape[0]) // group_size  # [K]
    return (q - z[groups]) * scales.astype(np.float64)[groups]


# ---------------------------------------------------------------------------------------------- layout, reference


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_reference_matches_independent_unpacker(group_size):
    k, n = 512, 48
    tensors = random_awq_tensors(group_size, k, n, group_size)
    w = dense_oracle(*tensors, group_size)  # [K, N]
    packed = jax.tree.map(jnp.asarray, repack(*tensors, group_size))
    assert packed.group_size == group_size and (packed.k, packed.n) == (k, n)
    np.testing.assert_array_equal(np.asarray(dequantize(packed)), w.astype(np.float32))
    x = np.random.default_rng(0).standard_normal((3, k)).astype(np.float32)
    y = np.asarray(awq_matmul_reference(jnp.asarray(x), packed))
    np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5 * np.abs(x @ w).max())


def test_reference_chunks_k_and_keeps_leading_axes(monkeypatch):
    """Small CHUNK_BYTES: the reference's K loop takes several steps; x may carry leading axes."""
    from pallas_kernels.awq_matmul import reference
    monkeypatch.setattr(reference, "CHUNK_BYTES", 64 * 40 * 4)
    tensors = random_awq_tensors(1, 384, 40, 32)
    w = dense_oracle(*tensors, 32)
    x = np.random.default_rng(1).standard_normal((2, 3, 384)).astype(np.float32)
    y = np.asarray(awq_matmul_reference(jnp.asarray(x), jax.tree.map(jnp.asarray, repack(*tensors, 32))))
    assert y.shape == (2, 3, 40)
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5 * np.abs(x @ w).max())


def test_repack_round_trips_and_unpacks():
    tensors = random_awq_tensors(2, 256, 64, 64)
    packed = repack(*tensors, 64)
    assert packed.qweight.shape == (32, 64) and packed.qweight.dtype == np.int32
    assert packed.zeros.shape == (4, 64) and packed.zeros.dtype == np.int8 and packed.scales.dtype == np.float16
    for got, want in zip(to_awq(packed), tensors):
        np.testing.assert_array_equal(got, want)
    q, z, s = unpack(packed)
    np.testing.assert_array_equal(q, awq_unpack_oracle(tensors[0]))
    np.testing.assert_array_equal(z, awq_unpack_oracle(tensors[1]))
    np.testing.assert_array_equal(unpack_rows(pack_rows(q)), q)


def test_repack_rejects_bad_shapes():
    qweight, qzeros, scales = random_awq_tensors(0, 256, 16, 64)
    with pytest.raises(ValueError, match="group size"):
        repack(qweight, qzeros, scales, 96)
    with pytest.raises(ValueError, match="qzeros"):
        repack(qweight, qzeros[:2], scales, 64)


def test_column_selection_is_plain_indexing():
    """Any column order (a tensor-parallel shard, fused q|k|v per head group) is an index of every leaf's N axis."""
    packed = random_packed(3, 256, 64, 32)
    cols = np.random.default_rng(0).permutation(64)[:40]
    picked = jax.tree.map(lambda leaf: leaf[:, cols], packed)
    np.testing.assert_array_equal(np.asarray(dequantize(picked)), np.asarray(dequantize(packed))[:, cols])
    rows = slice(64, 192)  # a K shard at multiples of G
    shard = AWQPacked(packed.qweight[64 // 8:192 // 8], packed.zeros[64 // 32:192 // 32],
                      packed.scales[64 // 32:192 // 32])
    np.testing.assert_array_equal(np.asarray(dequantize(shard)), np.asarray(dequantize(packed))[rows])


# ---------------------------------------------------------------------------------------------- kernels

# (id, M, K, N, G, activation dtype, scale dtype, entry point, knobs): K and N off the tiles, every group size, M over
# 1..512; scales in the activation dtype (the 16-bit dequantization) or in fp16 under bf16 / f32 (the float32 path)
KERNEL_CASES = [
    ("m1_bf16_g32_split", 1, 384, 200, 32, BF16, BF16, awq_matmul_small_m, {}),
    ("m1_bf16_fp16_scales", 1, 384, 200, 32, BF16, F16, awq_matmul_small_m, {}),
    ("m3_f16_g64_bn64", 3, 256, 136, 64, F16, F16, awq_matmul_small_m, dict(block_n=64)),
    ("m16_bf16_g128_split3", 16, 640, 72, 128, BF16, BF16, awq_matmul_small_m, dict(split_k=3, block_k=128)),
    ("m33_bf16_g32", 33, 256, 136, 32, BF16, BF16, awq_matmul_large_m, {}),
    ("m128_f16_g64_small_tiles", 128, 384, 96, 64, F16, F16, awq_matmul_large_m, dict(block_m=32, block_n=32)),
    ("m512_bf16_g128_fp16_scales", 512, 128, 40, 128, BF16, F16, awq_matmul_large_m, dict(block_n=64)),
    ("m5_f32_g32_auto", 5, 256, 48, 32, F32, F16, awq_matmul, {}),
    ("m40_f16_g128_auto_split", 40, 1024, 24, 128, F16, F16, awq_matmul, dict(split_k=2, block_k=256)),
]


@pytest.mark.parametrize("case_id,m,k,n,group,dtype,scale_dtype,entry,knobs", KERNEL_CASES,
                         ids=[c[0] for c in KERNEL_CASES])
def test_kernel_matches_reference(case_id, m, k, n, group, dtype, scale_dtype, entry, knobs):
    packed = random_packed(len(case_id), k, n, group, scale_dtype)
    x = random_activations(m, m, k, dtype)
    y = np.asarray(jax.jit(functools.partial(entry, interpret=True, **knobs))(x, packed))
    assert y.shape == (m, n) and y.dtype == np.float32
    assert not np.isnan(y).any()
    assert relative_error(y, awq_matmul_reference(x, packed)) < INTERPRET_TOLERANCE


@pytest.mark.parametrize("scale_dtype", [BF16, F16], ids=["bf16_scales", "fp16_scales"])
@pytest.mark.parametrize("m,k,n,group,splits,block_m,block_k", [
    (3, 640, 40, 64, 3, 16, 128),  # the last split is a part step; a block past N
    (20, 256, 24, 32, 4, 16, 128),  # two M tiles, the second mostly padding; the last two splits hold no rows
])
def test_kernel_writes_every_partial(m, k, n, group, splits, block_m, block_k, scale_dtype):
    """Into a NaN-filled [S, M, N] buffer: every element is written, padding lanes never leak in (bf16 activations:
    the 16-bit dequantization with bf16 scales, the float32 path with fp16 ones)."""
    packed = random_packed(m, k, n, group, scale_dtype)
    x = random_activations(m, m, k, jnp.bfloat16)
    into = jax.jit(functools.partial(awq_partials_into, block_m=block_m, block_n=16, block_k=block_k,
                                     interpret=True))
    partials = np.asarray(into(jnp.full((splits, m, n), jnp.nan, jnp.float32), x, packed))
    assert not np.isnan(partials).any(), "a partial sum was not written"
    assert relative_error(partials.sum(axis=0), awq_matmul_reference(x, packed)) < INTERPRET_TOLERANCE


def test_awq_matmul_keeps_leading_axes_and_picks_the_kernel():
    packed = random_packed(0, 256, 32, 64, jnp.bfloat16)
    x = random_activations(0, 6, 256, jnp.bfloat16).reshape(2, 3, 256)
    y = awq_matmul(x, packed, interpret=True, block_m=32)  # block_m is dropped on the small-M path
    assert y.shape == (2, 3, 32)
    assert relative_error(y, awq_matmul_reference(x, packed)) < INTERPRET_TOLERANCE
    assert awq_matmul(x[:, :0], packed, interpret=True).shape == (2, 0, 32)
    with pytest.raises(TypeError, match="block_q"):
        awq_matmul(x, packed, interpret=True, block_q=16)
    with pytest.raises(ValueError, match="block_k"):
        awq_matmul(x, packed, interpret=True, block_k=64)


@pytest.mark.parametrize("m,k,n,expected", [
    (1, 4096, 14336, 4),  # 112 column tiles: 5 splits wanted, 4 once rounded to whole 256-row steps
    (1, 4096, 4096, 16),  # 32 tiles: one 256-row step per split
    (16, 4096, 4096, 4),  # partial sums of 16 rows: past 4 splits, over a quarter of the weight bytes
    (1, 256, 128, 1),  # one step of K
])
def test_default_split_k(m, k, n, expected):
    assert default_split_k(m, k, n, block_m=16, block_n=128, block_k=256) == expected


# ---------------------------------------------------------------------------------------------- CUDA lowering


def awq_spec(k: int, n: int, group: int, scale_dtype=jnp.float16) -> AWQPacked:
    return AWQPacked(jax.ShapeDtypeStruct((k // 8, n), jnp.int32), jax.ShapeDtypeStruct((k // group, n), jnp.int8),
                     jax.ShapeDtypeStruct((k // group, n), scale_dtype))


@pytest.mark.parametrize("m", [1, 16, 256], ids=["decode_m1", "decode_m16", "prefill_m256"])
@pytest.mark.parametrize("k,n,dtype,scale_dtype", [
    (4096, 6144, BF16, BF16),  # q|k|v
    (4096, 4096, F16, F16),  # o
    (4096, 28672, BF16, F16),  # gate|up, the checkpoint's fp16 scales
    (14336, 4096, BF16, BF16),  # down
    (4096, 14336, F32, F16),
], ids=["qkv_bf16", "o_f16", "gate_up_bf16_fp16_scales", "down_bf16", "up_f32"])
def test_kernels_lower_to_triton_at_llama3_8b_shapes(m, k, n, dtype, scale_dtype):
    """One Triton kernel each, dequantizing by the inline PTX exactly when the scales are in x's 16-bit dtype."""
    text = lower_for_cuda(jax.jit(awq_matmul), jax.ShapeDtypeStruct((m, k), dtype), awq_spec(k, n, 128, scale_dtype))
    assert text.count("__gpu$xla.gpu.triton") == 1
    fast = dtype == scale_dtype and dtype != F32
    assert ("prmt.b32" in text) == fast
    for kind in ("bf16x2", "f16x2"):
        assert (f"fma.rn.{kind}" in text) == (fast and kind == {BF16: "bf16x2", F16: "f16x2"}[dtype])


# ---------------------------------------------------------------------------------------------- 16-bit dequantization


def bf16_bits_of(values: np.ndarray) -> np.ndarray:
    """float32 values -> the uint16 bits of their bfloat16 rounding, round to nearest even, from the float32 bits."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def float_of_bits(bits: np.ndarray, dtype) -> np.ndarray:
    """uint16 bits of bfloat16 or float16 values -> float64."""
    bits = np.asarray(bits, np.uint16)
    if dtype == BF16:
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.view(np.float16).astype(np.float64)


def as_float64(values) -> np.ndarray:
    """bf16 / f16 / f32 values (numpy or jax) -> float64, bfloat16 through its bits."""
    values = np.asarray(values)
    if values.dtype == BF16:
        return float_of_bits(values.view(np.uint16), BF16)
    return values.astype(np.float64)


def round_once(exact: np.ndarray, dtype) -> np.ndarray:
    """Exact products (q - z) * s (float64) -> their one rounding to dtype, as float64."""
    as_f32 = exact.astype(np.float32)
    assert (as_f32.astype(np.float64) == exact).all(), "the products must be exact in float32"
    if dtype == BF16:
        return float_of_bits(bf16_bits_of(as_f32), BF16)
    if dtype == F16:
        return exact.astype(np.float16).astype(np.float64)  # numpy's double -> half: round to nearest even
    return as_f32.astype(np.float64)


EVERY_K, EVERY_N, EVERY_G = 16, 256, 8  # two word rows, two groups


def every_pair_case(seed: int, scale_dtype):
    """Weights in which, for each nibble position j and each group, every (q, z) in 0..15 x 0..15 occurs: column
    n = 16a + b has zero (b + 5g) % 16 in group g and q[8r + j, n] = (a + r + j) % 16. Scales of both signs over
    2^-8 .. 4. Returns (packed, q [K, N], z [K/G, N]); the words are packed here from the layout's definition."""
    rows, cols = np.arange(EVERY_K)[:, None], np.arange(EVERY_N)[None, :]
    q = (cols // 16 + rows // 8 + rows % 8) % 16  # [K, N]
    z = (cols % 16 + 5 * np.arange(EVERY_K // EVERY_G)[:, None]) % 16  # [K/G, N]
    nibbles = q.reshape(EVERY_K // 8, 8, EVERY_N).astype(np.uint64)  # [K/8, 8, N]: nibble j of word r is row 8r + j
    words = (nibbles << (4 * np.arange(8, dtype=np.uint64))[None, :, None]).sum(axis=1)  # [K/8, N]
    rng = np.random.default_rng(seed)
    scales = (rng.choice([-1.0, 1.0], z.shape) * rng.uniform(0.5, 1.0, z.shape) *
              2.0 ** rng.integers(-8, 3, z.shape)).astype(np.float16)  # [K/G, N]
    packed = AWQPacked(qweight=words.astype(np.uint32).view(np.int32), zeros=z.astype(np.int8), scales=scales)
    return with_scale_dtype(packed, scale_dtype), q, z


def exact_weights(packed: AWQPacked, q: np.ndarray, z: np.ndarray, dtype) -> np.ndarray:
    """W [K, N] float64: (q - z) * s with the stored scales, computed exactly and rounded once to dtype."""
    groups = np.arange(q.shape[0]) // (q.shape[0] // z.shape[0])  # [K]
    return round_once((q - z[groups]) * as_float64(packed.scales)[groups], dtype)


DEQUANT_DTYPES = [(BF16, BF16), (F16, F16), (BF16, F16), (F32, F16)]  # (activations, scales)
DEQUANT_IDS = ["bf16_bf16_scales", "f16_f16_scales", "bf16_fp16_scales", "f32_fp16_scales"]


@pytest.mark.parametrize("dtype,scale_dtype", DEQUANT_DTYPES, ids=DEQUANT_IDS)
@pytest.mark.parametrize("entry", [awq_matmul_small_m, functools.partial(awq_matmul_large_m, block_m=16)],
                         ids=["small_m", "large_m"])
def test_kernel_dequantizes_every_nibble_and_zero_exactly(dtype, scale_dtype, entry):
    """x = the identity, so y = W: every weight, each (q, z) at each nibble position, equals (q - z) * s rounded once
    to x's dtype, in the kernel (16-bit dequantization where the scales are x's dtype, float32 otherwise), in
    dequantize and in the reference."""
    packed, q, z = every_pair_case(7, scale_dtype)
    want = exact_weights(packed, q, z, dtype)  # [K, N]
    packed = jax.tree.map(jnp.asarray, packed)
    x = jnp.eye(EVERY_K, dtype=dtype)  # [K, K]
    y = np.asarray(jax.jit(functools.partial(entry, interpret=True))(x, packed))  # [K, N] float32
    np.testing.assert_array_equal(y, want.astype(np.float32))
    np.testing.assert_array_equal(as_float64(dequantize(packed, dtype)), want)
    np.testing.assert_array_equal(np.asarray(awq_matmul_reference(x, packed)), want.astype(np.float32))


def test_with_scale_dtype_rounds_to_nearest_even():
    """Every finite fp16 scale -> bf16 as IEEE round-to-nearest-even; host and device leaves, leading axes kept,
    qweight and zeros untouched; fp16 -> fp16 and -> float32 exact."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = bits.view(np.float16)[np.isfinite(bits.view(np.float16))]  # 63488 values
    scales = finite.reshape(2, -1, 64)  # [L, K/G, N]
    packed = AWQPacked(qweight=np.arange(2 * 8 * 64, dtype=np.int32).reshape(2, 8, 64),
                       zeros=np.zeros((2, scales.shape[1], 64), np.int8), scales=scales)
    want = bf16_bits_of(scales.astype(np.float32))  # [L, K/G, N] uint16
    for leaves in (packed, jax.tree.map(jnp.asarray, packed)):
        cast = with_scale_dtype(leaves, jnp.bfloat16)
        assert cast.scales.dtype == BF16 and cast.scales.shape == scales.shape
        np.testing.assert_array_equal(np.asarray(cast.scales).view(np.uint16), want)
        assert cast.qweight is leaves.qweight and cast.zeros is leaves.zeros
    for dtype in (F16, F32):
        np.testing.assert_array_equal(as_float64(with_scale_dtype(packed, dtype).scales), scales.astype(np.float64))
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        with_scale_dtype(packed, jnp.int8)


# A few PTX instructions, run on numpy uint32 arrays: enough to execute kernel.nibble_asm's text.


def _prmt(a, b, select):
    pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]  # b3..b0 a3..a0
    out = np.zeros_like(a)
    for i in range(4):
        pick = (int(select) >> (4 * i)) & 0xF
        assert pick < 8, "the sign-replicating selector mode is not emulated"
        out |= pool[pick] << (8 * i)
    return out


def _lop3(a, b, c, lut):
    out = np.zeros_like(a)
    for index in range(8):  # PTX: bit F(a, b, c) of lut, index 4a + 2b + c (ta = 0xF0, tb = 0xCC, tc = 0xAA)
        if (int(lut) >> index) & 1:
            out |= (a if index & 4 else ~a) & (b if index & 2 else ~b) & (c if index & 1 else ~c)
    return out & 0xFFFFFFFF


def _fma_x2(dtype):
    def fma(a, b, c):
        out = np.zeros_like(a)
        for half in (0, 1):
            value = [float_of_bits((v >> (16 * half)) & 0xFFFF, dtype) for v in (a, b, c)]
            exact = value[0] * value[1] + value[2]  # exact in float64 for these operands (checked by round_once)
            rounded = round_once(exact, dtype)
            as_bits = bf16_bits_of(rounded) if dtype == BF16 else rounded.astype(np.float16).view(np.uint16)
            out |= as_bits.astype(np.uint32) << (16 * half)
        return out
    return fma


PTX = {"prmt.b32": _prmt, "lop3.b32": _lop3, "fma.rn.bf16x2": _fma_x2(BF16), "fma.rn.f16x2": _fma_x2(F16)}


def run_ptx(asm: str, registers: dict) -> np.ndarray:
    """Executes `{ .reg ...; op d, a, b, ...; ... }` on uint32 arrays; registers holds $1.. and gets $0."""
    registers = dict(registers)
    for statement in asm.strip().strip("{}").split(";"):
        statement = statement.strip()
        if not statement or statement.startswith(".reg"):
            continue
        op, operands = statement.split(None, 1)
        dest, *sources = [o.strip() for o in operands.split(",")]
        values = [registers[s] if s in registers else np.uint32(int(s, 0)) for s in sources]
        registers[dest] = PTX[op](*values)
    return registers["$0"]


def pair(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Two uint16 arrays -> the uint32 registers of Triton's pack=2 operands: the first element in the low half."""
    return first.astype(np.uint32) | (second.astype(np.uint32) << 16)


def bits16(values) -> np.ndarray:
    return np.asarray(values).view(np.uint16)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("j", range(8))
def test_nibble_asm_computes_each_weight_rounded_once(dtype, j):
    """kernel.nibble_asm's PTX, emulated, on two words per call as the kernel feeds it (words >> 4 for odd j, the
    kernel's own -(M + z)): every (q, z) for the first element, a shuffled set for the second, the other nibbles
    random, scales random; each half of $0 must be (q - z) * s rounded once. What the emulator cannot check: that
    Triton hands the asm its elements in this order (read off Triton's inline-asm lowering, not run)."""
    rng = np.random.default_rng(j)
    q0, z0 = (a.ravel() for a in np.meshgrid(np.arange(16), np.arange(16)))  # [256] each: every pair
    q1, z1 = (7 * q0 + 3) % 16, (5 * z0 + 1) % 16
    words = rng.integers(0, 2 ** 32, (2, 256), dtype=np.uint64).astype(np.uint32)  # [2, 256] random nibbles
    words &= ~np.uint32(0xF << (4 * j))
    words |= np.stack([q0, q1]).astype(np.uint32) << (4 * j)  # nibble j set to q
    source = (words.view(np.int32) >> 4).view(np.uint32) if j % 2 else words  # as the kernel: arithmetic shift
    scales = (rng.choice([-1.0, 1.0], (2, 256)) * rng.uniform(2 ** -10, 4, (2, 256))).astype(np.float16)
    scales = np.asarray(jnp.asarray(scales).astype(dtype))  # [2, 256] dtype
    minus_mz = np.asarray(awq_kernel._minus_magic_zero(jnp.asarray(np.stack([z0, z1]), jnp.int32), dtype))
    np.testing.assert_array_equal(as_float64(minus_mz), -({BF16: 128.0, F16: 1024.0}[dtype] + np.stack([z0, z1])))
    ones, minus_zeros = np.full((2, 256), 1, dtype), np.full((2, 256), -0.0, dtype)
    registers = {"$1": source[0], "$2": source[1], "$3": pair(*bits16(minus_mz)), "$4": pair(*bits16(scales)),
                 "$5": pair(*bits16(ones)), "$6": pair(*bits16(minus_zeros))}
    out = run_ptx(awq_kernel.nibble_asm(j // 2, dtype), registers)  # [256] uint32
    got = np.stack([float_of_bits(out & 0xFFFF, dtype), float_of_bits(out >> 16, dtype)])  # [2, 256]
    want = round_once((np.stack([q0, q1]) - np.stack([z0, z1])) * as_float64(scales), dtype)
    np.testing.assert_array_equal(got, want)
