"""The routed layout (pallas_kernels/moe/layout.py): its invariants over random and edge routings, and one
compile for every routing of a shape."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.compile_counter import CompileCounter
from pallas_kernels.moe.layout import build_layout, combine, gather_rows, num_tiles
from pallas_kernels.moe.testing import routing_ids

CASES = [  # (T, k, E, m, routing)
    (1, 1, 1, 1, "uniform"), (1, 8, 64, 16, "uniform"), (7, 2, 8, 4, "uniform"), (16, 2, 8, 16, "one"),
    (33, 8, 64, 8, "skewed"), (20, 2, 8, 4, "out_of_range"), (5, 2, 3, 2, [2, 0, 2, 9, -1, 1, 1, 1, 3, 0]),
]


@pytest.mark.parametrize("num_tokens, top_k, num_experts, block_m, routing", CASES)
def test_layout_invariants(num_tokens, top_k, num_experts, block_m, routing):
    ids = routing_ids(np.random.default_rng(num_tokens), num_tokens, top_k, num_experts, routing)  # [T, k]
    layout = jax.tree.map(np.asarray, build_layout(jnp.asarray(ids, jnp.int32), num_experts, block_m))
    flat = ids.reshape(-1)
    num_routes, rows = flat.size, layout.row_route.size
    assert rows == num_tiles(num_routes, num_experts, block_m) * block_m == layout.tile_expert.size * block_m
    kept = (flat >= 0) & (flat < num_experts)
    # every kept route exactly once, in a row of its own expert's tile; dropped routes nowhere
    assert np.all(layout.route_row[~kept] == rows)
    assert sorted(layout.row_route[layout.row_route < num_routes]) == sorted(np.flatnonzero(kept))
    assert np.all(layout.row_route[layout.route_row[kept]] == np.flatnonzero(kept))
    row_expert = np.repeat(layout.tile_expert, block_m)  # [P]
    assert np.all(row_expert[layout.route_row[kept]] == flat[kept])
    # groups: padded to whole tiles, in expert order, sized by their routes; tiles past them have expert E
    counts = np.bincount(flat[kept], minlength=num_experts)
    np.testing.assert_array_equal(np.diff(layout.group_start), -(-counts // block_m) * block_m)
    used_tiles = layout.group_start[-1] // block_m
    np.testing.assert_array_equal(layout.tile_expert[:used_tiles], np.repeat(np.arange(num_experts),
                                                                             -(-counts // block_m)))
    assert np.all(layout.tile_expert[used_tiles:] == num_experts)
    used = np.flatnonzero(counts)
    assert layout.num_used_experts == used.size
    np.testing.assert_array_equal(layout.used_experts[:used.size], used)


def test_padding_rows_read_zero_and_contribute_nothing():
    num_tokens, top_k, num_experts, block_m = 6, 2, 4, 4
    ids = jnp.asarray([[0, 1], [1, 7], [0, 2], [2, 2], [-1, 3], [0, 0]], jnp.int32)
    layout = build_layout(ids, num_experts, block_m)
    x = jnp.arange(1, num_tokens * 3 + 1, dtype=jnp.float32).reshape(num_tokens, 3)  # [T, 3], no zero
    rows = gather_rows(x, layout, top_k)  # [P, 3]
    padding = np.asarray(layout.row_route) == ids.size
    assert padding.any() and np.all(np.asarray(rows)[padding] == 0)
    assert np.all(np.asarray(rows)[~padding] != 0)
    # combine: NaN in every padding row and a NaN weight on dropped routes change nothing
    out_rows = jnp.where(jnp.asarray(padding)[:, None], jnp.nan, rows)
    weights = jnp.where((ids < 0) | (ids >= num_experts), jnp.nan, 0.5)
    got = np.asarray(combine(out_rows, layout, ids, weights, jnp.float32))  # each kept route adds 0.5 * x[t]
    kept = np.sum((np.asarray(ids) >= 0) & (np.asarray(ids) < num_experts), axis=1)  # [T]
    np.testing.assert_allclose(got, 0.5 * kept[:, None] * np.asarray(x))


def test_one_compile_for_every_routing():
    num_tokens, top_k, num_experts = 16, 2, 8
    layout_fn = jax.jit(build_layout, static_argnums=(1, 2))
    rng = np.random.default_rng(0)
    routings = [rng.integers(-2, num_experts + 2, (num_tokens, top_k)) for _ in range(5)] + [
        np.zeros((num_tokens, top_k)), np.full((num_tokens, top_k), num_experts)]
    layout_fn(jnp.asarray(routings[0], jnp.int32), num_experts, 4)
    with CompileCounter() as compiles:
        for ids in routings:
            jax.block_until_ready(layout_fn(jnp.asarray(ids, jnp.int32), num_experts, 4))
    assert compiles.count == 0
