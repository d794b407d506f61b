"""Scheduler: token budget, chunked prefill, decode-first ordering, preemption, up-front rejection, stops."""

from __future__ import annotations

import random

import pytest

from jaxllm.config import SchedulerConfig
from jaxllm.engine.block_pool import BlockPool
from jaxllm.engine.kv_cache_manager import KVCacheManager
from jaxllm.engine.request import Request, RequestStatus
from jaxllm.engine.scheduler import Scheduler
from jaxllm.sampling_params import SamplingParams

B = 4


def make_scheduler(num_blocks=64, **config):
    pool = BlockPool(num_blocks)
    defaults = dict(max_num_seqs=8, max_num_batched_tokens=16, max_model_len=64)
    return Scheduler(SchedulerConfig(**{**defaults, **config}), KVCacheManager(pool, B)), pool


def req(rid, prompt_len, max_tokens=4, start=0, **params):
    return Request(rid, list(range(start, start + prompt_len)), SamplingParams(max_tokens=max_tokens, **params),
                   eos_token_ids=(0,))


def run_step(scheduler, token=7):
    """Schedule one step and feed back `token` for every sampling chunk (a mock runner)."""
    out = scheduler.schedule()
    sampled = {c.request_id: token for c in out.chunks if c.samples}
    finished = scheduler.update(out, sampled)
    return out, finished


def shape(out):
    return [(c.request_id, c.num_new_tokens) for c in out.chunks]


def test_chunked_prefill_within_budget_then_decode_first():
    s, _ = make_scheduler()
    s.add_request(req("long", 40, ignore_eos=True))
    s.add_request(req("short", 5, start=100, ignore_eos=True))
    assert shape(run_step(s)[0]) == [("long", 16)]
    assert shape(run_step(s)[0]) == [("long", 16)]
    out, _ = run_step(s)
    assert shape(out) == [("long", 8), ("short", 5)]  # the prompt's last chunk samples; the budget admits more
    assert [c.samples for c in out.chunks] == [True, True]
    assert shape(run_step(s)[0]) == [("long", 1), ("short", 1)]  # decodes, running first


def test_max_num_seqs_limits_admission():
    s, _ = make_scheduler(max_num_seqs=2)
    for i in range(3):
        s.add_request(req(f"r{i}", 3, ignore_eos=True))
    assert shape(run_step(s)[0]) == [("r0", 3), ("r1", 3)]
    assert [r.request_id for r in s.waiting] == ["r2"]


def test_finished_request_frees_blocks_and_slot_goes_to_next():
    s, pool = make_scheduler(max_num_seqs=1)
    s.add_request(req("a", 3, max_tokens=2, ignore_eos=True))
    s.add_request(req("b", 3, ignore_eos=True))
    run_step(s)
    out, finished = run_step(s)
    assert [r.request_id for r in finished] == ["a"] and finished[0].status is RequestStatus.FINISHED_LENGTH
    assert pool.num_free_blocks == pool.num_usable_blocks  # freed in the same step
    assert shape(run_step(s)[0]) == [("b", 3)]


def test_stop_rules_follow_min_tokens_eos_and_stop_token_ids():
    s, _ = make_scheduler()
    s.add_request(req("eos", 3, max_tokens=10, min_tokens=2))
    s.add_request(req("stopid", 3, max_tokens=10, stop_token_ids=[9]))
    run_step(s, token=0)  # EOS: stops "stopid"; "eos" has not reached min_tokens yet
    assert s.requests.keys() == {"eos"}
    _, finished = run_step(s, token=0)
    assert finished[0].status is RequestStatus.FINISHED_STOPPED and finished[0].stop_reason is None
    s.add_request(req("stopid2", 3, max_tokens=10, stop_token_ids=[9]))
    run_step(s, token=5)
    _, finished = run_step(s, token=9)
    assert finished[0].stop_reason == 9 and finished[0].output_token_ids == [5, 9]


def test_requests_that_can_never_fit_are_rejected_up_front():
    s, _ = make_scheduler(num_blocks=5)  # 4 usable blocks = 16 tokens
    with pytest.raises(ValueError, match=r"prompt \(60 tokens\) \+ max_tokens \(10\) = 70 exceeds max_model_len 64"):
        s.add_request(req("a", 60, max_tokens=10))
    with pytest.raises(ValueError, match=r"needs 5 KV blocks for 20 tokens, but the pool only has 4"):
        s.add_request(req("b", 10, max_tokens=10))
    with pytest.raises(ValueError, match=r"prompt has 64 tokens; max_model_len is 64"):
        s.add_request(req("c", 64, max_tokens=None))
    assert not s.has_unfinished_requests()


