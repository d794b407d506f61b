"""The block pool: ids of the preallocated KV blocks, their reference counts, and the prefix-cache map.

    block ids:   0 | 1 2 3 ... N-1
                 ^ null block (padding only, never handed out)

    free queue (LRU order, oldest first):  [b7, b3, b9, ...]
        a block whose ref count drops to 0 is appended; allocation pops from the front. A freed block keeps its
        hash, so a later request with the same prefix can take it back out of the queue (a prefix-cache hit)
        until allocation reuses it, which evicts the hash.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Iterable

NULL_BLOCK_ID = 0


@dataclasses.dataclass(eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None  # set once the block is full and registered in the prefix cache


class BlockPool:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.enable_prefix_caching = enable_prefix_caching
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        self._cached: dict[bytes, Block] = {}  # block hash -> block holding those tokens
        self.prefix_cache_queries = 0  # blocks looked up
        self.prefix_cache_hits = 0  # blocks found

    @property
    def num_usable_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        """Fraction of usable blocks held by requests."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def allocate(self, count: int) -> list[Block]:
        """Take `count` blocks from the front of the free queue (evicting their cached hashes)."""
        if count > len(self._free):
            raise ValueError(f"cannot allocate {count} blocks: only {len(self._free)} free")
        blocks = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_count = 1
            blocks.append(block)
        return blocks

    def lookup(self, block_hash: bytes) -> Block | None:
        self.prefix_cache_queries += 1
        block = self._cached.get(block_hash)
        self.prefix_cache_hits += block is not None
        return block

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on prefix-cache hits, pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one reference from each block; blocks reaching 0 join the back of the free queue in the order
        given (callers pass a request's blocks tail first, so its prefix stays cached longest)."""
        for block in blocks:
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block.block_id} freed more often than allocated"
            if block.ref_count == 0:
                self._free[block.block_id] = block

    def register(self, block: Block, block_hash: bytes) -> None:
        """Record that a full block holds the tokens hashed as `block_hash`."""
        if not self.enable_prefix_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:  # another block already holds the same tokens: keep the first
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def _evict(self, block: Block) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash = None
