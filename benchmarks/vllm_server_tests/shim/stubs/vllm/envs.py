"""Stub of vllm.envs: every vLLM environment setting reads as unset (None), the Rust frontend as off."""
VLLM_USE_RUST_FRONTEND = False


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return None
