"""The tiled matmul's contract in plain jnp: a weight w [N, K] stored as AMX tiles, and its dot.

    tiles = pack_tiles(w)        # [N, K] -> [N/32, K/32, 2, 16, 32]: tiles[b, s, h] = w[32b + 16h .. +16, 32s .. +32]
    w = unpack_tiles(tiles)      # the inverse
    out = tiled_dot(x, tiles)    # x [..., K] @ w.T -> [..., N] float32
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

TILE = 32  # N and K must be multiples of it


def tiles_shape(n: int, k: int) -> tuple[int, ...]:
    """The tiles' shape [N/32, K/32, 2, 16, 32] of a weight [N, K]."""
    return n // TILE, k // TILE, 2, 16, TILE


def pack_tiles(w, out: np.ndarray | None = None):
    """w [N, K] (numpy or jax) -> [N/32, K/32, 2, 16, 32]: a block of 32 rows is one contiguous run of K/32 steps,
    each two 16 x 32 tiles (rows 0-15, then 16-31 of the block). A numpy w's tiles are written into `out` when
    given (one copy, into memory the caller chose)."""
    n, k = w.shape
    if n % TILE or k % TILE:
        raise ValueError(f"a tiled weight's rows and columns must be multiples of {TILE}; got [{n}, {k}]")
    tiles = w.reshape(n // TILE, 2, 16, k // TILE, TILE).transpose(0, 3, 1, 2, 4)  # tiles_shape(n, k)
    if out is not None:
        out[...] = tiles
        return out
    return np.ascontiguousarray(tiles) if isinstance(tiles, np.ndarray) else tiles

def unpack_tiles(tiles):
    """[N/32, K/32, 2, 16, 32] -> w [N, K] (pack_tiles' inverse)."""
    nb, kb = tiles.shape[:2]
    return tiles.transpose(0, 2, 3, 1, 4).reshape(nb * TILE, kb * TILE)


def tiled_rows(tiles: jax.Array, index: jax.Array) -> jax.Array:
    """w[index] [..., K] read from the tiles (an embedding lookup of a tied head stored as tiles)."""
    row = index // TILE, index % TILE
    picked = tiles[row[0], :, row[1] // 16, row[1] % 16, :]  # [..., K/32, 32]
    return picked.reshape(*index.shape, tiles.shape[1] * TILE)


def tiled_dot(x: jax.Array, tiles: jax.Array) -> jax.Array:
    """x [..., K] @ w [N, K].T -> [..., N] float32 with w = unpack_tiles(tiles), accumulated in float32."""
    w = unpack_tiles(tiles)
    return jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
