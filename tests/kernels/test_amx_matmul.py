"""Weights stored as AMX tiles (pallas_kernels/amx_matmul): the layout and its jnp contract on any machine, the
native kernel against exact sums where the CPU has AMX-BF16 or AVX512-BF16, and its gate|up form with the SiLU in
its epilogue against the reference activation on the kernel's own sums."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.engine import program_cache
from jaxllm.loaders.cpu_dtype import cpu_flags
from pallas_kernels.amx_matmul.cpu import amx_matmul_error, tiled_matmul_cpu, tiled_silu_matmul_cpu
from pallas_kernels.amx_matmul.reference import pack_tiles, tiled_dot, tiled_rows, unpack_tiles
from pallas_kernels.silu_and_mul.reference import gated_activation_reference


def _cpu_multiplies_tiles() -> bool:
    return jax.default_backend() == "cpu" and bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


needs_tiled_kernel = pytest.mark.skipif(not _cpu_multiplies_tiles(),
                                        reason="the CPU has neither AMX-BF16 nor AVX512-BF16")


def _bf16(rng: np.random.Generator, *shape) -> np.ndarray:
    return np.asarray(jnp.asarray(rng.standard_normal(shape), jnp.bfloat16))


def test_pack_and_unpack_are_inverse_on_the_host_and_the_device():
    w = _bf16(np.random.default_rng(0), 96, 64)
    tiles = pack_tiles(w)
    assert tiles.shape == (3, 2, 2, 16, 32) and tiles.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(tiles[1, 1, 1, 5], w[32 + 16 + 5, 32:64])  # the block 1, step 1, half 1, row 5
    np.testing.assert_array_equal(unpack_tiles(tiles), w)
    np.testing.assert_array_equal(np.asarray(pack_tiles(jnp.asarray(w))), tiles)


def test_pack_refuses_sides_that_are_not_multiples_of_the_tile():
    with pytest.raises(ValueError, match=r"multiples of 32; got \[48, 64\]"):
        pack_tiles(np.zeros((48, 64), np.float32))


def test_rows_and_dot_of_the_tiles_are_the_dense_weights():
    rng = np.random.default_rng(1)
    w = _bf16(rng, 128, 96)
    tiles = jnp.asarray(pack_tiles(w))
    index = jnp.asarray(rng.integers(0, 128, (2, 5)))
    np.testing.assert_array_equal(np.asarray(tiled_rows(tiles, index)), w[np.asarray(index)])
    x = jnp.asarray(_bf16(rng, 7, 96))
    want = jax.lax.dot_general(x, jnp.asarray(w), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(tiled_dot)(x, tiles)), np.asarray(jax.jit(lambda: want)()))


@needs_tiled_kernel
def test_the_kernel_builds_where_the_cpu_has_amx_or_avx512_bf16():
    assert amx_matmul_error() is None


@needs_tiled_kernel
@pytest.mark.parametrize("m,n,k", [(1, 32, 32), (2, 96, 64), (15, 64, 576), (16, 64, 576), (17, 160, 96),
                                   (32, 64, 64), (33, 3072, 576), (64, 576, 1536), (300, 96, 128)])
def test_the_kernel_is_the_exact_sum_up_to_its_order(m, n, k):
    """Products of bfloat16 are exact in float32; only the summation order may differ from an exact sum."""
    rng = np.random.default_rng(m * 1000 + n + k)
    x, w = _bf16(rng, m, k), _bf16(rng, n, k)
    got = np.asarray(jax.jit(tiled_matmul_cpu)(jnp.asarray(x), jnp.asarray(pack_tiles(w))))
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    bound = 2 * k * np.finfo(np.float32).eps * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T)
    assert got.shape == (m, n) and got.dtype == np.float32
    assert np.all(np.abs(got - exact) <= bound + 1e-30)
    assert np.all(got != 0)  # every row and column written (the random sums are never exactly zero)


@needs_tiled_kernel
@pytest.mark.parametrize("m,n,k,live", [(1, 32, 32, None), (5, 96, 64, None), (17, 160, 96, 9), (40, 3072, 576, 33),
                                        (64, 960, 576, 64), (300, 96, 128, 290)])
def test_the_rounded_sums_are_the_float32_sums_astype_bfloat16(m, n, k, live):
    """dtype bfloat16: the float32 sums rounded to nearest even as they are stored, bit for bit XLA's astype of the
    float32 result (padding rows zeros in both), the weights at one of three scales."""
    rng = np.random.default_rng(m * 7 + n)
    x = jnp.asarray(_bf16(rng, m, k))
    w = np.asarray(jnp.asarray(rng.standard_normal((n, k)) * rng.choice([1e-3, 1.0, 300.0]), jnp.bfloat16))
    tiles = jnp.asarray(pack_tiles(w))
    got = jax.jit(lambda x, t: tiled_matmul_cpu(x, t, live, jnp.bfloat16))(x, tiles)
    want = jax.jit(lambda x, t: tiled_matmul_cpu(x, t, live).astype(jnp.bfloat16))(x, tiles)
    assert got.shape == (m, n) and got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))


def test_the_tiled_matmul_refuses_an_output_dtype_it_does_not_write():
    x, tiles = jnp.zeros((2, 32), jnp.bfloat16), jnp.zeros((1, 1, 2, 16, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="float32 sums or bfloat16; got dtype float16"):
        tiled_matmul_cpu(x, tiles, dtype=jnp.float16)


@needs_tiled_kernel
@pytest.mark.parametrize("kernel", [tiled_matmul_cpu, tiled_silu_matmul_cpu])
@pytest.mark.parametrize("m", [5, 40])
def test_every_call_writes_every_block_however_the_threads_split_them(kernel, m):
    """The threads take runs of weight blocks and then each other's from the back, so which thread sums a block
    changes from call to call: calls alternating between two inputs give each input's first result bit for bit (a
    block left unwritten would hold the other input's values, the buffer being reused), and that result is the
    reference's (tiled_dot's sums up to their order; for the fused kernel, the activation on the plain kernel's)."""
    rng = np.random.default_rng(m)
    tiles = jnp.asarray(pack_tiles(_bf16(rng, 3072, 576)))  # 96 blocks of 32 rows, 3.4 MiB: split over the threads
    xs = [jnp.asarray(_bf16(rng, m, 576)) for _ in range(2)]
    call = jax.jit(kernel)
    first = [np.asarray(call(x, tiles)) for x in xs]
    for x, got in zip(xs, first):
        if kernel is tiled_silu_matmul_cpu:
            sums = jax.jit(tiled_matmul_cpu)(x, tiles).astype(jnp.bfloat16)  # [m, 3072]: gate, then up
            want = np.asarray(jax.jit(gated_activation_reference, static_argnums=1)(sums, "silu"))
            np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
        else:
            np.testing.assert_allclose(got, np.asarray(tiled_dot(x, tiles)), rtol=1e-4, atol=1e-3)
    for i in range(40):
        np.testing.assert_array_equal(np.asarray(call(xs[i % 2], tiles)), first[i % 2])


