"""Online serving benchmark against a running OpenAI-compatible server, as `vllm bench serve`.

Sends a fixed number of streaming completions (`stream: true`, `stream_options.include_usage`, `ignore_eos`, a
`max_tokens` per request) to `<base-url>/v1/completions` (`--base-url`, else `http://--host:--port`), with Poisson
arrivals at `--request-rate` requests per second (`inf`: all at once) and at most `--max-concurrency` requests in
flight, then reports vLLM's metrics:

    TTFT   time to first token: from sending the request to its first token chunk
    TPOT   time per output token after the first: (E2E - TTFT) / (output tokens - 1), requests with > 1 token
    ITL    inter-token latency: every gap between two successive token chunks of a request
    E2E    end-to-end latency: from sending the request to the end of its stream

each as mean, median (p50), p90 and p99 in milliseconds, plus request, output-token and total-token throughput
over the benchmark's wall time (first send to last response), printed in vLLM's layout. A request fails on an HTTP
error status, an error chunk in its stream, a stream that ends without `[DONE]` or without tokens, or any
exception; its message is recorded and the benchmark goes on. Output tokens are the usage chunk's
`completion_tokens` (token chunks counted when the server sends no usage). `--num-warmup` requests go first,
unmeasured, so first-use compiles stay out of the figures. `--output-json PATH` or `--save-result` (vLLM's
file name, in `--result-dir`) writes the arguments, the summary (also under vLLM's result keys: completed,
duration, request_throughput, median_ttft_ms, ...), the warm-up and every request's record. Needs httpx, which
only the `test` extra installs: `pip install httpx`.

    jaxllm bench serve --num-prompts 100 --request-rate 4 --max-concurrency 16 --output-json out.json
    python benchmarks/serving.py ...          # the same flags
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from jaxllm.benchmarks.datasets import dataset_name_arg, random_requests, sample_lengths

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
DEFAULT_BASE_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
DATASETS = ("random", "sentences")
DEFAULT_ENDPOINT = "/v1/completions"
PERCENTILES = (50, 90, 99)
DEFAULT_VOCAB_SIZE = 32000  # inside the vocabulary of every supported model family (Llama 2's is the smallest)


class BenchmarkError(RuntimeError):
    """The benchmark cannot run at all (no httpx, server unreachable, bad arguments)."""


# ----------------------------------------------------------------------------------------------- workload

@dataclasses.dataclass
class BenchmarkRequest:
    prompt: str | list[int]  # text, or token ids (sent as `prompt: [ids]`)
    max_tokens: int
    prompt_len: int | None = None  # prompt tokens when known before sending; the usage chunk reports it anyway


def _check_workload(num_prompts: int, input_len: int, output_len: int, range_ratio: float) -> None:
    if num_prompts < 0 or input_len < 1 or output_len < 1:
        raise ValueError("num_prompts must be >= 0, input_len and output_len >= 1")
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")


_WORD_TEXT = """the a of and to in is was that for on with as by at from his her their its this which an be are have
had not but were or one all been who would she he they we there when what so some them other into more time only
new could very after first two over also then like well made most where people way down just than because any
many those through long day water great little world old year back house light city river mountain garden
morning evening road window letter story music market winter summer island forest bridge village teacher doctor
friend family child ship train paper table door small quiet bright slow early late open cold warm green blue
white dark heavy strong clear simple careful walked found carried wrote painted opened watched listened built
remembered followed answered noticed returned waited"""
WORDS = _WORD_TEXT.split()


def sentence_requests(num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                      seed: int) -> list[tuple[str, int]]:
    """(text prompt, max_tokens) per request: sentences of 6-12 words drawn from a fixed word list, input_len
    words in all (so roughly 1-1.5 tokens per word with any tokenizer); lengths vary as in datasets.random_requests.
    Every prompt is drawn independently, so prompts share no prefix for the server's prefix cache to reuse."""
    _check_workload(num_prompts, input_len, output_len, range_ratio)
    rng = np.random.default_rng(seed)
    in_lens = sample_lengths(rng, input_len, range_ratio, num_prompts)
    out_lens = sample_lengths(rng, output_len, range_ratio, num_prompts)
    prompts = []
    for n in in_lens:
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), n)]
        sentences, start = [], 0
        while start < len(words):
            stop = start + int(rng.integers(6, 13))
            sentence = words[start:stop]
            sentences.append(" ".join([sentence[0].capitalize(), *sentence[1:]]) + ".")
            start = stop
        prompts.append(" ".join(sentences))
    return list(zip(prompts, (int(m) for m in out_lens)))


