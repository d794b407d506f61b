"""The native K/V write (cpu_kv_write.cc) against the jnp scatter, and in place inside a layer loop.

XLA:CPU converts a whole bfloat16 pool to float32 and back around a scatter; write_kv takes the native write for
bfloat16 pools on CPU, so the step program must hold no pool-sized convert or copy.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxllm.model import kv_cache, select_kernels
from pallas_kernels.paged_attention.cpu_kv_write import cpu_write_kv, cpu_write_kv_error

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU kernel")
POOL = (3, 7, 2, 4, 8)  # [L, N, Hkv, B, D]


def _scatter(k_pool, v_pool, layer, slots, k, v):
    block, offset = slots // POOL[3], slots % POOL[3]
    return (k_pool.at[layer, block, :, offset].set(k.astype(k_pool.dtype)),
            v_pool.at[layer, block, :, offset].set(v.astype(v_pool.dtype)))


def _inputs(dtype, seed=0):
    rng = np.random.default_rng(seed)
    pools = [jnp.asarray(rng.standard_normal(POOL), dtype) for _ in range(2)]
    slots = jnp.asarray(rng.permutation(POOL[1] * POOL[3])[:9], jnp.int32)  # distinct slots, any blocks
    k, v = (jnp.asarray(rng.standard_normal((9, POOL[2], POOL[4])), jnp.float32) for _ in range(2))
    return (*pools, jnp.int32(1), slots, k, v)


def test_the_write_builds_here():
    assert cpu_write_kv_error() is None


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_write_matches_the_scatter(dtype):
    args = _inputs(dtype)
    expected = jax.jit(_scatter)(*args)
    actual = jax.jit(cpu_write_kv)(*args)
    for a, e in zip(actual, expected):
        assert a.dtype == dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32))


def test_bad_slot_is_an_error():
    k_pool, v_pool, layer, slots, k, v = _inputs(jnp.bfloat16)
    with pytest.raises(Exception, match=r"slot_mapping\[2\] = 28 is not a pool slot"):
        jax.jit(cpu_write_kv)(k_pool, v_pool, layer, slots.at[2].set(28), k, v)


def test_bf16_write_kv_in_a_layer_loop_is_in_place():
    """write_kv in a scan over layers, pools donated: the compiled program converts and copies no pool."""
    def layers(k_pool, v_pool, slots, k, v):
        def step(pools, layer):
            return kv_cache.write_kv(*pools, layer, slots, k * layer, v * layer, select_kernels()), None
        return jax.lax.scan(step, (k_pool, v_pool), jnp.arange(POOL[0], dtype=jnp.int32))[0]

    k_pool, v_pool, _, slots, k, v = _inputs(jnp.bfloat16)
    expected = np.asarray(k_pool, np.float32).copy()
    block, offset = np.asarray(slots) // POOL[3], np.asarray(slots) % POOL[3]
    for layer in range(POOL[0]):
        expected[layer, block, :, offset] = np.asarray((k * layer).astype(jnp.bfloat16), np.float32)
    compiled = jax.jit(layers, donate_argnums=(0, 1)).lower(k_pool, v_pool, slots, k, v).compile()
    pool_shape = "bf16[" + ",".join(map(str, POOL)) + "]"
    pool_sized = [line for line in compiled.as_text().splitlines()
                  if re.search(r"= (f32|bf16)\[" + ",".join(map(str, POOL)) + r"\]", line)
                  and re.search(r"\b(copy|convert|fusion)\(", line)]
    assert not pool_sized, f"{pool_shape} converted or copied:\n" + "\n".join(pool_sized)
    out_k, _ = compiled(k_pool, v_pool, slots, k, v)
    np.testing.assert_array_equal(np.asarray(out_k, np.float32), expected)
