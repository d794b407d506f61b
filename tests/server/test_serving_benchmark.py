"""The serving benchmark (jaxllm/benchmarks/serving.py): its arrival schedule and metric arithmetic on their own,
its stream parsing against canned responses, `jaxllm bench serve`'s flags, and whole runs against a real server
subprocess."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import numpy as np
import pytest

from jaxllm.benchmarks.serving import (
    BenchmarkRequest,
    RequestRecord,
    arrival_times,
    compute_metrics,
    main,
    make_requests,
    run_benchmark,
    server_url,
)
from jaxllm.entrypoints.cli import build_parser
from jaxllm.entrypoints.cli import main as jaxllm_main
from tests.tiny_models import TOKENIZER_MODEL_CONFIG
from tests.server.helpers import MODEL

VOCAB = TOKENIZER_MODEL_CONFIG["vocab_size"]
SERVER_MAX_MODEL_LEN = 256  # the shared `server` fixture's --max-model-len
METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


# ----------------------------------------------------------------------------------------------- schedule

def test_arrival_schedule_is_seeded_and_poisson():
    rate, n = 50.0, 20001
    times = arrival_times(n, rate, seed=3)
    np.testing.assert_array_equal(times, arrival_times(n, rate, seed=3))
    assert not np.array_equal(times, arrival_times(n, rate, seed=4))
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps: std == mean
    regular = np.diff(arrival_times(n, rate, seed=3, burstiness=4.0))
    assert regular.mean() == pytest.approx(1 / rate, rel=0.03)
    assert regular.std() / regular.mean() == pytest.approx(0.5, rel=0.05)  # gamma shape k: cv = 1 / sqrt(k)
    np.testing.assert_array_equal(arrival_times(5, float("inf")), np.zeros(5))
    with pytest.raises(ValueError):
        arrival_times(5, 0.0)


# ----------------------------------------------------------------------------------------------- metrics

def _record(index, ttft, e2el, itl, output_tokens, prompt_tokens, error=None) -> RequestRecord:
    return RequestRecord(index, max_tokens=output_tokens, prompt_tokens=prompt_tokens, success=error is None,
                         error=error, ttft_s=ttft, e2el_s=e2el, itl_s=itl, output_tokens=output_tokens)


def test_metrics_from_hand_made_timestamps():
    records = [_record(0, 0.100, 0.500, [0.1, 0.1, 0.2], 4, 10),  # TPOT (0.5 - 0.1) / 3
               _record(1, 0.200, 0.300, [0.1], 2, 6),  # TPOT 0.1
               _record(2, 0.050, 0.050, [], 1, 3),  # one token: no TPOT, no ITL
               _record(3, None, None, [], 0, 50, error="HTTP 400: too long"),
               _record(4, 0.010, None, [], 0, 50, error="error chunk: engine died")]
    s = compute_metrics(records, duration_s=2.0)
    assert (s["num_requests"], s["completed"], s["failed"]) == (5, 3, 2)
    assert s["errors"] == {"HTTP 400: too long": 1, "error chunk: engine died": 1}
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (19, 7)  # failed requests not counted
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_throughput"] == pytest.approx(3.5)
    assert s["total_token_throughput"] == pytest.approx(13.0)
    assert s["ttft_ms"] == pytest.approx({"mean": 350 / 3, "p50": 100.0, "p90": 180.0, "p99": 198.0})
    assert s["tpot_ms"] == pytest.approx({"mean": (400 / 3 + 100) / 2, "p50": (400 / 3 + 100) / 2,
                                          "p90": 100 + 0.9 * 100 / 3, "p99": 100 + 0.99 * 100 / 3})
    assert s["itl_ms"] == pytest.approx({"mean": 125.0, "p50": 100.0, "p90": 170.0, "p99": 197.0})
    assert s["e2el_ms"] == pytest.approx({"mean": 850 / 3, "p50": 300.0, "p90": 460.0, "p99": 496.0})
    assert records[0].tpot_s == pytest.approx(0.4 / 3) and records[2].tpot_s is None

    nothing = compute_metrics(records[3:], duration_s=0.0)
    assert nothing["completed"] == 0 and nothing["request_throughput"] is None
    assert all(value is None for key in METRICS for value in nothing[key].values())


# ----------------------------------------------------------------------------------------------- stream parsing

def _sse(*events) -> bytes:
    return b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events)


def _chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": None}]}


CANNED = {  # prompt -> (status, body)
    "no usage": (200, _sse(_chunk("a"), _chunk("b"), _chunk("c"), "[DONE]")),
    "with usage": (200, _sse(_chunk("ab"), _chunk(""), {"choices": [], "usage": {"prompt_tokens": 7,
                                                                                  "completion_tokens": 5}},
                             "[DONE]")),
    "error chunk": (200, _sse(_chunk("a"), {"error": {"message": "the engine loop died", "code": 503}}, "[DONE]")),
    "cut off": (200, _sse(_chunk("a"), _chunk("b"))),
    "no tokens": (200, _sse({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 0}}, "[DONE]")),
    "http error": (400, json.dumps({"error": {"message": "prompt is too long", "type": "BadRequestError"}}).encode()),
    "bad json": (200, b"data: {not json\n\n"),
}


def test_stream_parsing_and_failure_kinds():
    def handler(request: httpx.Request) -> httpx.Response:
        status, body = CANNED[json.loads(request.content)["prompt"]]
        return httpx.Response(status, content=body, headers={"content-type": "text/event-stream"})

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await run_benchmark([BenchmarkRequest(p, 5) for p in CANNED], base_url="http://mock",
                                       model="m", client=client)

    result = asyncio.run(run())
    records = dict(zip(CANNED, result["requests"]))
    assert result["summary"]["completed"] == 2 and result["summary"]["failed"] == 5
    no_usage, with_usage = records["no usage"], records["with usage"]
    assert no_usage["success"] and no_usage["output_tokens"] == 3 and not no_usage["usage_reported"]
    assert len(no_usage["itl_s"]) == 2
    assert with_usage["success"] and with_usage["output_tokens"] == 5 and with_usage["prompt_tokens"] == 7
    assert records["error chunk"]["error"] == "error chunk: the engine loop died"
    assert records["cut off"]["error"] == "the stream ended without [DONE]"
    assert records["no tokens"]["error"] == "the stream carried no tokens"
    assert records["http error"]["error"] == "HTTP 400: prompt is too long"
    assert records["bad json"]["error"].startswith("JSONDecodeError")


# ----------------------------------------------------------------------------------------------- real server

def _check_run(result: dict, requests: list[BenchmarkRequest]) -> None:
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (len(requests), 0), s["errors"]
    assert s["total_output_tokens"] == sum(r.max_tokens for r in requests)  # ignore_eos: every token generated
    for record, request in zip(result["requests"], requests):
        assert record["usage_reported"] and record["output_tokens"] == request.max_tokens
        assert record["token_chunks"] == request.max_tokens
        if request.prompt_len is not None:
            assert record["prompt_tokens"] == request.prompt_len
        assert 0 < record["ttft_s"] <= record["e2el_s"]
        assert len(record["itl_s"]) == record["output_tokens"] - 1
        assert record["ttft_s"] + sum(record["itl_s"]) <= record["e2el_s"]
    for key in METRICS:
        assert s[key]["p50"] <= s[key]["p90"] <= s[key]["p99"]
    assert s["output_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration_s"])


def _max_in_flight(records: list[dict]) -> int:
    spans = [(r["start_s"], r["start_s"] + r["e2el_s"]) for r in records]
    return max(sum(start <= t < end for start, end in spans) for t, _ in spans)


def test_all_at_once_with_max_concurrency(server):
    # short prompts and outputs (one KV block each) keep the number of step shapes the server compiles small
    requests = make_requests("random", 8, input_len=6, output_len=6, range_ratio=0.3, vocab_size=VOCAB, seed=0)
    assert len({r.max_tokens for r in requests}) > 1
    warmup = make_requests("random", 4, input_len=6, output_len=6, range_ratio=0.3, vocab_size=VOCAB, seed=1)
    result = asyncio.run(run_benchmark(requests, base_url=server.url, max_concurrency=4, warmup_requests=warmup))
    assert result["model"] == MODEL  # the server's model, looked up
    assert result["warmup"] == {"completed": 4, "failed": 0, "errors": {}}
    _check_run(result, requests)
    assert _max_in_flight(result["requests"]) == 4


def test_poisson_rate_with_text_prompts(server):
    rate, seed = 20.0, 5
    requests = make_requests("sentences", 8, input_len=5, output_len=5, seed=seed)
    result = asyncio.run(run_benchmark(requests, base_url=server.url, request_rate=rate, seed=seed))
    _check_run(result, requests)
    scheduled = arrival_times(8, rate, seed)
    assert [r["scheduled_s"] for r in result["requests"]] == pytest.approx(scheduled.tolist())
    assert all(r["start_s"] >= r["scheduled_s"] for r in result["requests"])  # never sent early
    assert result["summary"]["duration_s"] > scheduled[-1]


def test_failed_requests_are_counted_and_explained(server):
    good = make_requests("random", 6, input_len=6, output_len=4, vocab_size=VOCAB, seed=2)
    too_long = make_requests("random", 2, input_len=SERVER_MAX_MODEL_LEN + 10, output_len=4, vocab_size=VOCAB,
                             seed=3)
    requests = [good[0], too_long[0], *good[1:4], too_long[1], *good[4:]]
    result = asyncio.run(run_benchmark(requests, base_url=server.url, max_concurrency=4))
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (6, 2)
    assert s["total_output_tokens"] == 6 * 4
    for index in (1, 5):
        record = result["requests"][index]
        assert not record["success"] and record["error"].startswith("HTTP 400: ")
        assert str(SERVER_MAX_MODEL_LEN) in record["error"]  # the server's reason, not a generic one
    assert list(s["errors"].values()) in ([2], [1, 1])

    wrong_model = asyncio.run(run_benchmark(good[:2], base_url=server.url, model="no-such-model"))
    assert wrong_model["summary"]["completed"] == 0 and wrong_model["summary"]["failed"] == 2
    assert all(r["error"].startswith("HTTP 404: ") and "no-such-model" in r["error"]
               for r in wrong_model["requests"])


def test_cli_writes_json(server, tmp_path, capsys):
    out = tmp_path / "serving.json"
    rc = main(["--base-url", server.url, "--num-prompts", "4", "--input-len", "6", "--output-len", "5",
               "--max-concurrency", "2", "--num-warmup", "2", "--output-json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "Successful requests:" in printed and "P99 ITL (ms):" in printed
    data = json.loads(out.read_text())
    assert set(data) >= {"date", "args", "model", "summary", "warmup", "requests"}
    assert data["args"]["request_rate"] == "inf" and data["args"]["max_concurrency"] == 2
    assert data["summary"]["completed"] == 4 and data["summary"]["total_output_tokens"] == 20
    assert len(data["requests"]) == 4 and data["warmup"]["completed"] == 2
    assert data["base_url"] == server.url
    # the same figures under vLLM's result keys
    assert (data["completed"], data["duration"]) == (4, data["summary"]["duration_s"])
    assert data["median_ttft_ms"] == data["summary"]["ttft_ms"]["p50"]


# ----------------------------------------------------------------------------------------------- jaxllm bench serve

def test_bench_serve_takes_vllms_flags():
    args = build_parser().parse_args([
        "bench", "serve", "--host", "10.0.0.5", "--port", "8123", "--model", "m", "--endpoint", "/v1/completions",
        "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "16", "--num-prompts", "5",
        "--request-rate", "2.5", "--max-concurrency", "3", "--seed", "9", "--num-warmups", "0",
        "--output-json", "a.json", "--save-result", "--result-dir", "results", "--result-filename", "b.json"])
    assert (args.command, args.bench_command, args.model, args.endpoint) == ("bench", "serve", "m",
                                                                               "/v1/completions")
    assert (args.dataset_name, args.input_len, args.output_len, args.num_prompts) == ("random", 32, 16, 5)
    assert (args.request_rate, args.max_concurrency, args.seed, args.num_warmup) == (2.5, 3, 9, 0)
    assert (args.output_json, args.save_result, args.result_dir, args.result_filename) == ("a.json", True,
                                                                                           "results", "b.json")
    assert server_url(args) == "http://10.0.0.5:8123"
    defaults = build_parser().parse_args(["bench", "serve"])
    assert defaults.request_rate == float("inf") and defaults.max_concurrency is None
    assert server_url(defaults) == "http://127.0.0.1:8000" and not defaults.save_result
    assert server_url(build_parser().parse_args(["bench", "serve", "--base-url", "http://h:1", "--port", "2"])) \
        == "http://h:1"  # --base-url wins, as in vLLM
    assert server_url(build_parser().parse_args(["bench", "serve", "--host", "::1"])) == "http://[::1]:8000"


@pytest.mark.parametrize("name", ["sharegpt", "sonnet", "hf"])
def test_bench_serve_refuses_other_datasets_by_name(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["bench", "serve", "--dataset-name", name])
    assert exit_info.value.code == 2
    assert (f"argument --dataset-name: dataset {name!r} is not available: choose random or sentences"
            in capsys.readouterr().err)


def test_bench_serve_result_dir_needs_save_result(capsys):
    assert jaxllm_main(["bench", "serve", "--result-dir", "somewhere"]) == 2
    assert "add --save-result" in capsys.readouterr().err


def test_bench_serve_against_the_server(server, tmp_path, capsys):
    rc = jaxllm_main(["bench", "serve", "--host", "127.0.0.1", "--port", str(server.port), "--endpoint",
                      "/v1/completions", "--dataset-name", "random", "--random-input-len", "6",
                      "--random-output-len", "4", "--num-prompts", "3", "--max-concurrency", "2", "--num-warmups",
                      "1", "--seed", "3", "--save-result", "--result-dir", str(tmp_path)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    # vLLM's summary lines, its labels and layout (label padded to 40 columns, then the value)
    values = dict(re.findall(r"^(\S.{39}) (\S+)$", printed, re.MULTILINE))
    values = {label.strip(): value for label, value in values.items()}
    assert values["Successful requests:"] == "3" and values["Failed requests:"] == "0"
    assert values["Maximum request concurrency:"] == "2" and "Request rate configured (RPS):" not in values
    assert (values["Total input tokens:"], values["Total generated tokens:"]) == ("18", "12")
    for label in ("Benchmark duration (s):", "Request throughput (req/s):", "Output token throughput (tok/s):",
                  "Total token throughput (tok/s):", *(f"{stat} {metric} (ms):" for metric in ("TTFT", "TPOT", "ITL")
                                                      for stat in ("Mean", "Median", "P99"))):
        assert float(values[label]) > 0, label
    assert printed.splitlines()[0] == "{:=^50}".format(" Serving Benchmark Result ")

    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and re.fullmatch(r"openai-infqps-concurrency2-tiny-\d{8}-\d{6}\.json", files[0].name)
    data = json.loads(files[0].read_text())
    s = data["summary"]
    assert (data["completed"], data["failed"], data["num_prompts"]) == (3, 0, 3)
    assert (data["total_input_tokens"], data["total_output_tokens"]) == (18, 12)
    assert (data["request_rate"], data["max_concurrency"], data["model"]) == ("inf", 2, MODEL)
    assert data["base_url"] == server.url and data["endpoint"] == "/v1/completions"
    assert data["duration"] == s["duration_s"] and data["request_throughput"] == pytest.approx(3 / data["duration"])
    assert data["output_throughput"] == pytest.approx(12 / data["duration"])
    for metric in ("ttft", "tpot", "itl", "e2el"):
        stats = s[f"{metric}_ms"]
        assert data[f"mean_{metric}_ms"] == stats["mean"] and data[f"median_{metric}_ms"] == stats["p50"]
        assert data[f"p99_{metric}_ms"] == stats["p99"] > 0
    assert float(values["Median TTFT (ms):"]) == pytest.approx(data["median_ttft_ms"], abs=0.006)
    assert len(data["requests"]) == 3 and all(r["success"] for r in data["requests"])
    assert data["warmup"]["completed"] == 1