def make_requests(dataset: str, num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                  vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0) -> list[BenchmarkRequest]:
    """The workload of one of the datasets: 'random' (token-id prompts of input_len tokens) or 'sentences' (text
    prompts of input_len words)."""
    if num_prompts == 0:
        return []
    if dataset == "random":
        return [BenchmarkRequest(ids, m, len(ids))
                for ids, m in random_requests(num_prompts, input_len, output_len, range_ratio, vocab_size, seed)]
    if dataset == "sentences":
        return [BenchmarkRequest(text, m) for text, m in sentence_requests(num_prompts, input_len, output_len,
                                                                           range_ratio, seed)]
    raise ValueError(f"unknown dataset {dataset!r}: choose 'random' or 'sentences'")


def arrival_times(num_requests: int, request_rate: float, seed: int = 0, burstiness: float = 1.0) -> np.ndarray:
    """Send times in seconds after the start. The first request goes at 0; the gaps after it are drawn from a
    gamma distribution of mean 1 / request_rate and shape `burstiness` (1: exponential gaps, i.e. a Poisson
    process; smaller: burstier; larger: more regular). request_rate = inf sends everything at 0."""
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0 (inf for all at once), got {request_rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if num_requests <= 0:
        return np.zeros(0)
    if math.isinf(request_rate):
        return np.zeros(num_requests)
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (request_rate * burstiness), num_requests - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


# ----------------------------------------------------------------------------------------------- one request

@dataclasses.dataclass
class RequestRecord:
    """What happened to one request; times in seconds."""
    index: int
    max_tokens: int
    prompt_tokens: int | None = None  # from the usage chunk, else the dataset's prompt length
    success: bool = False
    error: str | None = None
    scheduled_s: float = 0.0  # its arrival time in the schedule
    start_s: float = 0.0  # when it was actually sent (after waiting for a concurrency slot), since the start
    ttft_s: float | None = None
    e2el_s: float | None = None
    itl_s: list[float] = dataclasses.field(default_factory=list)
    output_tokens: int = 0
    token_chunks: int = 0
    usage_reported: bool = False

    @property
    def tpot_s(self) -> float | None:
        if not self.success or self.output_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "tpot_s": self.tpot_s}


def _error_message(body: bytes) -> str:
    try:
        payload = json.loads(body)
        error = payload.get("error", payload) if isinstance(payload, dict) else payload
        return str(error.get("message", error) if isinstance(error, dict) else error)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:500] or "(empty body)"


