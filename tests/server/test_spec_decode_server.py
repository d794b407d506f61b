"""`jaxllm serve --speculative-config`: a server that speculates answers as one that does not, and /metrics
carries vLLM's spec_decode counters."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.helpers import MODEL
from tests.server.test_metrics_names import samples, value

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})


@pytest.mark.slow
def test_a_speculating_server_answers_as_a_plain_one_and_counts_its_proposals(start_test_server, server):
    speculating = start_test_server("--max-num-seqs", "8", "--max-model-len", "256", "--speculative-config", SPEC)
    body = {"model": MODEL, "prompt": [11, 12, 13, 14, 15] * 6, "max_tokens": 24, "temperature": 0.0,
            "ignore_eos": True}
    replies = [httpx.post(s.url + "/v1/completions", json=body, timeout=120).json() for s in (server, speculating)]
    assert replies[0]["choices"][0]["text"] == replies[1]["choices"][0]["text"]
    found = samples(speculating.url)
    drafts, tokens = value(found, "vllm:spec_decode_num_drafts_total"), \
        value(found, "vllm:spec_decode_num_draft_tokens_total")
    accepted = value(found, "vllm:spec_decode_num_accepted_tokens_total")
    per_pos = {s.labels["position"]: s.value for s in found["vllm:spec_decode_num_accepted_tokens_per_pos_total"]}
    assert drafts > 0 and tokens >= drafts and 0 <= accepted <= tokens
    assert set(per_pos) == {"0", "1", "2"} and sum(per_pos.values()) == accepted
    assert "vllm:spec_decode_num_drafts_total" not in samples(server.url)  # only a speculating engine has them
    assert value(found, "vllm:generation_tokens_total") == 24
