"""BlockPool's bookkeeping checked whole: the engine fuzz test calls it after every step."""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

from jaxllm.engine.block_pool import NULL_BLOCK_ID, Block, BlockPool


def check_pool_invariants(pool: BlockPool, block_tables: Mapping[str, Sequence[Block]] | None = None) -> None:
    """Raise AssertionError naming the first broken invariant of the bookkeeping (a testing aid that walks every
    block; it does not rely on `assert`, so it also checks under python -O): the null block is never handed out
    or cached; the free queue holds exactly the blocks of ref count 0 (none negative, none lost); the
    prefix-cache map and the blocks' hashes agree one to one. With `block_tables` (request id -> its blocks, for
    every request holding blocks): no table holds a block twice or the null block, and each block's ref count
    is the number of tables holding it."""
    null = pool.blocks[NULL_BLOCK_ID]
    if null.ref_count != 0 or null.block_hash is not None or NULL_BLOCK_ID in pool._free:
        raise AssertionError(f"the null block was handed out or cached: ref count {null.ref_count}, "
                             f"hash {null.block_hash!r}, in the free queue: {NULL_BLOCK_ID in pool._free}")
    for block_id, block in pool._free.items():
        if block is not pool.blocks[block_id]:
            raise AssertionError(f"free-queue entry {block_id} is not the pool's block {block_id}")
        if block.ref_count != 0:
            raise AssertionError(f"block {block_id} is in the free queue with ref count {block.ref_count}")
    for block in pool.blocks[1:]:
        if block.ref_count < 0:
            raise AssertionError(f"block {block.block_id} has a negative ref count {block.ref_count}")
        if block.ref_count == 0 and block.block_id not in pool._free:
            raise AssertionError(f"block {block.block_id} has ref count 0 but is not in the free queue (leaked)")
    for block_hash, block in pool._cached.items():
        if block is not pool.blocks[block.block_id] or block.block_hash != block_hash:
            raise AssertionError(f"the prefix cache maps a hash to block {block.block_id}, which does not "
                                 f"carry that hash")
    num_hashed = sum(b.block_hash is not None for b in pool.blocks)
    if num_hashed != len(pool._cached):
        raise AssertionError(f"{num_hashed} blocks carry a hash but the prefix cache maps {len(pool._cached)}")
    if pool._cached and not pool.enable_prefix_caching:
        raise AssertionError(f"{len(pool._cached)} blocks were cached with prefix caching off")
    if not 0 <= pool.prefix_cache_hits <= pool.prefix_cache_queries:
        raise AssertionError(f"{pool.prefix_cache_hits} prefix-cache hits for {pool.prefix_cache_queries} queries")
    if block_tables is None:
        return
    holders: Counter[int] = Counter()
    for request_id, table in block_tables.items():
        ids = [b.block_id for b in table]
        if len(set(ids)) != len(ids) or NULL_BLOCK_ID in ids:
            raise AssertionError(f"request {request_id!r} holds a block twice or the null block: {ids}")
        if any(block is not pool.blocks[block.block_id] for block in table):
            raise AssertionError(f"request {request_id!r} holds a block that is not the pool's: {ids}")
        holders.update(ids)
    for block in pool.blocks[1:]:
        if block.ref_count != holders[block.block_id]:
            raise AssertionError(f"block {block.block_id} has ref count {block.ref_count} but "
                                 f"{holders[block.block_id]} request tables hold it")