def _exception_message(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


async def send_request(client, url: str, model: str, request: BenchmarkRequest, index: int = 0, *,
                       temperature: float = 0.0, t0: float | None = None) -> RequestRecord:
    """Stream one completion and time it. Never raises (except cancellation): failures end up in the record."""
    record = RequestRecord(index, request.max_tokens, request.prompt_len)
    payload = {"model": model, "prompt": request.prompt, "max_tokens": request.max_tokens,
               "temperature": temperature, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    record.start_s = start - (start if t0 is None else t0)
    last, done, usage = None, False, None
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {_error_message(await response.aread())}"
                return record
            async for line in response.aiter_lines():
                now = time.perf_counter()
                if not line.startswith("data:"):
                    continue  # event separators, SSE comments
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if chunk.get("error"):
                    error = chunk["error"]
                    record.error = f"error chunk: {error.get('message', error) if isinstance(error, dict) else error}"
                    return record
                if chunk.get("choices"):
                    if last is None:
                        record.ttft_s = now - start
                    else:
                        record.itl_s.append(now - last)
                    last = now
                    record.token_chunks += 1
                if chunk.get("usage"):
                    usage = chunk["usage"]
        record.e2el_s = time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - connection errors, timeouts, bad JSON: all are a failed request
        record.error = _exception_message(e)
        return record
    if not done:
        record.error = "the stream ended without [DONE]"
    elif record.token_chunks == 0:
        record.error = "the stream carried no tokens"
    else:
        record.success = True
    if usage is not None:
        record.usage_reported = True
        record.output_tokens = int(usage.get("completion_tokens", record.token_chunks))
        if usage.get("prompt_tokens") is not None:
            record.prompt_tokens = int(usage["prompt_tokens"])
    else:
        record.output_tokens = record.token_chunks
    return record


# ----------------------------------------------------------------------------------------------- metrics

def _stats_ms(values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float | None]:
    keys = ["mean", *(f"p{p:g}" for p in percentiles)]
    if not len(values_s):
        return dict.fromkeys(keys)
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    return dict(zip(keys, [float(ms.mean()), *(float(np.percentile(ms, p)) for p in percentiles)]))


def compute_metrics(records: Sequence[RequestRecord], duration_s: float,
                    percentiles: Sequence[float] = PERCENTILES) -> dict[str, Any]:
    """The summary of a run: counts, token totals and throughputs over duration_s, and mean/percentiles (ms) of
    TTFT, TPOT, ITL and E2E latency over the successful requests (TPOT over those with more than one token).
    Throughputs are None when duration_s is not positive; statistics of an empty set are None."""
    ok = [r for r in records if r.success]
    input_tokens = sum(r.prompt_tokens or 0 for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)

    def per_second(x: float) -> float | None:
        return x / duration_s if duration_s > 0 else None

    return {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": per_second(len(ok)),
        "output_throughput": per_second(output_tokens),
        "total_token_throughput": per_second(input_tokens + output_tokens),
        "ttft_ms": _stats_ms([r.ttft_s for r in ok], percentiles),
        "tpot_ms": _stats_ms([r.tpot_s for r in ok if r.tpot_s is not None], percentiles),
        "itl_ms": _stats_ms([gap for r in ok for gap in r.itl_s], percentiles),
        "e2el_ms": _stats_ms([r.e2el_s for r in ok], percentiles),
        "errors": dict(Counter(r.error for r in records if not r.success).most_common()),
    }


# ----------------------------------------------------------------------------------------------- the run

def _import_httpx():
    try:
        import httpx
    except ImportError:
        raise BenchmarkError("the serving benchmark needs httpx, which the main install does not include: "
                             "pip install httpx (or install jaxllm with the 'test' extra)") from None
    return httpx


def make_client(timeout_s: float | None = 3600.0):
    """An httpx.AsyncClient for the benchmark: no connection limit (the benchmark's own concurrency limit
    applies) and no proxies from the environment (the server is measured directly)."""
    httpx = _import_httpx()
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=min(timeout_s or 30.0, 30.0)),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
                             trust_env=False)


async def served_model(client, base_url: str) -> str:
    """The first model id the server lists at /v1/models."""
    try:
        response = await client.get(base_url.rstrip("/") + "/v1/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except Exception as e:  # noqa: BLE001 - anything here means no benchmark
        raise BenchmarkError(f"cannot list the models of {base_url} (is the server running?): "
                             f"{_exception_message(e)}") from None


async def _run_all(client, url: str, model: str, requests: Sequence[BenchmarkRequest], times: np.ndarray,
                   semaphore: asyncio.Semaphore | None, temperature: float) -> tuple[list[RequestRecord], float]:
    async def limited(index: int, request: BenchmarkRequest, t0: float) -> RequestRecord:
        if semaphore is None:
            return await send_request(client, url, model, request, index, temperature=temperature, t0=t0)
        async with semaphore:
            return await send_request(client, url, model, request, index, temperature=temperature, t0=t0)

    t0 = time.perf_counter()
    tasks = []
    for index, (request, at) in enumerate(zip(requests, times)):
        delay = t0 + float(at) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(limited(index, request, t0)))
    records = list(await asyncio.gather(*tasks))
    duration = time.perf_counter() - t0
    for record, at in zip(records, times):
        record.scheduled_s = float(at)
    return records, duration


