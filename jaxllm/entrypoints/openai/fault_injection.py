"""Test-only fault injection for the server's engine loop, off unless JAXLLM_FAULT_INJECTION=1 is set.

With it on, a text prompt holding one of these markers makes the engine thread misbehave, so tests can check
that the server survives (tests/reliability/test_faults.py):

    FAULT-IN-ADD      adding that request raises RuntimeError (only that request fails)
    FAULT-IN-STEP     the next engine step raises RuntimeError (the engine loop dies; /health turns 503)
    FAULT-STALL-STEP  the next engine step sleeps JAXLLM_FAULT_STALL_S seconds (default 5) first (a wedged engine)
"""

from __future__ import annotations

import os
import time

ENV_FLAG = "JAXLLM_FAULT_INJECTION"
ENV_STALL_S = "JAXLLM_FAULT_STALL_S"
ADD_MARKER, STEP_MARKER, STALL_MARKER = "FAULT-IN-ADD", "FAULT-IN-STEP", "FAULT-STALL-STEP"


class InjectedFault(RuntimeError):
    pass


class FaultInjector:
    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self._step_fault = self._stall = False

    @classmethod
    def from_env(cls) -> "FaultInjector | None":
        if os.environ.get(ENV_FLAG) != "1":
            return None
        return cls(float(os.environ.get(ENV_STALL_S, "5")))

    def before_add(self, prompt) -> None:
        """Called on the engine thread before a request is added."""
        text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
        if not isinstance(text, str):
            return
        if ADD_MARKER in text:
            raise InjectedFault(f"injected fault: {ADD_MARKER} while adding a request")
        self._step_fault |= STEP_MARKER in text
        self._stall |= STALL_MARKER in text

    def before_step(self) -> None:
        """Called on the engine thread before each step."""
        if self._stall:
            self._stall = False
            time.sleep(self.stall_s)
        if self._step_fault:
            self._step_fault = False
            raise InjectedFault(f"injected fault: {STEP_MARKER} in an engine step")
