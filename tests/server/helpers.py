"""Small helpers shared by the server tests: the /metrics text and the openai clients."""

from __future__ import annotations

import re

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
