"""Prometheus metrics of the server, updated by the engine thread after every step (prometheus-client is
thread-safe). Each server owns its registry, so several apps can live in one process (tests)."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jaxllm.outputs import RequestOutput

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r, m = self.registry, model_name

        def gauge(name, doc):
            return Gauge(f"jaxllm:{name}", doc, labels, registry=r).labels(m)

        def counter(name, doc):
            return Counter(f"jaxllm:{name}", doc, labels, registry=r).labels(m)

        def histogram(name, doc, buckets=LATENCY_BUCKETS):
            return Histogram(f"jaxllm:{name}", doc, labels, buckets=buckets, registry=r).labels(m)

        self.running = gauge("num_requests_running", "Sequences in the running batch")
        self.waiting = gauge("num_requests_waiting", "Sequences waiting to be scheduled")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1)")
        self.programs = gauge("compiled_programs", "XLA programs the engine built (compiled or loaded from the "
                                                   "persistent cache), warm-up included")
        self.prefix_queries = counter("prefix_cache_queries", "Prefix cache lookups")
        self.prefix_hits = counter("prefix_cache_hits", "Prefix cache hits")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first generated token")
        self.itl = histogram("inter_token_latency_seconds", "Time between consecutive generated tokens")
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to the last token of a request")
        self.step_seqs = histogram("iteration_num_seqs", "Sequences that produced a token in one engine step",
                                   BATCH_BUCKETS)
        self._success = Counter("jaxllm:request_success", "Finished requests by finish reason",
                                labels + ["finished_reason"], registry=r)
        self._model = m
        self._last_prefix = (0, 0)
        self.engine_stats: dict = {}  # the engine's stats after its last step

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def record_engine(self, stats: dict) -> None:
        self.engine_stats = stats
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.kv_usage.set(stats["kv_cache_usage"])
        self.programs.set(stats["num_compiled_programs"])
        queries, hits = stats["prefix_cache_queries"], stats["prefix_cache_hits"]
        self.prefix_queries.inc(max(0, queries - self._last_prefix[0]))
        self.prefix_hits.inc(max(0, hits - self._last_prefix[1]))
        self._last_prefix = (queries, hits)

    def record_output(self, output: RequestOutput, tracker: "RequestTracker", now: float) -> None:
        """Account for one delta output of a request."""
        new_tokens = sum(len(c.token_ids) for c in output.outputs)
        self.generation_tokens.inc(new_tokens)
        if new_tokens and tracker.last_token_time is None:
            self.ttft.observe(now - tracker.arrival_time)
        elif new_tokens:
            gap = (now - tracker.last_token_time) / new_tokens
            for _ in range(new_tokens):
                self.itl.observe(gap)
        if new_tokens:
            tracker.last_token_time = now
        for completion in output.outputs:
            if completion.finish_reason is not None:
                self._success.labels(self._model, completion.finish_reason).inc()
        if output.finished:
            self.prompt_tokens.inc(len(output.prompt_token_ids))
            self.e2e.observe(now - tracker.arrival_time)


def load_report_header(report_format: str, engine_stats: dict) -> dict[str, str]:
    """The ORCA load report a client asked for with `endpoint-load-metrics-format: TEXT | JSON` (vLLM's
    `endpoint-load-metrics` response header: KV cache use and waiting requests); {} for another format."""
    named = {"kv_cache_usage_perc": float(engine_stats.get("kv_cache_usage", 0.0)),
             "num_requests_waiting": float(engine_stats.get("num_waiting", 0))}
    if report_format.upper() == "TEXT":
        return {"endpoint-load-metrics": "TEXT " + ", ".join(f"named_metrics.{k}={v}" for k, v in named.items())}
    if report_format.upper() == "JSON":
        return {"endpoint-load-metrics": "JSON " + json.dumps({"named_metrics": named})}
    return {}


class RequestTracker:
    """Per-request timing the metrics need (the engine's clock: time.monotonic)."""

    __slots__ = ("arrival_time", "last_token_time")

    def __init__(self, arrival_time: float):
        self.arrival_time = arrival_time
        self.last_token_time: float | None = None
