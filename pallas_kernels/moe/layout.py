"""The routed layout: a step's T*k routes sorted by expert, each expert's group padded to whole tiles of m rows.

    routes      r = t*k + j for token t's j-th choice; R = T*k of them
    rows        P = num_tiles * m padded rows; expert e's group is rows group_start[e] .. group_start[e+1],
                its routes in token order, then padding up to a multiple of m (an empty expert has no rows)
    tiles       tile i = rows i*m .. (i+1)*m, all of one expert: tile_expert[i]; tiles past the used ones have E

    expert ids  [2, 0, 2, 9]  (T=2, k=2, E=3, m=2; id 9 is outside [0, E): its route is dropped, never computed)
    rows        | r1 pad | r0 r2 | pad pad | pad pad |      group_start = [0, 2, 2, 4]
    tile_expert   0        2       3 (E)     3 (E)

Shapes depend only on (T, k, E, m), never on the routing: sum_e ceil(c_e / m) over the at most min(E, R) non-empty
experts is <= (R + min(E, R) * (m - 1)) / m tiles, so `num_tiles` of that bound serves every routing and one
program serves every step of a token bucket.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Layout(NamedTuple):
    row_route: jax.Array  # [P] int32: the route in each padded row; R for a padding row
    route_row: jax.Array  # [R] int32: each route's padded row; P for a dropped route (id outside [0, E))
    tile_expert: jax.Array  # [NT] int32: each tile's expert; E for a tile past the used rows
    group_start: jax.Array  # [E + 1] int32: each expert's first padded row; group_start[E] = rows used
    used_experts: jax.Array  # [min(E, R)] int32: the experts with routes, ascending, then E
    num_used_experts: jax.Array  # [] int32


def mean_routes_per_expert(num_routes: int, num_experts: int) -> int:
    """The routes each touched expert takes on average (rounded up), as many experts touched as can be: what a
    tile's row count is sized by."""
    return -(-num_routes // max(1, min(num_experts, num_routes)))


def num_tiles(num_routes: int, num_experts: int, block_m: int) -> int:
    """The static tile count that holds every routing of `num_routes` routes (module docstring); at least 1."""
    return max(1, (num_routes + min(num_experts, num_routes) * (block_m - 1)) // block_m)


def build_layout(expert_ids: jax.Array, num_experts: int, block_m: int) -> Layout:
    """expert_ids [T, k] -> the layout of its R = T*k routes in tiles of block_m rows (pure jnp, static shapes)."""
    ids = expert_ids.reshape(-1).astype(jnp.int32)  # [R]
    num_routes = ids.shape[0]
    rows = num_tiles(num_routes, num_experts, block_m) * block_m  # P
    key = jnp.where((ids >= 0) & (ids < num_experts), ids, num_experts)  # [R]: dropped routes sort last
    counts = jnp.zeros((num_experts + 1,), jnp.int32).at[key].add(1)[:num_experts]  # [E]
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    group_start = _exclusive_cumsum(padded)  # [E + 1]
    route_start = _exclusive_cumsum(counts)  # [E + 1]: each group's first route in sorted order
    order = jnp.argsort(key, stable=True).astype(jnp.int32)  # [R]: routes by expert, token order within
    sorted_key = key[order]  # [R]
    rank = jnp.arange(num_routes, dtype=jnp.int32) - route_start[sorted_key]  # [R]: place within its group
    sorted_row = jnp.where(sorted_key < num_experts, group_start[sorted_key] + rank, rows)  # [R]
    route_row = jnp.zeros((num_routes,), jnp.int32).at[order].set(sorted_row)  # [R]
    row_route = jnp.full((rows,), num_routes, jnp.int32).at[sorted_row].set(order, mode="drop")  # [P]
    tile_start = jnp.arange(rows // block_m, dtype=jnp.int32) * block_m  # [NT]
    tile_expert = jnp.sum(group_start[1:][None, :] <= tile_start[:, None], axis=1, dtype=jnp.int32)  # [NT]
    used = counts > 0  # [E]
    used_experts = jnp.nonzero(used, size=min(num_experts, max(num_routes, 1)), fill_value=num_experts)[0]
    return Layout(row_route, route_row, tile_expert, group_start, used_experts.astype(jnp.int32),
                  jnp.sum(used, dtype=jnp.int32))


def gather_rows(x: jax.Array, layout: Layout, top_k: int) -> jax.Array:
    """x [T, H] -> [P, H]: each padded row's token (0 in padding rows)."""
    return jnp.take(x, layout.row_route // top_k, axis=0, mode="fill", fill_value=0)


def combine(out_rows: jax.Array, layout: Layout, expert_ids: jax.Array, expert_weights: jax.Array,
            dtype) -> jax.Array:
    """out_rows [P, H] (each row its route's expert output) -> [T, H] in dtype: sum over a token's routes of
    weight * output in float32, rounded once; a dropped route adds nothing (its weight is never read)."""
    num_tokens, top_k = expert_ids.shape
    per_route = jnp.take(out_rows, layout.route_row, axis=0, mode="fill", fill_value=0)  # [R, H]
    per_route = per_route.reshape(num_tokens, top_k, out_rows.shape[1]).astype(jnp.float32)  # [T, k, H]
    kept = (layout.route_row < out_rows.shape[0]).reshape(num_tokens, top_k)  # [T, k]
    weights = jnp.where(kept, expert_weights.astype(jnp.float32), 0.0)  # [T, k]
    return jnp.einsum("tk,tkh->th", weights, per_route).astype(dtype)


def _exclusive_cumsum(values: jax.Array) -> jax.Array:
    """[n] -> [n + 1]: 0, v0, v0 + v1, ..."""
    return jnp.concatenate([jnp.zeros((1,), values.dtype), jnp.cumsum(values, dtype=values.dtype)])