async def run_benchmark(requests: Sequence[BenchmarkRequest], *, base_url: str = DEFAULT_BASE_URL,
                        endpoint: str = DEFAULT_ENDPOINT, model: str | None = None,
                        request_rate: float = math.inf, burstiness: float = 1.0, max_concurrency: int | None = None,
                        seed: int = 0, warmup_requests: Sequence[BenchmarkRequest] = (), temperature: float = 0.0,
                        percentiles: Sequence[float] = PERCENTILES, timeout_s: float | None = 3600.0,
                        client=None) -> dict[str, Any]:
    """Run the warm-up requests (all at once, within max_concurrency; not measured), then `requests` on the
    arrival schedule of (request_rate, burstiness, seed), at most max_concurrency in flight. `model` defaults to
    the server's first model. Pass `client` (an httpx.AsyncClient) to reuse or replace the transport.

    Returns {"model", "base_url", "endpoint", "request_rate", "burstiness", "max_concurrency",
    "summary": compute_metrics(...), "warmup": {"completed", "failed", "errors"},
    "requests": [RequestRecord.to_dict() per request, in order]}."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    times = arrival_times(len(requests), request_rate, seed, burstiness)
    own_client = client is None
    client = make_client(timeout_s) if own_client else client
    try:
        model = model or await served_model(client, base_url)
        url = base_url.rstrip("/") + endpoint
        semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        warm, _ = await _run_all(client, url, model, warmup_requests, np.zeros(len(warmup_requests)), semaphore,
                                 temperature)
        records, duration = await _run_all(client, url, model, requests, times, semaphore, temperature)
    finally:
        if own_client:
            await client.aclose()
    warm_ok = sum(r.success for r in warm)
    return {"model": model, "base_url": base_url, "endpoint": endpoint, "request_rate": request_rate,
            "burstiness": burstiness, "max_concurrency": max_concurrency,
            "summary": compute_metrics(records, duration, percentiles),
            "warmup": {"completed": warm_ok, "failed": len(warm) - warm_ok,
                       "errors": dict(Counter(r.error for r in warm if not r.success))},
            "requests": [r.to_dict() for r in records]}


# ----------------------------------------------------------------------------------------------- CLI

def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--base-url", default=None, help="the server's URL (default: http://HOST:PORT)")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help="the completions endpoint, under the URL")
    parser.add_argument("--model", default=None, help="model name to send (default: the server's first model)")
    parser.add_argument("--dataset-name", type=dataset_name_arg(DATASETS), default="random",
                        metavar="{" + ",".join(DATASETS) + "}",
                        help="random: random token-id prompts; sentences: text prompts from a word list")
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=128,
                        help="prompt length: tokens (random) or words (sentences)")
    parser.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=64,
                        help="max_tokens per request (EOS is ignored, so every request generates this many)")
    parser.add_argument("--range-ratio", "--random-range-ratio", dest="range_ratio", type=float, default=0.0,
                        help="lengths are uniform in [len * (1 - r), len * (1 + r)]")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help="random prompts use token ids below this (default fits every supported model)")
    parser.add_argument("--request-rate", type=float, default=math.inf,
                        help="requests per second, Poisson arrivals (default inf: all at once)")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="gamma shape of the inter-arrival gaps (1: Poisson)")
    parser.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    parser.add_argument("--num-warmup", "--num-warmups", dest="num_warmup", type=int, default=4,
                        help="unmeasured requests sent first, all at once within --max-concurrency (their own "
                             "prompts); as many as the concurrency compiles the batch shapes the run will reach")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0, help="seeds the prompts and the arrival schedule")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one request may take")
    parser.add_argument("--output-json", default=None, metavar="PATH",
                        help="write args, summary, warm-up and every request's record to this file")
    parser.add_argument("--save-result", action="store_true",
                        help="write the same to vLLM's file name, openai-{rate}qps[-concurrency{n}]-{model}-"
                             "{date}.json, in --result-dir")
    parser.add_argument("--result-dir", default=None, help="--save-result's directory (default: the current one)")
    parser.add_argument("--result-filename", default=None, help="--save-result's file name, instead of vLLM's")
    return parser


def server_url(args: argparse.Namespace) -> str:
    """--base-url, else http://--host:--port."""
    if args.base_url:
        return args.base_url
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address
    return f"http://{host}:{args.port}"


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The workload and the run the CLI arguments describe; returns run_benchmark's result plus 'date', 'args',
    'num_prompts' and the summary under vLLM's result keys (vllm_result_keys)."""
    if args.num_warmup < 0:
        raise ValueError("--num-warmup must be >= 0")
    if (args.result_dir or args.result_filename) and not args.save_result:
        raise ValueError("--result-dir and --result-filename name the file --save-result writes: add --save-result")
    workload = {"dataset": args.dataset_name, "input_len": args.input_len, "output_len": args.output_len,
                "range_ratio": args.range_ratio, "vocab_size": args.vocab_size}
    requests = make_requests(num_prompts=args.num_prompts, seed=args.seed, **workload)
    warmup = make_requests(num_prompts=args.num_warmup, seed=args.seed + 1, **workload)
    date = datetime.now(UTC).isoformat(timespec="seconds")
    result = asyncio.run(run_benchmark(requests, base_url=server_url(args), endpoint=args.endpoint,
                                       model=args.model, request_rate=args.request_rate, burstiness=args.burstiness,
                                       max_concurrency=args.max_concurrency, seed=args.seed, warmup_requests=warmup,
                                       temperature=args.temperature, timeout_s=args.timeout))
    return {"date": date, "args": vars(args), "num_prompts": args.num_prompts, **result,
            **vllm_result_keys(result["summary"])}


