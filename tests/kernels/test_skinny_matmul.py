"""The native skinny matmul (pallas_kernels/skinny_matmul) against its jnp contract, `dense_dot`: every row count it
takes, odd N and K (the masked tail of a 16-column step, a partial block of rows), float32 and bfloat16 x and w, and
a bfloat16 weight stored as AMX tiles (the same sums as the dense weight's, at every row count)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.amx_matmul.reference import pack_tiles
from pallas_kernels.skinny_matmul.cpu import MAX_ROWS, skinny_kernel_error, skinny_matmul, skinny_supports
from pallas_kernels.skinny_matmul.reference import dense_dot

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU kernel")


def operands(rows: int, n: int, k: int, x_dtype, w_dtype, seed: int = 0):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (rows, k), jnp.float32).astype(x_dtype)  # [M, K]
    w = jax.random.normal(kw, (n, k), jnp.float32).astype(w_dtype)  # [N, K]
    return x, w


def assert_matches_reference(x: jax.Array, w: jax.Array):
    got = jax.jit(skinny_matmul)(x, w)
    want = dense_dot(x, w)
    assert got.shape == want.shape and got.dtype == jnp.float32
    scale = float(jnp.abs(x.astype(jnp.float32)).max() * jnp.abs(w.astype(jnp.float32)).max()) * np.sqrt(x.shape[-1])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5 * scale)  # sum order only


def test_the_kernel_builds_here():
    assert skinny_kernel_error() is None


@pytest.mark.parametrize("rows", range(1, MAX_ROWS + 1))
@pytest.mark.parametrize("x_dtype, w_dtype", [(jnp.float32, jnp.float32), (jnp.float32, jnp.bfloat16),
                                              (jnp.bfloat16, jnp.bfloat16), (jnp.bfloat16, jnp.float32)])
def test_equals_the_float32_dot(rows, x_dtype, w_dtype):
    assert_matches_reference(*operands(rows, 103, 77, x_dtype, w_dtype, seed=rows))


@pytest.mark.parametrize("n, k", [(1, 1), (5, 16), (7, 33), (301, 577), (1037, 15)])
def test_odd_shapes(n, k):
    for rows in (1, 5, MAX_ROWS):
        assert_matches_reference(*operands(rows, n, k, jnp.float32, jnp.bfloat16))


def test_leading_axes_are_rows():
    x, w = operands(6, 40, 48, jnp.float32, jnp.float32)
    got = jax.jit(skinny_matmul)(x.reshape(2, 3, 48), w)
    assert got.shape == (2, 3, 40)
    np.testing.assert_allclose(np.asarray(got).reshape(6, 40), np.asarray(dense_dot(x, w)), rtol=1e-5, atol=1e-4)


def test_bfloat16_weights_are_not_rounded_nor_x():
    """x keeps its float32 bits: a product that bfloat16 x would round shows in the result."""
    x = jnp.full((1, 32), 1 + 2.0 ** -12, jnp.float32)  # not a bfloat16 value
    w = jnp.ones((3, 32), jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(skinny_matmul(x, w)), np.full((1, 3), 32 * (1 + 2.0 ** -12)), rtol=1e-7)


@pytest.mark.parametrize("rows", range(1, MAX_ROWS + 1))
def test_tiles_give_the_dense_weights_sums(rows):
    """The same weight as tiles: every element read from its place in the tile layout (rows across 32-row blocks:
    a block of 3 rows straddles them from 7 rows on; several K blocks), the very same float32 sums."""
    x, w = operands(rows, 96, 160, jnp.float32, jnp.bfloat16, seed=rows)
    dense = jax.jit(skinny_matmul)(x, w)
    tiled = jax.jit(skinny_matmul)(x, pack_tiles(w))
    assert tiled.shape == (rows, 96)
    np.testing.assert_array_equal(np.asarray(tiled), np.asarray(dense))
    assert_matches_reference(x, w)


def test_what_it_takes():
    w = jnp.ones((8, 16), jnp.bfloat16)
    assert skinny_supports(jnp.ones((MAX_ROWS, 16)), w) and not skinny_supports(jnp.ones((MAX_ROWS + 1, 16)), w)
    assert not skinny_supports(jnp.ones((1, 16)), jnp.ones((2, 8, 16), jnp.bfloat16))  # stacked [E, N, K]
    assert not skinny_supports(jnp.ones((1, 16)), jnp.ones((8, 16), jnp.float16))
    with pytest.raises(ValueError, match="1 to 8 rows"):
        skinny_matmul(jnp.ones((MAX_ROWS + 1, 16)), w)
    tiles = jnp.ones((2, 3, 2, 16, 32), jnp.bfloat16)  # W [64, 96]
    assert skinny_supports(jnp.ones((1, 96)), tiles) and not skinny_supports(jnp.ones((1, 64)), tiles)
    assert not skinny_supports(jnp.ones((1, 96)), tiles.astype(jnp.float32))  # tiles are bfloat16
    assert not skinny_supports(jnp.ones((1, 96)), jnp.ones((2, 3, 2, 16, 16), jnp.bfloat16))  # not tiles
