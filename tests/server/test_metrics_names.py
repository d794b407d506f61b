"""/metrics with vLLM's names and labels: every metric vLLM's published Grafana dashboard queries is there, and
the request and step counts add up as vLLM's own metrics test expects (sequential requests, fixed prompt and
length)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.helpers import MODEL

# What vLLM's dashboard (examples/observability/prometheus_grafana/grafana.json) queries, by the label it filters on
DASHBOARD = ["vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
             "vllm:e2e_request_latency_seconds_count", "vllm:generation_tokens_total",
             "vllm:inter_token_latency_seconds_bucket", "vllm:inter_token_latency_seconds_count",
             "vllm:inter_token_latency_seconds_sum", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
             "vllm:num_requests_waiting", "vllm:prompt_tokens_total", "vllm:request_decode_time_seconds_sum",
             "vllm:request_generation_tokens_bucket", "vllm:request_max_num_generation_tokens_sum",
             "vllm:request_prefill_time_seconds_sum", "vllm:request_prompt_tokens_bucket",
             "vllm:request_queue_time_seconds_sum", "vllm:request_success_total",
             "vllm:request_time_per_output_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_count",
             "vllm:request_time_per_output_token_seconds_sum", "vllm:time_to_first_token_seconds_bucket",
             "vllm:time_to_first_token_seconds_count", "vllm:time_to_first_token_seconds_sum"]
ALSO = ["vllm:num_requests_waiting_by_reason", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total", "vllm:admission_rejections_total", "vllm:iteration_tokens_total_bucket",
        "vllm:cache_config_info", "vllm:request_inference_time_seconds_count", "vllm:request_params_n_count",
        "vllm:request_params_max_tokens_sum", "vllm:request_num_preemptions_count"]


def samples(url: str) -> dict[str, list]:
    text = httpx.get(url + "/metrics", timeout=10).text
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(found: dict, name: str) -> float:
    return sum(s.value for s in found.get(name, []) if "le" not in s.labels)


def test_the_dashboard_finds_every_metric_it_queries_with_its_labels(server):
    httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=60)
    found = samples(server.url)
    missing = [name for name in DASHBOARD + ALSO if name not in found]
    assert not missing, missing
    assert all(s.labels["model_name"] == MODEL for name in DASHBOARD for s in found[name])
    assert {s.labels["reason"] for s in found["vllm:num_requests_waiting_by_reason"]} == {"capacity", "deferred"}
    info = found["vllm:cache_config_info"][0]
    assert info.value == 1 and {"block_size", "num_gpu_blocks", "enable_prefix_caching"} <= set(info.labels)
    assert all(s.labels["finished_reason"] for s in found["vllm:request_success_total"])


@pytest.mark.slow
def test_counts_add_up_as_vllm_expects(start_test_server):
    server = start_test_server("--max-num-seqs", "4", "--max-model-len", "128")  # alone: nothing else moves the counts
    prompt, max_tokens, num_requests = [9707, 11, 847, 829, 374, 12, 30], 10, 4
    for _ in range(num_requests):
        reply = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
        assert reply.status_code == 200
    found = samples(server.url)
    expected = {
        "vllm:time_to_first_token_seconds_count": num_requests,
        "vllm:inter_token_latency_seconds_count": num_requests * (max_tokens - 1),
        "vllm:e2e_request_latency_seconds_count": num_requests,
        "vllm:request_queue_time_seconds_count": num_requests,
        "vllm:request_inference_time_seconds_count": num_requests,
        "vllm:request_prefill_time_seconds_count": num_requests,
        "vllm:request_decode_time_seconds_count": num_requests,
        "vllm:request_num_preemptions_count": num_requests,
        "vllm:request_prompt_tokens_sum": num_requests * len(prompt),
        "vllm:request_generation_tokens_sum": num_requests * max_tokens,
        "vllm:request_params_n_count": num_requests,
        "vllm:request_params_max_tokens_sum": num_requests * max_tokens,
        "vllm:iteration_tokens_total_sum": num_requests * (len(prompt) + max_tokens),
        "vllm:iteration_tokens_total_count": num_requests * max_tokens,
        "vllm:prompt_tokens_total": num_requests * len(prompt),
        "vllm:generation_tokens_total": num_requests * max_tokens,
        "vllm:request_success_total": num_requests,
        "vllm:request_max_num_generation_tokens_sum": num_requests * max_tokens,
    }
    assert {name: value(found, name) for name in expected} == expected
