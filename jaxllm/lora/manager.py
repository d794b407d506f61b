"""LoRAManager: the adapters the engine knows, their host copies, and which adapter each device slot holds.

Host-only (plain Python and numpy). Three levels, as in vLLM:

    registered   every LoRARequest seen (id -> request); a new one is read and checked when first added, so a
                 bad adapter fails its own request at once
    host cache   the adapters' arrays (peft.HostAdapter), an LRU of at most max_cpu_loras (read again from
                 their directory when needed after eviction)
    device slots max_loras slots, 1..max_loras (slot 0 means "no adapter"), an LRU: a request is admitted only
                 when its adapter is in a slot, or a slot is free, or the least recently used slot holds an
                 adapter no running request uses; otherwise it waits. A newly assigned slot is reported by
                 take_loads() and written by the runner before the step that first uses it.
"""

from __future__ import annotations

from collections import OrderedDict

from jaxllm.config import ModelConfig
from jaxllm.lora.peft import HostAdapter, load_peft_adapter
from jaxllm.lora.request import LoRARequest


class AdapterRemovedError(ValueError):
    """A request names an adapter that was removed (a server answers 404: the model no longer exists)."""


class LoRAManager:
    def __init__(self, config: ModelConfig, *, max_loras: int, max_lora_rank: int, max_cpu_loras: int, dtype):
        self.config = config
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.dtype = dtype
        self.registered: dict[int, LoRARequest] = {}
        self.retired: set[int] = set()  # ids removed by the user: never served to new requests, never reused
        self._host: OrderedDict[int, HostAdapter] = OrderedDict()  # lora id -> arrays, least recent first
        self._slots: OrderedDict[int, int] = OrderedDict()  # lora id -> slot, least recently used first
        self._loads: list[tuple[int, int]] = []  # (slot, lora id) assigned since the last take_loads

    # ------------------------------------------------------------------ adapters
    def register(self, lora: LoRARequest) -> None:
        """Know `lora` (read and check its files if new); ValueError if its id is another adapter's."""
        if lora.lora_int_id in self.retired:
            raise AdapterRemovedError(f"LoRA adapter id {lora.lora_int_id} was removed; give a new adapter a new id")
        known = self.registered.get(lora.lora_int_id)
        if known is not None:
            if (known.lora_name, known.lora_path) != (lora.lora_name, lora.lora_path):
                raise ValueError(f"lora_int_id {lora.lora_int_id} is already adapter {known.lora_name!r} "
                                 f"({known.lora_path}); each adapter needs its own id")
            return
        for other_id, other in self.registered.items():
            if other.lora_name == lora.lora_name and other_id not in self.retired:
                raise ValueError(f"LoRA name {lora.lora_name!r} is already adapter id {other.lora_int_id}")
        self._cache(lora.lora_int_id, self._read(lora))
        self.registered[lora.lora_int_id] = lora

    def retire(self, lora_int_id: int) -> None:
        """No new request may use the adapter (its name is free again at once); unregister it once the requests
        already using it have ended."""
        self.retired.add(lora_int_id)

    def unregister(self, lora_int_id: int) -> None:
        """Forget an adapter no request uses any more (its slot becomes free)."""
        self.registered.pop(lora_int_id, None)
        self._host.pop(lora_int_id, None)
        self._slots.pop(lora_int_id, None)

    def host_adapter(self, lora_int_id: int) -> HostAdapter:
        adapter = self._host.get(lora_int_id)
        if adapter is None:
            adapter = self._read(self.registered[lora_int_id])
        self._cache(lora_int_id, adapter)
        return adapter

    def _read(self, lora: LoRARequest) -> HostAdapter:
        return load_peft_adapter(lora.lora_path, self.config, self.max_lora_rank, self.dtype)

    def _cache(self, lora_int_id: int, adapter: HostAdapter) -> None:
        self._host[lora_int_id] = adapter
        self._host.move_to_end(lora_int_id)
        while len(self._host) > self.max_cpu_loras:
            self._host.popitem(last=False)

    # ------------------------------------------------------------------ device slots
    def acquire(self, lora_int_id: int, busy: set[int]) -> int | None:
        """The slot holding the adapter (0 for none), assigning one if needed; None when every slot holds an
        adapter in `busy` (used by running requests): the request waits."""
        if lora_int_id == 0:
            return 0
        if lora_int_id in self._slots:
            self._slots.move_to_end(lora_int_id)
            return self._slots[lora_int_id]
        if len(self._slots) < self.max_loras:
            slot = min(set(range(1, self.max_loras + 1)) - set(self._slots.values()))
        else:
            victim = next((lid for lid in self._slots if lid not in busy), None)
            if victim is None:
                return None
            slot = self._slots.pop(victim)
        self._slots[lora_int_id] = slot
        self._loads.append((slot, lora_int_id))
        return slot

    def take_loads(self) -> list[tuple[int, int]]:
        """(slot, lora id) pairs assigned since the last call, for the runner to write (a slot reassigned twice
        keeps its last adapter only)."""
        loads, self._loads = self._loads, []
        final = {slot: lid for slot, lid in loads}
        return [(slot, lid) for slot, lid in final.items() if self._slots.get(lid) == slot]

    @property
    def slots(self) -> dict[int, int]:
        """lora id -> slot, for the adapters now in device slots."""
        return dict(self._slots)
