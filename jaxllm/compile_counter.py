"""Count the XLA programs a piece of code builds, through jax.monitoring (a public, supported API).

JAX records the event BACKEND_COMPILE_EVENT once for every executable it obtains from XLA: compiled, or loaded
from its persistent cache; the engine records it too for a step program it loads from its own (program_cache). Eager jnp operations outside jit build programs too, so a counter around
an engine step sees everything the step makes XLA build, not only the runner's own programs.

    with CompileCounter() as compiles:
        engine.step()
    assert compiles.count == 0
"""

from __future__ import annotations

import threading

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Programs built (in any thread) while the counter is active: their names and seconds."""

    def __init__(self):
        self.events: list[tuple[str, float]] = []  # (function name, seconds) per program
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self.events)

    @property
    def seconds(self) -> float:
        return sum(seconds for _, seconds in self.events)

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            with self._lock:
                self.events.append((str(kwargs.get("fun_name", "?")), duration))

    def __enter__(self) -> "CompileCounter":
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc_info) -> None:
        jax.monitoring.unregister_event_duration_listener(self._listen)
