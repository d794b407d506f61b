"""Shape buckets: every step shape the runner can meet lies in the enumerated bucket set."""

from __future__ import annotations

import random

from jaxllm.engine.bucketing import Buckets, StepShape


def test_decode_and_mixed_shapes():
    buckets = Buckets(max_num_batched_tokens=64, max_num_seqs=8, max_blocks_per_seq=16)
    assert buckets.shape_for([1, 1, 1], [2, 5, 3]) == StepShape(4, 4, 8, 0, 1)
    assert buckets.shape_for([1, 1, 1, 40], [3, 3, 3, 3]) == StepShape(64, 4, 4, 1, 64)
    assert buckets.shape_for([9, 7], [1, 1]) == StepShape(16, 2, 1, 2, 16)


def test_every_reachable_shape_is_in_the_bucket_set():
    buckets = Buckets(max_num_batched_tokens=48, max_num_seqs=6, max_blocks_per_seq=10)
    bucket_set = set(buckets.all_shapes())
    assert len(bucket_set) == len(list(buckets.all_shapes()))  # no duplicates
    rng = random.Random(0)
    for _ in range(5000):
        num_seqs = rng.randint(1, 6)
        budget = 48
        query_lens = []
        for _ in range(num_seqs):
            n = rng.choice([1, 1, rng.randint(1, budget - (num_seqs - len(query_lens) - 1))])
            n = min(n, budget - (num_seqs - len(query_lens) - 1))
            query_lens.append(n)
            budget -= n
        blocks = [rng.randint(1, 10) for _ in query_lens]
        assert buckets.shape_for(query_lens, blocks) in bucket_set, (query_lens, blocks)
    assert set(buckets.decode_shapes()) <= bucket_set
