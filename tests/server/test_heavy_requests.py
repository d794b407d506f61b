"""A heavy request does not slow the others: 10,000 stop strings on one stream leave a plain request beside it
within 2x of its latency alone (the stop strings' matcher costs per character, not per stop string, and is built
off the engine thread); beyond the server's stop limits a request is refused by name."""

from __future__ import annotations

import random
import statistics
import string
import threading
import time

import httpx
import pytest

from tests.server.helpers import MODEL

PLAIN = {"model": MODEL, "prompt": "The weather today", "max_tokens": 24, "ignore_eos": True, "temperature": 0}


def plain_latency(url: str, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.monotonic()
        assert httpx.post(url + "/v1/completions", json=PLAIN, timeout=120).status_code == 200
        times.append(time.monotonic() - start)
    return statistics.median(times)


@pytest.mark.slow
def test_ten_thousand_stop_strings_do_not_slow_a_plain_request(start_test_server):
    server = start_test_server("--max-num-seqs", "4", "--max-model-len", "512", "--max-num-batched-tokens", "128",
                               "--max-stop-strings", "10000", "--max-stop-bytes", "1000000", warmup=True)
    rng = random.Random(0)
    stops = ["".join(rng.choices(string.ascii_letters, k=8)) + "\x07" for _ in range(10000)]  # never generated
    alone = plain_latency(server.url)
    done = threading.Event()

    def heavy() -> None:
        body = {"model": MODEL, "prompt": "Tell a long story", "max_tokens": 480, "ignore_eos": True,
                "stream": True, "stop": stops}
        while not done.is_set():
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as reply:
                assert reply.status_code == 200
                for _ in reply.iter_lines():
                    pass

    thread = threading.Thread(target=heavy)
    thread.start()
    time.sleep(1.0)
    beside = plain_latency(server.url)
    done.set()
    thread.join(300)
    assert beside < 2 * alone, (alone, beside)


def test_stop_limits_are_refused_by_name(server):
    for stop, message in ((["x"] * 257, "stop: at most 256 strings (this server's limit), got 257"),
                          (["y" * 9000, "z" * 9000], "stop: at most 16384 bytes in all (this server's limit), got "
                                                     "18000")):
        reply = httpx.post(server.url + "/v1/completions", json={**PLAIN, "stop": stop}, timeout=60)
        assert reply.status_code == 400 and reply.json()["error"] == {
            "message": message, "type": "invalid_request_error", "param": "stop", "code": 400}
