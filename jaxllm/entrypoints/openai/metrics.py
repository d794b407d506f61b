"""Prometheus metrics of the server, with vLLM's names and labels (`vllm:...`, `model_name`, `finished_reason`), so
vLLM's dashboards, alert rules and autoscalers work unchanged; what only jaxllm has is named `jaxllm:...`.
Updated by the engine thread after every step (prometheus-client is thread-safe). Each server owns its registry,
so several apps can live in one process (tests).

    per step      num_requests_running / _waiting / _waiting_by_reason, kv_cache_usage_perc, prefix_cache_queries /
                  _hits, num_preemptions, iteration_tokens_total (prompt tokens computed + tokens generated),
                  jaxllm:iteration_num_seqs, jaxllm:compiled_programs
    per output    generation_tokens, time_to_first_token_seconds, inter_token_latency_seconds
    per finish    request_success, prompt_tokens, e2e_request_latency_seconds, request_{queue,inference,prefill,
                  decode}_time_seconds, request_{prompt,generation}_tokens, request_params_{n,max_tokens},
                  request_num_preemptions, request_time_per_output_token_seconds, request_max_num_generation_tokens
    per refusal   admission_rejections (a request refused because the queue is full)
    once          cache_config_info (the KV cache's settings as labels, value 1)
    speculative   spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens, _num_accepted_tokens_per_pos
                  (label position), when the engine speculates (speculative_config)

Not produced (no counterpart here): multi-modal cache, KV transfer and LoRA-state metrics.
"""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jaxllm.outputs import RequestOutput

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                        240.0, 480.0, 960.0, 1920.0, 7680.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (0, 1, 2, 5, 10, 20, 50)
QUEUE_FULL = "max_num_queued_reqs"  # vLLM's admission-rejection reason for a full request queue


