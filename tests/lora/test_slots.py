"""LoRAManager's device slots: an LRU over max_loras slots that never evicts an adapter a running request uses."""

from __future__ import annotations

from jaxllm.config import ModelConfig
from jaxllm.lora.manager import LoRAManager

CONFIG = ModelConfig(architecture="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                     num_heads=2, num_kv_heads=1, head_dim=16)


def manager(max_loras: int) -> LoRAManager:
    return LoRAManager(CONFIG, max_loras=max_loras, max_lora_rank=4, max_cpu_loras=max_loras, dtype="float32")


def test_base_model_needs_no_slot():
    slots = manager(1)
    assert slots.acquire(0, busy=set()) == 0 and slots.take_loads() == []


def test_free_slots_first_then_the_least_recently_used_idle_one():
    slots = manager(2)
    assert [slots.acquire(i, busy=set()) for i in (7, 8)] == [1, 2]
    assert slots.take_loads() == [(1, 7), (2, 8)]
    assert slots.acquire(7, busy=set()) == 1  # a hit: no load, and 7 becomes the most recent
    assert slots.acquire(9, busy=set()) == 2  # 8 is the least recently used
    assert slots.take_loads() == [(2, 9)] and slots.slots == {7: 1, 9: 2}


def test_busy_adapters_are_never_evicted():
    slots = manager(2)
    slots.acquire(7, busy=set())
    slots.acquire(8, busy=set())
    assert slots.acquire(9, busy={7, 8}) is None  # the request waits
    assert slots.acquire(9, busy={8}) == 1  # 7 is idle: its slot goes
    assert slots.slots == {8: 2, 9: 1}


def test_a_slot_reassigned_before_the_runner_wrote_it_is_written_once():
    slots = manager(1)
    slots.acquire(7, busy=set())
    slots.acquire(8, busy=set())
    assert slots.take_loads() == [(1, 8)]


def test_unregistered_adapters_free_their_slot():
    slots = manager(1)
    slots.acquire(7, busy=set())
    slots.take_loads()
    slots.unregister(7)
    assert slots.slots == {} and slots.acquire(8, busy={7}) == 1
