"""Shim of vLLM's tests/conftest.py.

- puts the `vllm` stand-in (<work dir>/stubs) on the import path;
- redirects Hugging Face tokenizer ids to the default model's tokenizer, saved by setup in <work dir>/tokenizer
  (the server serves the default model under every name, and nothing is downloaded from the hub);
- marks skipped, with the reason, the tests outside this measurement: "out of scope: ..." for features jaxllm does
  not serve here, "depends on vLLM internals" for unit tests of vLLM's own classes (they start no server)."""
import inspect
import os
import sys
from pathlib import Path

WORK_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(WORK_DIR / "stubs"))
os.environ.setdefault("JAXLLM_SHIM_TOKENIZER", str(WORK_DIR / "tokenizer"))

import pytest  # noqa: E402
import transformers  # noqa: E402

_from_pretrained = transformers.AutoTokenizer.from_pretrained.__func__


def _default_model_from_pretrained(cls, name, *args, **kwargs):
    """AutoTokenizer.from_pretrained(<hub id>) -> the default model's tokenizer; a local directory loads as is."""
    if not os.path.isdir(str(name)):
        name = os.environ["JAXLLM_SHIM_TOKENIZER"]
    return _from_pretrained(cls, name, *args, **kwargs)


transformers.AutoTokenizer.from_pretrained = classmethod(_default_model_from_pretrained)


class LocalAssetServer:
    """vLLM serves test images with it; multimodal tests are out of scope."""

    def __init__(self, *args, **kwargs):
        raise pytest.skip.Exception("out of scope: multimodal assets")


@pytest.fixture(scope="session")
def local_asset_server():
    pytest.skip("out of scope: multimodal assets")


# (test file name, substring of the test id or None for the whole file, reason)
OUT_OF_SCOPE = [
    ("test_chat.py", "structured_outputs", "structured output"),
    ("test_chat.py", "response_format_json", "structured output"),
    ("test_chat.py", "zephyr-lora", "LoRA module at server start"),
    ("test_chat.py", "reasoning_effort", "reasoning"),
    ("test_completion.py", "invalid_json_schema", "structured output"),
    ("test_completion.py", "invalid_regex", "structured output"),
    ("test_completion.py", "invalid_grammar", "structured output"),
    ("test_completion.py", "routed_experts", "MoE routed experts"),
    ("test_chat_completion.py", "json_schema", "structured output"),
    ("test_chat_completion.py", "regex", "structured output"),
    ("test_chat_completion.py", "grammar", "structured output"),
    ("test_chat_completion.py", "kv_transfer", "KV transfer (disaggregated prefill)"),
    ("test_logprob_token_ids.py", "beam_search", "beam search"),
    ("test_tokenization.py", "with_tools", "tool calling"),
    ("test_metrics.py", "multimodal", "multimodal"),
    ("test_metrics.py", "run_batch", "vllm run-batch CLI"),
    ("test_models.py", None, "LoRA modules at server start"),
    ("test_uds.py", None, "unix-socket serving (--uds)"),
    ("test_prompt_validation.py", "prompt_embeds", "prompt embeddings"),
    ("test_basic.py", "engine_dead_error", "vLLM internals (mock engine client)"),
]


def _out_of_scope_reason(item) -> str | None:
    file_name = Path(str(item.fspath)).name
    for name, id_part, reason in OUT_OF_SCOPE:
        if file_name == name and (id_part is None or id_part in item.nodeid):
            return reason
    return None


def _uses_server(item) -> bool:
    """Whether the test talks to a server: a server/client fixture, or a RemoteOpenAIServer in its body."""
    if any("server" in name or "client" in name for name in item.fixturenames):
        return True
    try:
        return "RemoteOpenAIServer" in inspect.getsource(item.function)
    except (OSError, TypeError):
        return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = _out_of_scope_reason(item)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"out of scope: {reason}"))
        elif not _uses_server(item):
            item.add_marker(pytest.mark.skip(reason="depends on vLLM internals (no server)"))
