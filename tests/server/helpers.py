"""Small helpers shared by the server tests: the /metrics text, the openai clients, a stand-in engine."""

from __future__ import annotations

import re
from types import SimpleNamespace

import httpx
import openai

from tests.server.conftest import SERVED_NAME

MODEL = SERVED_NAME


def metrics(url: str) -> dict[str, float]:
    """Samples of /metrics as {'name{labels}': value}, plus each name without labels when it has one series."""
    text = httpx.get(url + "/metrics", timeout=10).text
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, value = line.rsplit(" ", 1)
        samples[key] = float(value)
        name = re.sub(r"\{.*\}", "", key)
        labels = re.sub(r'model_name="[^"]*"', "", key[len(name):])
        labels = re.sub(r"\{,|,\}", lambda m: m.group(0).replace(",", ""), labels.replace(",,", ",")).replace("{}", "")
        samples.setdefault(name + labels, float(value))
    return samples


def client(url: str, api_key: str = "unused", **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=120, **kwargs)


def async_client(url: str, api_key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=120)


class EngineStub:
    """What the serving classes use of an AsyncEngine, without a model: requests are recorded, not run
    (add_request's stream is empty)."""

    def __init__(self, max_model_len: int = 64):
        from jaxllm.structured_outputs.params import StructuredOutputsConfig

        self.engine = SimpleNamespace(scheduler_config=SimpleNamespace(max_model_len=max_model_len),
                                      sampling_defaults={}, structured_outputs_config=StructuredOutputsConfig())
        self.added = []  # (request id, prompt, params)

    def check_capacity(self, num_sequences: int) -> None:
        pass

    async def add_request(self, request_id, prompt, params, lora_request=None, priority=0):
        self.added.append((request_id, prompt, params))
        return SimpleNamespace(close=lambda: None)