def one_two_five(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to limit (vLLM's token-count buckets)."""
    buckets, scale = [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > limit:
                return tuple(buckets)
            buckets.append(step * scale)
        scale *= 10


class SpecDecodeCounters:
    """vLLM's speculative-decoding counters, moved on by the increase of the engine's totals."""

    NAMES = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
    DOCS = ("Sequences verified with proposals, per step", "Proposed tokens verified", "Proposed tokens accepted")

    def __init__(self, registry: CollectorRegistry, model_name: str, num_positions: int):
        self.counters = {name: Counter(f"vllm:{name}", doc, ["model_name"], registry=registry).labels(model_name)
                         for name, doc in zip(self.NAMES, self.DOCS)}
        per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Proposed tokens accepted, by their "
                          "position in the proposal (0-based)", ["model_name", "position"], registry=registry)
        self.per_pos = [per_pos.labels(model_name, str(i)) for i in range(num_positions)]
        self._last = {name: 0 for name in self.NAMES}
        self._last_per_pos = [0] * num_positions

    def record(self, stats: dict) -> None:
        for name, counter in self.counters.items():
            counter.inc(max(0, stats[name] - self._last[name]))
            self._last[name] = stats[name]
        per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
        for i, counter in enumerate(self.per_pos):
            counter.inc(max(0, per_pos[i] - self._last_per_pos[i]))
        self._last_per_pos = list(per_pos)


class ServerMetrics:
    def __init__(self, model_name: str, max_model_len: int = 8192):
        self.registry = CollectorRegistry()
        r, m = self.registry, model_name
        token_buckets = one_two_five(max_model_len)

        def gauge(name, doc, prefix="vllm:"):
            return Gauge(prefix + name, doc, ["model_name"], registry=r).labels(m)

        def counter(name, doc):
            return Counter(f"vllm:{name}", doc, ["model_name"], registry=r).labels(m)

        def histogram(name, doc, buckets, prefix="vllm:"):
            return Histogram(prefix + name, doc, ["model_name"], buckets=buckets, registry=r).labels(m)

        self.running = gauge("num_requests_running", "Sequences in the running batch")
        self.waiting = gauge("num_requests_waiting", "Sequences waiting to be scheduled")
        waiting_by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Waiting sequences by reason: 'capacity' "
                                  "= waiting for batch slots or KV blocks, 'deferred' = waiting for a LoRA slot",
                                  ["model_name", "reason"], registry=r)
        self.waiting_capacity, self.waiting_deferred = (waiting_by_reason.labels(m, "capacity"),
                                                        waiting_by_reason.labels(m, "deferred"))
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1)")
        self.programs = gauge("compiled_programs", "XLA programs the engine built (compiled or loaded from the "
                                                   "persistent cache), warm-up included", prefix="jaxllm:")
        self.prefix_queries = counter("prefix_cache_queries", "Prefix cache lookups")
        self.prefix_hits = counter("prefix_cache_hits", "Prefix cache hits")
        self.preemptions = counter("num_preemptions", "Sequences preempted (their KV blocks freed, recomputed later)")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.iteration_tokens = histogram("iteration_tokens_total", "Tokens per engine step: prompt tokens computed "
                                          "and tokens generated", token_buckets)
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first generated token", LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between consecutive generated tokens",
                             LATENCY_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to the last token of a request",
                             REQUEST_TIME_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds", "Arrival to first scheduled",
                                    REQUEST_TIME_BUCKETS)
        self.inference_time = histogram("request_inference_time_seconds", "First scheduled to last token",
                                        REQUEST_TIME_BUCKETS)
        self.prefill_time = histogram("request_prefill_time_seconds", "First scheduled to first token",
                                      REQUEST_TIME_BUCKETS)
        self.decode_time = histogram("request_decode_time_seconds", "First token to last token",
                                     REQUEST_TIME_BUCKETS)
        self.request_prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per request", token_buckets)
        self.request_generation_tokens = histogram("request_generation_tokens", "Generated tokens per request",
                                                   token_buckets)
        self.params_n = histogram("request_params_n", "The n of each request", N_BUCKETS)
        self.params_max_tokens = histogram("request_params_max_tokens", "The max_tokens of each request",
                                           token_buckets)
        self.request_preemptions = histogram("request_num_preemptions", "Preemptions per finished request",
                                             PREEMPTION_BUCKETS)
        self.time_per_output_token = histogram("request_time_per_output_token_seconds", "Per finished request: its "
                                               "decode time over its tokens after the first", LATENCY_BUCKETS)
        self.max_generation_tokens = histogram("request_max_num_generation_tokens", "Per finished request: the "
                                               "most tokens one of its sequences generated", token_buckets)
        self.step_seqs = histogram("iteration_num_seqs", "Sequences that produced a token in one engine step",
                                   BATCH_BUCKETS, prefix="jaxllm:")
        self._success = Counter("vllm:request_success", "Finished requests by finish reason",
                                ["model_name", "finished_reason"], registry=r)
        self.admission_rejections = Counter("vllm:admission_rejections", "Requests refused because the queue is "
                                            "full, by reason", ["model_name", "reason"], registry=r).labels(m, QUEUE_FULL)
        self._model = m
        self._last = {"prefix_cache_queries": 0, "prefix_cache_hits": 0, "num_preemptions": 0,
                      "num_prompt_tokens_computed": 0}
        self.engine_stats: dict = {}  # the engine's stats after its last step
        self._spec: SpecDecodeCounters | None = None  # made at the first stats that carry spec_decode counts

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def describe_cache(self, cache_config) -> None:
        """cache_config_info: the KV cache's settings as labels of a gauge set to 1 (vLLM's info metric; its
        label names: num_gpu_blocks counts the usable blocks, the reserved null block left out)."""
        settings = {"block_size": str(cache_config.block_size), "num_gpu_blocks": str(cache_config.num_blocks - 1),
                    "enable_prefix_caching": str(cache_config.enable_prefix_caching)}
        Gauge("vllm:cache_config_info", "The KV cache's settings", ["model_name", *settings],
              registry=self.registry).labels(self._model, *settings.values()).set(1)

    def record_engine(self, stats: dict, generated: int = 0) -> None:
        """After a step (or at start-up): gauges, and counters as the increase of the engine's totals; one
        iteration_tokens_total sample when the step computed or generated tokens."""
        self.engine_stats = stats
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.waiting_deferred.set(stats["num_waiting_for_lora"])
        self.waiting_capacity.set(stats["num_waiting"] - stats["num_waiting_for_lora"])
        self.kv_usage.set(stats["kv_cache_usage"])
        self.programs.set(stats["num_compiled_programs"])
        new = {key: max(0, stats[key] - last) for key, last in self._last.items()}
        self._last = {key: stats[key] for key in self._last}
        self.prefix_queries.inc(new["prefix_cache_queries"])
        self.prefix_hits.inc(new["prefix_cache_hits"])
        self.preemptions.inc(new["num_preemptions"])
        if new["num_prompt_tokens_computed"] or generated:
            self.iteration_tokens.observe(new["num_prompt_tokens_computed"] + generated)
        if "spec_decode_num_drafts" in stats:
            if self._spec is None:
                self._spec = SpecDecodeCounters(self.registry, self._model,
                                                len(stats["spec_decode_num_accepted_tokens_per_pos"]))
            self._spec.record(stats)

    def record_request(self, params) -> None:
        """A request accepted: its parameters."""
        self.params_n.observe(params.n)
        if params.max_tokens is not None:
            self.params_max_tokens.observe(params.max_tokens)

    def record_output(self, output: RequestOutput, tracker: "RequestTracker", now: float) -> None:
        """Account for one delta output of a request."""
        new_tokens = sum(len(c.token_ids) for c in output.outputs)
        self.generation_tokens.inc(new_tokens)
        tracker.num_generated += new_tokens
        for completion in output.outputs:
            tracker.per_sample[completion.index] = tracker.per_sample.get(completion.index, 0) + len(
                completion.token_ids)
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
            self._record_finish(output, tracker, now)

    def _record_finish(self, output: RequestOutput, tracker: "RequestTracker", now: float) -> None:
        times = output.metrics
        self.prompt_tokens.inc(len(output.prompt_token_ids))
        self.request_prompt_tokens.observe(len(output.prompt_token_ids))
        self.request_generation_tokens.observe(tracker.num_generated)
        self.request_preemptions.observe(times.num_preemptions)
        self.max_generation_tokens.observe(max(tracker.per_sample.values(), default=0))
        self.e2e.observe(now - tracker.arrival_time)
        if times.first_token_time is not None and times.last_token_time is not None:
            decode_tokens = max(tracker.num_generated - 1, 1)
            self.time_per_output_token.observe((times.last_token_time - times.first_token_time) / decode_tokens)
        for histogram, start, end in ((self.queue_time, times.arrival_time, times.first_scheduled_time),
                                      (self.inference_time, times.first_scheduled_time, times.last_token_time),
                                      (self.prefill_time, times.first_scheduled_time, times.first_token_time),
                                      (self.decode_time, times.first_token_time, times.last_token_time)):
            if start is not None and end is not None:
                histogram.observe(max(0.0, end - start))


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
    """Per-request counts and times the metrics need (the engine's clock: time.monotonic)."""

    __slots__ = ("arrival_time", "last_token_time", "num_generated", "per_sample")

    def __init__(self, arrival_time: float):
        self.arrival_time = arrival_time
        self.last_token_time: float | None = None
        self.num_generated = 0
        self.per_sample: dict[int, int] = {}  # tokens per sample index