@needs_tiled_kernel
@pytest.mark.parametrize("kernel", [tiled_matmul_cpu, tiled_silu_matmul_cpu])
def test_leading_axes_are_kept(kernel):
    rng = np.random.default_rng(2)
    x, tiles = jnp.asarray(_bf16(rng, 2, 3, 64)), jnp.asarray(pack_tiles(_bf16(rng, 128, 64)))
    got, flat = np.asarray(jax.jit(kernel)(x, tiles)), np.asarray(jax.jit(kernel)(x.reshape(6, 64), tiles))
    assert got.shape == (2, 3, flat.shape[-1])
    np.testing.assert_array_equal(got.reshape(flat.shape), flat)


@needs_tiled_kernel
@pytest.mark.parametrize("kernel", [tiled_matmul_cpu, tiled_silu_matmul_cpu])
@pytest.mark.parametrize("m,live", [(64, 49), (64, 40), (64, 17), (64, 16), (32, 5), (16, 0), (8, 8), (8, 30), (8, -3)])
def test_rows_from_live_rows_on_are_zeros_and_the_others_what_all_rows_give(kernel, m, live):
    """A bucket's padding rows are not computed: zeros from live_rows (clamped to [0, M]) on; the rows before it
    bit for bit what the call on every row gives them (fewer live rows may take the 16-row activation blocks)."""
    rng = np.random.default_rng(m * 100 + live)
    x, tiles = jnp.asarray(_bf16(rng, m, 96)), jnp.asarray(pack_tiles(_bf16(rng, 128, 96)))
    every = np.asarray(jax.jit(kernel)(x, tiles))
    got = np.asarray(jax.jit(kernel)(x, tiles, jnp.int32(live)))
    n = min(max(live, 0), m)
    assert got.shape == every.shape and got.dtype == every.dtype
    np.testing.assert_array_equal(got[:n].view(np.uint8), every[:n].view(np.uint8))
    assert np.all(got[n:] == 0) and np.all(every[n:] != 0)


