"""Stub of vllm.exceptions: the error classes tests name in `pytest.raises` / isinstance checks."""


class VLLMValidationError(ValueError):
    """A request vLLM rejects as invalid."""


class VLLMNotFoundError(Exception):
    """A model, adapter or route that does not exist."""


class GenerationError(Exception):
    """A failure while generating."""


def __getattr__(name):
    """Any other exception name: a fresh Exception subclass, created once."""
    if name.startswith("__"):
        raise AttributeError(name)
    cls = type(name, (Exception,), {})
    globals()[name] = cls
    return cls
