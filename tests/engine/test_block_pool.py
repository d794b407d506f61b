"""Block pool and KV cache manager: exact block ids, reference counts, prefix-cache hits and eviction order."""

from __future__ import annotations

import pytest

from jaxllm.engine.block_pool import BlockPool
from jaxllm.engine.kv_cache_manager import KVCacheManager
from jaxllm.engine.request import Request
from jaxllm.sampling_params import SamplingParams

B = 4  # block size


def ids(blocks):
    return [b.block_id for b in blocks]


def make_request(rid, tokens):
    return Request(rid, list(tokens), SamplingParams(max_tokens=4))


def test_allocation_order_and_lru_free_queue():
    pool = BlockPool(6)
    a, b = pool.allocate(2), pool.allocate(1)
    assert ids(a) == [1, 2] and ids(b) == [3]
    assert pool.num_free_blocks == 2
    pool.free(reversed(a))  # tail first: 2 then 1 join the back of the queue
    assert ids(pool.allocate(4)) == [4, 5, 2, 1]
    with pytest.raises(ValueError, match="cannot allocate 1 blocks: only 0 free"):
        pool.allocate(1)


def test_null_block_is_never_handed_out():
    pool = BlockPool(3)
    assert 0 not in ids(pool.allocate(2))


def test_prefix_hit_takes_block_back_from_free_queue_and_allocation_evicts_lru():
    pool = BlockPool(5)
    kv = KVCacheManager(pool, B)
    first = make_request("a", range(10))  # blocks: [0..3] [4..7] [8, 9]
    assert kv.allocate(first, 10)
    assert kv.block_ids(first) == [1, 2, 3]
    first.num_computed_tokens = 10
    kv.cache_computed_blocks(first)
    assert [b.block_hash is not None for b in pool.blocks[1:4]] == [True, True, False]
    kv.forget(first)
    assert [b.ref_count for b in pool.blocks] == [0] * 5

    second = make_request("b", list(range(8)) + [99, 98, 97])
    hits = kv.find_cached_prefix(second)
    assert ids(hits) == [1, 2]
    assert kv.allocate(second, 3, hits)
    assert kv.block_ids(second) == [1, 2, 4]  # hits reused; the new block is the LRU head (4), not 3
    assert [pool.blocks[i].ref_count for i in range(5)] == [0, 1, 1, 0, 1]
    assert (pool.prefix_cache_queries, pool.prefix_cache_hits) == (2, 2)

    third = make_request("c", range(100, 109))  # no hit; needs 3 blocks: 3 and... only 3 is free
    assert kv.find_cached_prefix(third) == []
    assert not kv.allocate(third, 9)  # refused without side effects
    assert kv.block_ids(third) == [] and pool.num_free_blocks == 1


def test_shared_blocks_count_references():
    pool = BlockPool(8)
    kv = KVCacheManager(pool, B)
    a = make_request("a", range(9))
    assert kv.allocate(a, 9)
    a.num_computed_tokens = 9
    kv.cache_computed_blocks(a)
    b = make_request("b", range(9))
    hits = kv.find_cached_prefix(b)
    assert ids(hits) == [1, 2]  # the partial third block is never shared
    assert kv.allocate(b, 1, hits)
    assert [pool.blocks[i].ref_count for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    kv.forget(a)
    assert [pool.blocks[i].ref_count for i in (1, 2, 3, 4)] == [1, 1, 0, 1]
    kv.forget(b)
    assert all(blk.ref_count == 0 for blk in pool.blocks)
    assert pool.num_free_blocks == 7


def test_whole_prompt_hit_still_computes_last_token():
    pool = BlockPool(8)
    kv = KVCacheManager(pool, B)
    a = make_request("a", range(8))
    assert kv.allocate(a, 8)
    a.num_computed_tokens = 8
    kv.cache_computed_blocks(a)
    b = make_request("b", range(8))
    assert ids(kv.find_cached_prefix(b)) == [1]  # 2 full blocks cached, only 1 may be used


def test_prefix_caching_off():
    pool = BlockPool(8, enable_prefix_caching=False)
    kv = KVCacheManager(pool, B)
    a = make_request("a", range(8))
    assert kv.allocate(a, 8)
    a.num_computed_tokens = 8
    kv.cache_computed_blocks(a)
    assert kv.find_cached_prefix(make_request("b", range(9))) == []
