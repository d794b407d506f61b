"""`jaxllm serve` on two processes (jax.distributed on CPU): process 0 serves HTTP and broadcasts each step's new
requests; process 1 follows (jaxllm/engine/multiprocess_engine.py). Concurrent requests get the tokens one process
gives, and stopping the server releases the follower."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.fake_devices import child_environment
from tests.server.conftest import SERVED_NAME, ServerProcess, free_port

FLAGS = ("--max-num-seqs", "4", "--max-model-len", "128", "--max-num-batched-tokens", "32", "--no-warmup")
PROMPTS = ["The capital of France is", "One, two, three,", "def fibonacci(n):", "Hello"]


@pytest.mark.slow
def test_two_processes_serve_the_tokens_of_one(tiny_model_with_tokenizer, tmp_path):
    from jaxllm.llm import LLM
    from jaxllm.sampling_params import SamplingParams

    address = f"127.0.0.1:{free_port()}"
    group = ("--num-processes", "2", "--coordinator-address", address)
    follower_log = open(tmp_path / "follower.log", "w")
    follower = subprocess.Popen(
        [sys.executable, "-m", "jaxllm.entrypoints.cli", "serve", str(tiny_model_with_tokenizer), *FLAGS, *group,
         "--process-id", "1", "--log-level", "warning"],
        stdout=follower_log, stderr=subprocess.STDOUT, env=child_environment())
    try:
        leader = ServerProcess(tiny_model_with_tokenizer, tmp_path / "leader.log", *FLAGS, *group,
                               "--process-id", "0", via_cli=True)
        try:
            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                served = list(pool.map(lambda prompt: complete(leader.url, prompt), PROMPTS))
        finally:
            assert leader.stop() == 0, leader.log()
        assert follower.wait(timeout=60) == 0, (tmp_path / "follower.log").read_text()[-3000:]
    finally:
        if follower.poll() is None:
            follower.kill()
        follower_log.close()

    llm = LLM(str(tiny_model_with_tokenizer), max_num_seqs=4, max_model_len=128, max_num_batched_tokens=32)
    alone = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert served == [output.outputs[0].text for output in alone]


def complete(url: str, prompt: str) -> str:
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    response = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


@pytest.mark.slow
@pytest.mark.parametrize("request_after_loss", [True, False], ids=["noticed", "unnoticed"])
def test_the_leader_stops_cleanly_after_its_follower_died(tiny_model_with_tokenizer, tmp_path, request_after_loss):
    """A follower killed: requests fail with 503 (the engine loop is dead), and stopping process 0 ends it at once
    with one line naming the failure instead of JAX's exit-time shutdown waiting for the lost process."""
    address = f"127.0.0.1:{free_port()}"
    group = ("--num-processes", "2", "--coordinator-address", address)
    follower = subprocess.Popen(
        [sys.executable, "-m", "jaxllm.entrypoints.cli", "serve", str(tiny_model_with_tokenizer), *FLAGS, *group,
         "--process-id", "1", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_environment())
    try:
        leader = ServerProcess(tiny_model_with_tokenizer, tmp_path / "leader.log", *FLAGS, *group,
                               "--process-id", "0", via_cli=True)
        complete(leader.url, "Hello")
    finally:
        follower.kill()
        follower.wait()
    if request_after_loss:
        reply = httpx.post(leader.url + "/v1/completions", timeout=60,
                           json={"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 2})
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "engine_dead"
    assert leader.stop(timeout=30) == 1, leader.log()
    assert "jaxllm: error: the processes serving together lost one" in (tmp_path / "leader.log").read_text()

