"""Package of the vLLM stub (see vllm/__init__.py)."""