def test_preemption_recomputes_latest_request_and_keeps_its_output():
    s, pool = make_scheduler(num_blocks=5, max_num_batched_tokens=32)  # 4 usable blocks of 4 tokens
    old = req("old", 4, max_tokens=8, ignore_eos=True)  # each grows to 12 tokens = 3 blocks: 6 > 4
    new = req("new", 4, max_tokens=8, start=50, ignore_eos=True)
    s.add_request(old)
    s.add_request(new)
    log = []
    while s.has_unfinished_requests():
        out, _ = run_step(s)
        log.append((shape(out), out.preempted_request_ids, len(new.output_token_ids)))
    preempt_steps = [i for i, (_, p, _) in enumerate(log) if p]
    assert [log[i][1] for i in preempt_steps] == [["new"]]  # FCFS: the most recently admitted goes
    kept = log[preempt_steps[0]][2]
    assert kept == 5  # its five tokens survive preemption ...
    resumed = next(sh for sh, _, _ in log[preempt_steps[0] + 1:] if any(r == "new" for r, _ in sh))
    assert resumed == [("new", 5)]  # ... and are recomputed after the cached first block (4 of 9 tokens)
    assert new.num_cached_tokens == 0 and new.num_preemptions == 1
    assert len(old.output_token_ids) == len(new.output_token_ids) == 8
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_priority_policy_admits_and_preempts_by_priority():
    s, _ = make_scheduler(max_num_seqs=1, policy="priority")
    s.add_request(Request("low", [1, 2], SamplingParams(max_tokens=2, ignore_eos=True), priority=5))
    s.add_request(Request("high", [3, 4], SamplingParams(max_tokens=2, ignore_eos=True), priority=-1))
    assert shape(run_step(s)[0]) == [("high", 2)]


def test_abort_frees_everything():
    s, pool = make_scheduler()
    s.add_request(req("a", 9))
    s.add_request(req("b", 9))
    run_step(s)
    s.abort("a")
    s.abort("b")
    assert pool.num_free_blocks == pool.num_usable_blocks and not s.has_unfinished_requests()


def check_invariants(s: Scheduler, pool: BlockPool):
    holders: dict[int, int] = {}
    for request in s.requests.values():
        table = s.kv_cache.block_ids(request)
        assert len(set(table)) == len(table), f"{request.request_id} holds a block twice"
        assert 0 not in table
        if request.status is RequestStatus.RUNNING:
            assert len(table) * B >= request.num_computed_tokens
        for block_id in table:
            holders[block_id] = holders.get(block_id, 0) + 1
    for block in pool.blocks[1:]:
        assert block.ref_count == holders.get(block.block_id, 0), f"block {block.block_id} ref count"
    used = sum(1 for b in pool.blocks[1:] if b.ref_count > 0)
    assert used + pool.num_free_blocks == pool.num_usable_blocks


@pytest.mark.parametrize("seed", [0, 1])
def test_randomized_stress_keeps_pool_consistent(seed):
    rng = random.Random(seed)
    s, pool = make_scheduler(num_blocks=24, max_num_seqs=6, max_num_batched_tokens=24, max_model_len=48)
    prefixes = [list(range(100 * k, 100 * k + 12)) for k in range(3)]  # shared prompt prefixes
    counter = steps_with_preemption = 0
    for step in range(3000):
        if rng.random() < 0.3:
            prompt = rng.choice(prefixes)[:rng.randint(1, 12)] + [rng.randint(1, 99) for _ in range(rng.randint(0, 8))]
            s.add_request(Request(f"r{counter}", prompt or [1], SamplingParams(
                max_tokens=rng.randint(1, 20), ignore_eos=rng.random() < 0.5), eos_token_ids=(3,)))
            counter += 1
        if s.requests and rng.random() < 0.03:
            s.abort(rng.choice(list(s.requests)))
        out = s.schedule()
        steps_with_preemption += bool(out.preempted_request_ids)
        s.update(out, {c.request_id: rng.randint(1, 9) for c in out.chunks if c.samples})
        check_invariants(s, pool)
    while s.has_unfinished_requests():
        out = s.schedule()
        s.update(out, {c.request_id: 5 for c in out.chunks if c.samples})
        check_invariants(s, pool)
    assert steps_with_preemption > 0 and pool.prefix_cache_hits > 0  # the test exercised both
    assert all(b.ref_count == 0 for b in pool.blocks)
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_a_request_that_stops_speculating_frees_its_draft_state():
    """A draft proposer whose proposals are never accepted: once the request's acceptance record turns it off,
    its draft state (and the draft pool's blocks) is freed, not held until the request ends."""
    from jaxllm.spec_decode.config import SpeculativeConfig
    from jaxllm.spec_decode.eligibility import ACCEPTANCE_WINDOW

    class NeverRight:
        def __init__(self):
            self.holding: set[str] = set()

        def propose(self, wanted):
            self.holding |= {rid for rid, _, _ in wanted}
            return {rid: [5] * k for rid, _, k in wanted}

        def free(self, request_id):
            self.holding.discard(request_id)

    proposer = NeverRight()
    speculative = SpeculativeConfig.from_dict({"model": "draft", "num_speculative_tokens": 2})
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16, max_model_len=256),
                          KVCacheManager(BlockPool(128), B), speculative=speculative, proposer=proposer)
    scheduler.add_request(req("r", 4, max_tokens=100, ignore_eos=True))
    request = scheduler.requests["r"]
    for _ in range(200):
        out = scheduler.schedule()
        runs = {rid: [7] for rid in out.scheduled_spec_decode_tokens}  # the target's token: no proposal accepted
        scheduler.update(out, {c.request_id: 7 for c in out.chunks if c.samples}, runs)
        if request.spec.off:
            break
    assert request.spec.off and request.spec.steps >= ACCEPTANCE_WINDOW
    assert proposer.holding == set() and not request.status.finished
