"""Stub of vLLM's engine exceptions (imported by tests that mock a dead engine; those are skipped)."""


class EngineDeadError(Exception):
    """The engine stopped."""


class EngineGenerateError(Exception):
    """A request failed inside the engine."""
