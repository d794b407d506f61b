"""Per-request block tables on top of the block pool, with automatic prefix caching.

A request's tokens fill its blocks in order; block i holds tokens [i*B, (i+1)*B). A block becomes cacheable once
all B of its tokens have their K/V computed; its hash chains the previous block's hash with its own tokens, so a
hit on block i implies the whole prefix up to i matches.

    request tokens:  | t0 .. t15 | t16 .. t31 | t32 .. t37      |
    blocks:          |   b12     |    b4      |   b30 (partial) |
    hashes:          h0 = H(-, t0..t15)   h1 = H(h0, t16..t31)   (partial blocks are never cached)

The chain's root names the request's LoRA adapter (its K/V differ from the base model's): hits never cross adapters.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from jaxllm.engine.block_pool import Block, BlockPool
from jaxllm.engine.request import Request


def hash_block(parent: bytes | None, token_ids: Sequence[int], lora_int_id: int = 0) -> bytes:
    """The block's hash: its parent's chained with its tokens; a first block's chain starts from its adapter."""
    digest = hashlib.sha256(parent or (b"root" if lora_int_id == 0 else b"lora %d" % lora_int_id))
    digest.update(np.asarray(token_ids, np.int64).tobytes())
    return digest.digest()


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int):
        self.pool = pool
        self.block_size = block_size
        self._blocks: dict[str, list[Block]] = {}  # request id -> its blocks, in token order
        self._hashes: dict[str, list[bytes]] = {}  # request id -> hashes of its full blocks so far
        self._num_registered: dict[str, int] = {}  # request id -> blocks registered in the prefix cache

    def block_ids(self, request: Request) -> list[int]:
        return [b.block_id for b in self._blocks.get(request.request_id, [])]

    def blocks(self, request: Request) -> list[Block]:
        """The request's blocks in token order: the manager's own list, which only grows while the request runs."""
        return self._blocks.setdefault(request.request_id, [])

    def block_tables(self) -> dict[str, list[Block]]:
        """A copy of every request's block table (request id -> its blocks in token order), for inspection."""
        return {rid: list(blocks) for rid, blocks in self._blocks.items()}

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, request: Request) -> list[Block]:
        """Longest run of cached blocks matching the request's tokens, leaving at least one token to compute
        (the last prompt token must run through the model to produce logits). Requests asking for prompt
        logprobs get none."""
        if not self.pool.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return []  # prompt logprobs need every prompt position computed
        hashes = self._full_block_hashes(request)
        hits: list[Block] = []
        for block_hash in hashes[:(request.num_tokens - 1) // self.block_size]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate(self, request: Request, num_new_tokens: int, cached_prefix: Sequence[Block] = ()) -> bool:
        """Make the request's blocks cover its computed tokens, `cached_prefix` and `num_new_tokens` more.
        Returns False, changing nothing, when the pool cannot supply the blocks."""
        blocks = self._blocks.setdefault(request.request_id, [])
        covered = request.num_computed_tokens + len(cached_prefix) * self.block_size + num_new_tokens
        needed = self.blocks_needed(covered) - len(blocks) - len(cached_prefix)
        if needed <= 0 and not cached_prefix:
            return True  # its blocks hold the new tokens already (most decode steps)
        reclaimed = sum(1 for b in cached_prefix if b.ref_count == 0)  # hits now sitting in the free queue
        if needed > self.pool.num_free_blocks - reclaimed:
            return False
        self.pool.touch(cached_prefix)
        blocks.extend(cached_prefix)
        blocks.extend(self.pool.allocate(max(needed, 0)))
        return True

    def cache_computed_blocks(self, request: Request) -> None:
        """Register the request's blocks whose tokens are all computed and known (a token sampled by a step in
        flight may already count as computed by the next one)."""
        if not self.pool.enable_prefix_caching:
            return
        rid = request.request_id
        full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        registered = self._num_registered.get(rid, 0)
        if full <= registered:
            return  # no block filled up since the last call (most steps)
        hashes = self._full_block_hashes(request)
        blocks = self._blocks[rid]
        for i in range(registered, full):
            self.pool.register(blocks[i], hashes[i])
        self._num_registered[rid] = full

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so its prefix stays cached the longest."""
        rid = request.request_id
        self.pool.free(reversed(self._blocks.pop(rid, [])))
        self._num_registered.pop(rid, None)

    def forget(self, request: Request) -> None:
        """Drop everything kept for a request that has ended."""
        self.free(request)
        self._hashes.pop(request.request_id, None)

    def _full_block_hashes(self, request: Request) -> list[bytes]:
        """Hashes of the request's full blocks (prompt and output tokens), extended incrementally."""
        hashes = self._hashes.setdefault(request.request_id, [])
        tokens = request.all_token_ids
        for i in range(len(hashes), len(tokens) // self.block_size):
            block_tokens = tokens[i * self.block_size:(i + 1) * self.block_size]
            hashes.append(hash_block(hashes[-1] if hashes else None, block_tokens, request.lora_int_id))
        return hashes
