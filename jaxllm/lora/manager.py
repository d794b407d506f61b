"""LoRAManager: the adapters the engine knows, their host copies, and which adapter each device slot holds.

Host-only (plain Python and numpy). Three levels, as in vLLM:

    registered   every LoRARequest seen (id -> request); a new one is read and checked when first added, so a
                 bad adapter fails its own request at once
    host cache   the adapters' arrays (peft.HostAdapter), an LRU of at most max_cpu_loras; an adapter a request
                 in the engine uses is never evicted (the cache may then hold more), so the engine's step never
                 reads a file: a request whose adapter was evicted has it read again when it is added (a file
                 gone by then fails that request alone)
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
    def __init__(self, config: ModelConfig, *, max_loras: int, max_lora_rank: int, max_cpu_loras: int, dtype,
                 in_use=lambda: set()):
        """in_use: () -> the adapter ids the engine's requests use (those stay in the host cache)."""
        self.config = config
        self.in_use = in_use
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
    def register(self, lora: LoRARequest, arrays: HostAdapter | None = None) -> None:
        """Know `lora` and hold its arrays: `arrays` when the caller read them (read_arrays, off the engine
        thread), else read and checked here if new or evicted; ValueError if its id is another adapter's or its
        files cannot be read."""
        if lora.lora_int_id in self.retired:
            raise AdapterRemovedError(f"LoRA adapter id {lora.lora_int_id} was removed; give a new adapter a new id")
        known = self.registered.get(lora.lora_int_id)
        if known is not None:
            if (known.lora_name, known.lora_path) != (lora.lora_name, lora.lora_path):
                raise ValueError(f"lora_int_id {lora.lora_int_id} is already adapter {known.lora_name!r} "
                                 f"({known.lora_path}); each adapter needs its own id")
            if lora.lora_int_id not in self._host:  # evicted: read it again now, before its request is taken
                self._cache(lora.lora_int_id, arrays if arrays is not None else self.read_arrays(lora))
            return
        for other_id, other in self.registered.items():
            if other.lora_name == lora.lora_name and other_id not in self.retired:
                raise ValueError(f"LoRA name {lora.lora_name!r} is already adapter id {other.lora_int_id}")
        self._cache(lora.lora_int_id, arrays if arrays is not None else self.read_arrays(lora))
        self.registered[lora.lora_int_id] = lora

    def is_held(self, lora_int_id: int) -> bool:
        """Its arrays are in the host cache (a request for it needs no file read)."""
        return lora_int_id in self._host

    def retire(self, lora_int_id: int) -> None:
        """No new request may use the adapter (its name is free again at once); unregister it once the requests
        already using it have ended."""
        self.retired.add(lora_int_id)

    def unregister(self, lora_int_id: int) -> None:
        """Forget an adapter no request uses any more: its slot becomes free and is zeroed (take_loads reports
        (slot, 0)), so nothing of it stays on the device."""
        self.registered.pop(lora_int_id, None)
        self._host.pop(lora_int_id, None)
        slot = self._slots.pop(lora_int_id, None)
        if slot is not None:
            self._loads.append((slot, 0))

    def host_adapter(self, lora_int_id: int) -> HostAdapter:
        """The arrays of an adapter a request in the engine uses (held since that request was added)."""
        self._host.move_to_end(lora_int_id)
        return self._host[lora_int_id]

    def read_arrays(self, lora: LoRARequest) -> HostAdapter:
        """Read and check the adapter's files (no state changes: any thread may call it)."""
        return load_peft_adapter(lora.lora_path, self.config, self.max_lora_rank, self.dtype)

    def _cache(self, lora_int_id: int, adapter: HostAdapter) -> None:
        self._host[lora_int_id] = adapter
        self._host.move_to_end(lora_int_id)
        if len(self._host) <= self.max_cpu_loras:
            return
        in_use = self.in_use() | {lora_int_id}
        for victim in [i for i in self._host if i not in in_use][:len(self._host) - self.max_cpu_loras]:
            del self._host[victim]

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
        taken = set(self._slots.values())
        return [(slot, lid) for slot, lid in final.items()
                if self._slots.get(lid) == slot or (lid == 0 and slot not in taken)]

    @property
    def slots(self) -> dict[int, int]:
        """lora id -> slot, for the adapters now in device slots."""
        return dict(self._slots)
