"""vLLM's tests package, with the shim's utils.py and conftest.py (see benchmarks/vllm_server_tests/README.md)."""