def vllm_result_keys(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary under the names vLLM's result file gives the same figures: completed, failed, duration,
    token totals, throughputs, and {mean,median,p90,p99}_{ttft,tpot,itl,e2el}_ms (median: the p50)."""
    keys = {"completed": summary["completed"], "failed": summary["failed"], "duration": summary["duration_s"]}
    keys.update({k: summary[k] for k in ("total_input_tokens", "total_output_tokens", "request_throughput",
                                         "output_throughput", "total_token_throughput")})
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat, value in summary[f"{metric}_ms"].items():
            keys[f"{'median' if stat == 'p50' else stat}_{metric}_ms"] = value
    return keys


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # 'inf' for --request-rate inf: keeps the file strict JSON
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json(result: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(_jsonable(result), f, indent=2, allow_nan=False)
        f.write("\n")


def result_paths(args: argparse.Namespace, result: dict[str, Any]) -> list[str]:
    """The files to write: --output-json, and with --save-result vLLM's name for the run (or --result-filename)
    in --result-dir (created if missing)."""
    paths = [args.output_json] if args.output_json else []
    if args.save_result:
        concurrency = "" if args.max_concurrency is None else f"-concurrency{args.max_concurrency}"
        model = result["model"].split("/")[-1]
        name = args.result_filename or (f"openai-{args.request_rate}qps{concurrency}-{model}-"
                                        f"{datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
        if args.result_dir:
            os.makedirs(args.result_dir, exist_ok=True)
            name = os.path.join(args.result_dir, name)
        paths.append(name)
    return paths


def format_summary(result: dict[str, Any]) -> str:
    """vLLM's summary block: counts, duration, token totals and throughputs, then mean, median, p90 and p99 of
    TTFT, TPOT, ITL and E2E latency (and the model, warm-up failures and errors, which vLLM does not print)."""
    s = result["summary"]

    def row(label: str, value) -> str:
        text = "n/a" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)
        return f"{label:<40} {text}"

    lines = ["{:=^50}".format(" Serving Benchmark Result "),
             row("Model:", result["model"]),
             row("Successful requests:", s["completed"]),
             row("Failed requests:", s["failed"])]
    if result.get("max_concurrency") is not None:
        lines.append(row("Maximum request concurrency:", result["max_concurrency"]))
    if math.isfinite(result.get("request_rate", math.inf)):
        lines.append(row("Request rate configured (RPS):", float(result["request_rate"])))
    lines += [row("Benchmark duration (s):", s["duration_s"]),
              row("Total input tokens:", s["total_input_tokens"]),
              row("Total generated tokens:", s["total_output_tokens"]),
              row("Request throughput (req/s):", s["request_throughput"]),
              row("Output token throughput (tok/s):", s["output_throughput"]),
              row("Total token throughput (tok/s):", s["total_token_throughput"])]
    for key, title, short in [("ttft_ms", "Time to First Token", "TTFT"),
                              ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT"),
                              ("itl_ms", "Inter-token Latency", "ITL"), ("e2el_ms", "End-to-end Latency", "E2EL")]:
        lines.append("{:-^50}".format(title))
        for stat, value in s[key].items():
            label = {"mean": "Mean", "p50": "Median"}.get(stat, stat.upper())
            lines.append(row(f"{label} {short} (ms):", value))
    warm = result.get("warmup")
    if warm and warm["failed"]:
        lines.append(f"Warm-up: {warm['failed']} of {warm['completed'] + warm['failed']} requests failed")
    if s["errors"]:
        lines.append("{:-^50}".format(" Errors "))
        lines += [f"{count} x {message}" for message, count in s["errors"].items()]
    lines.append("=" * 50)
    return "\n".join(lines)


def run_cli(args: argparse.Namespace) -> int:
    """Run, print the summary, write the result files: 0 when every measured request completed, 1 when some
    failed, 2 when the benchmark could not run."""
    try:
        result = run_from_args(args)
    except (BenchmarkError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(result), flush=True)
    for path in result_paths(args, result):
        write_json(result, path)
    return 0 if result["summary"]["failed"] == 0 else 1


EPILOG = "Exit status: 0 all requests completed, 1 some failed, 2 the benchmark could not run."


def main(argv: list[str] | None = None) -> int:
    """benchmarks/serving.py: the same flags as `jaxllm bench serve`."""
    parser = add_cli_args(argparse.ArgumentParser(prog="serving", description=__doc__.split("\n")[0],
                                                  epilog=EPILOG))
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