def test_the_kernel_refuses_other_operands_by_their_shapes():
    tiles = jnp.zeros((2, 2, 2, 16, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"bfloat16 x \[\.\.\., K\].*got x float32\[4, 64\]"):
        tiled_matmul_cpu(jnp.zeros((4, 64), jnp.float32), tiles)
    with pytest.raises(ValueError, match=r"got x bfloat16\[4, 96\]"):
        tiled_matmul_cpu(jnp.zeros((4, 96), jnp.bfloat16), tiles)
    with pytest.raises(ValueError, match=r"tiles bfloat16\[64, 64\]"):
        tiled_matmul_cpu(jnp.zeros((4, 64), jnp.bfloat16), jnp.zeros((64, 64), jnp.bfloat16))


@needs_tiled_kernel
@pytest.mark.parametrize("m,f,k", [(1, 32, 32), (3, 64, 64), (16, 96, 576), (17, 64, 96), (33, 160, 64),
                                   (64, 1536, 576), (300, 64, 128)])
def test_the_fused_silu_is_the_reference_activation_on_the_kernels_sums(m, f, k):
    """silu(gate) * up straight from x: bit for bit the reference's bfloat16 activation (gate and up rounded, the
    SiLU and the product each rounded once) on the plain kernel's float32 sums of the same gate|up weight."""
    rng = np.random.default_rng(m * 1000 + f + k)
    x = jnp.asarray(_bf16(rng, m, k))
    w = np.asarray(jnp.asarray(rng.standard_normal((2 * f, k)) * rng.choice([0.05, 1.0, 8.0]), jnp.bfloat16))
    tiles = jnp.asarray(pack_tiles(w))
    got = np.asarray(jax.jit(tiled_silu_matmul_cpu)(x, tiles))
    sums = jax.jit(tiled_matmul_cpu)(x, tiles)  # [m, 2f] float32: gate columns, then up
    want = np.asarray(jax.jit(gated_activation_reference, static_argnums=1)(sums.astype(jnp.bfloat16), "silu"))
    assert got.shape == (m, f) and got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@needs_tiled_kernel
def test_a_kept_program_calling_the_fused_kernel_loads_where_the_kernel_was_only_asked_for(tmp_path):
    """The engine's program cache loads its programs before anything is traced: choosing the kernels
    (amx_matmul_error) must register both FFI targets, or a kept gate|up program fails to load in a new process."""
    x, tiles = jnp.zeros((4, 64), jnp.bfloat16), jnp.asarray(pack_tiles(np.zeros((128, 64), jnp.bfloat16)))
    program_cache.compile_and_store(tmp_path, "fused", lambda: jax.jit(tiled_silu_matmul_cpu).lower(x, tiles).compile())
    load = ("import sys, jax; from pathlib import Path; from jaxllm.engine import program_cache; "
            "from pallas_kernels.amx_matmul.cpu import amx_matmul_error; assert amx_matmul_error() is None; "
            "assert program_cache.load(Path(sys.argv[1]), 'fused', jax.devices()) is not None")
    result = subprocess.run([sys.executable, "-c", load, str(tmp_path)], cwd=Path(__file__).parents[2],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "could not be loaded" not in result.stderr, result.stderr[-2000:]


def test_the_fused_silu_refuses_a_weight_that_is_not_gate_and_up_in_whole_blocks():
    with pytest.raises(ValueError, match=r"gate\|up weight \[2F, K\] with F a multiple of 32; got tiles \[3, 2, 2, 16, "
                                         r"32\] \(96 rows\)"):
        tiled_silu_matmul_cpu(jnp.zeros((4, 64), jnp.bfloat16), jnp.zeros((3, 2, 2, 16, 32), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"got x float32\[4, 64\]"):
        tiled_silu_matmul_cpu(jnp.zeros((4, 64), jnp.float32), jnp.zeros((2, 2, 2, 16, 32), jnp.bfloat16))
