"""LoRA adapters through the server: --lora-modules, the request's `model` picking one, /v1/models, runtime
loading behind --allow-runtime-lora-updating, and bad adapters refused at start-up and at run time.

One server (two adapters of different ranks, runtime updating on) serves most tests; a second one (LoRA on,
runtime updating off) shows the routes are absent without the flag. The reference is `jaxllm.LLM` run in this
process with the same adapters."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import openai
import pytest

from jaxllm.entrypoints.openai.errors import OpenAIError
from jaxllm.entrypoints.openai.serving_models import LoRAModule, ServedModels, parse_lora_module, \
    runtime_updating_allowed
from tests.fake_devices import child_environment
from tests.server.conftest import SERVED_NAME, free_port
from tests.server.helpers import client

ENGINE_FLAGS = ("--max-num-seqs", "4", "--max-model-len", "128", "--max-num-batched-tokens", "64")
LORA_FLAGS = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8")
PROMPT = "The capital of France is"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def adapters(tiny_model_with_tokenizer, tmp_path_factory):
    """Adapters of the tiny model: 'sql' (rank 4, attention only) and 'code' (rank 8, every module) are good;
    'pickled' holds only adapter_model.bin; 'wide' has rank 16, above the servers' --max-lora-rank 8."""
    from transformers import AutoModelForCausalLM

    from tests.lora.adapters import save_peft_adapter

    hf_model = AutoModelForCausalLM.from_pretrained(str(tiny_model_with_tokenizer)).eval()
    root = tmp_path_factory.mktemp("server-loras")
    paths = {
        "sql": save_peft_adapter(hf_model, root / "sql", rank=4, seed=1,
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])[0],
        "code": save_peft_adapter(hf_model, root / "code", rank=8, seed=2)[0],
        "wide": save_peft_adapter(hf_model, root / "wide", rank=16, seed=3)[0],
    }
    pickled = root / "pickled"
    pickled.mkdir()
    shutil.copy(paths["sql"] / "adapter_config.json", pickled)
    (pickled / "adapter_model.bin").write_bytes(b"not read")
    paths["pickled"] = pickled
    return {name: str(path) for name, path in paths.items()}


@pytest.fixture(scope="module")
def started(start_module_server, tiny_model_with_tokenizer, adapters):
    """(the LoRA server, the reference LLM and its outputs), the reference computed while the server starts."""
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(run_alone, tiny_model_with_tokenizer, adapters)
        code = json.dumps({"name": "code", "path": adapters["code"], "base_model_name": SERVED_NAME})
        server = start_module_server(*ENGINE_FLAGS, *LORA_FLAGS, "--lora-modules", f"sql={adapters['sql']}", code,
                                     "--allow-runtime-lora-updating")
        return server, *reference.result()


def run_alone(model, adapters):
    """(the LLM, model name -> what it generates for PROMPT greedily with that adapter, or none)."""
    from jaxllm import LLM, LoRARequest, SamplingParams

    llm = LLM(str(model), enable_lora=True, max_loras=2, max_lora_rank=8, max_num_seqs=4, max_model_len=128,
              max_num_batched_tokens=64)
    loras = {SERVED_NAME: None, "sql": LoRARequest("sql", 1, adapters["sql"]),
             "code": LoRARequest("code", 2, adapters["code"])}
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return llm, {name: llm.generate([PROMPT], params, lora_request=lora, use_tqdm=False)[0].outputs[0]
                 for name, lora in loras.items()}


@pytest.fixture(scope="module")
def lora_server(started):
    return started[0]


@pytest.fixture(scope="module")
def reference(started):
    return started[2]


def stream_completion(url: str, model: str) -> tuple[str, int, set[str]]:
    """(text, completion tokens, the `model` of every chunk) of one streamed greedy completion."""
    chunks = client(url).completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    text, tokens, models = "", 0, set()
    for chunk in chunks:
        models.add(chunk.model)
        text += "".join(choice.text for choice in chunk.choices)
        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
    return text, tokens, models


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def assert_openai_error(response: httpx.Response, status: int, *words: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    for word in words:
        assert word in error["message"], error
    return error


# ---------------------------------------------------------------------------------------------- serving adapters
@pytest.mark.slow
def test_concurrent_streams_match_each_model_alone(lora_server, reference):
    names = [SERVED_NAME, "sql", "code"]
    with ThreadPoolExecutor(len(names)) as pool:
        served = dict(zip(names, pool.map(lambda name: stream_completion(lora_server.url, name), names)))
    for name in names:
        text, tokens, models = served[name]
        assert (text, tokens) == (reference[name].text, len(reference[name].token_ids)), name
        assert models == {name}
    assert len({reference[name].text for name in names}) == 3, "the adapters should change the text"


@pytest.mark.slow
def test_chat_and_tokenize_take_an_adapter_name(lora_server):
    reply = client(lora_server.url).chat.completions.create(
        model="code", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0.0)
    assert reply.model == "code" and reply.choices[0].message.content is not None
    tokenized = post(lora_server.url, "/tokenize", {"model": "sql", "prompt": PROMPT})
    assert tokenized.status_code == 200 and tokenized.json()["count"] > 0


@pytest.mark.slow
def test_models_lists_adapters_with_parent(lora_server, adapters):
    cards = {card.id: card for card in client(lora_server.url).models.list().data}
    assert list(cards) == [SERVED_NAME, "sql", "code"]
    assert cards[SERVED_NAME].parent is None
    for name in ("sql", "code"):
        assert (cards[name].root, cards[name].parent) == (adapters[name], SERVED_NAME)


@pytest.mark.slow
def test_unknown_model_is_404_in_openai_shape(lora_server):
    body = {"model": "no-such-lora", "prompt": PROMPT, "max_tokens": 1}
    error = assert_openai_error(post(lora_server.url, "/v1/completions", body), 404, "no-such-lora", "'sql'")
    assert (error["param"], error["code"]) == ("model", "model_not_found")
    chat = {"model": "no-such-lora", "messages": [{"role": "user", "content": "x"}]}
    assert_openai_error(post(lora_server.url, "/v1/chat/completions", chat), 404, "no-such-lora")
    assert_openai_error(post(lora_server.url, "/tokenize", {"model": "no-such-lora", "prompt": "x"}), 404)
    with pytest.raises(openai.NotFoundError):
        client(lora_server.url).completions.create(model="no-such-lora", prompt=PROMPT, max_tokens=1)


# ---------------------------------------------------------------------------------------------- runtime updates
@pytest.mark.slow
def test_load_use_and_unload_at_runtime(lora_server, adapters, reference):
    url = lora_server.url
    loaded = post(url, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": adapters["sql"]})
    assert loaded.status_code == 200 and "late" in loaded.text
    assert "late" in [card.id for card in client(url).models.list().data]
    text, _, models = stream_completion(url, "late")
    assert text == reference["sql"].text and models == {"late"}  # the same files as 'sql'
    assert_openai_error(post(url, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": adapters["code"]}),
                        400, "already loaded")
    assert_openai_error(post(url, "/v1/load_lora_adapter", {"lora_name": SERVED_NAME,
                                                            "lora_path": adapters["code"]}), 400, "served model")

    unloaded = post(url, "/v1/unload_lora_adapter", {"lora_name": "late"})
    assert unloaded.status_code == 200 and "late" in unloaded.text
    assert_openai_error(post(url, "/v1/completions", {"model": "late", "prompt": "x"}), 404, "late")
    assert_openai_error(post(url, "/v1/unload_lora_adapter", {"lora_name": "late"}), 404, "late")
    assert "late" not in [card.id for card in client(url).models.list().data]

    again = post(url, "/v1/load_lora_adapter", {"lora_name": "later", "lora_path": adapters["code"]})
    assert again.status_code == 200 and _id_in(again.text) > _id_in(loaded.text)  # ids are never reused
    assert stream_completion(url, "later")[0] == reference["code"].text
    assert post(url, "/v1/unload_lora_adapter", {"lora_name": "later"}).status_code == 200


def _id_in(message: str) -> int:
    return int(message.rsplit("(id ", 1)[1].split(")", 1)[0])


@pytest.mark.slow
def test_bad_adapters_are_refused_at_runtime_load(lora_server, adapters, tmp_path):
    url = lora_server.url
    cases = {"pickled": ("adapter_model.bin", "pickled"), "wide": ("rank 16", "max_lora_rank"),
             str(tmp_path / "missing"): ("not a directory",)}
    for path, words in cases.items():
        body = {"lora_name": "bad", "lora_path": adapters.get(path, path)}
        error = assert_openai_error(post(url, "/v1/load_lora_adapter", body), 400, "'bad'", *words)
        assert error["param"] == "lora_path"
    assert_openai_error(post(url, "/v1/load_lora_adapter", {"lora_name": "bad"}), 400, "lora_path")
    assert_openai_error(post(url, "/v1/completions", {"model": "bad", "prompt": "x"}), 404)
    assert post(url, "/v1/completions", {"model": "sql", "prompt": "x", "max_tokens": 2}).status_code == 200


@pytest.mark.slow
def test_runtime_updating_is_off_without_the_flag(started):
    """The app without allow_runtime_lora_updating (in this process, over the reference's engine; the routes
    are absent, so the engine thread is never needed)."""
    from fastapi.testclient import TestClient

    from jaxllm.entrypoints.openai.api_server import build_app

    app = TestClient(build_app(started[1].engine, [SERVED_NAME]))
    assert_openai_error(app.post("/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": "/p"}), 404)
    assert_openai_error(app.post("/v1/unload_lora_adapter", json={"lora_name": "late"}), 404)
    assert [(card["id"], card["parent"]) for card in app.get("/v1/models").json()["data"]] == [(SERVED_NAME, None)]


def test_runtime_load_without_enable_lora_is_400():
    """No LoRA in the engine: the registry refuses before the engine is touched."""
    engine = SimpleNamespace(engine=SimpleNamespace(lora=None))
    with pytest.raises(OpenAIError) as caught:
        asyncio.run(ServedModels(engine, [SERVED_NAME]).load("late", "/some/adapter"))
    assert caught.value.status == 400 and "--enable-lora" in caught.value.message


def test_runtime_updating_flag_and_env(monkeypatch):
    monkeypatch.delenv("JAXLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    assert not runtime_updating_allowed(False) and runtime_updating_allowed(True)
    for value, allowed in (("1", True), ("true", True), ("True", True), ("0", False), ("", False)):
        monkeypatch.setenv("JAXLLM_ALLOW_RUNTIME_LORA_UPDATING", value)
        assert runtime_updating_allowed(False) is allowed, value


# ---------------------------------------------------------------------------------------------- start-up
def test_lora_modules_forms():
    assert parse_lora_module("a=/p/a") == LoRAModule("a", "/p/a")
    assert parse_lora_module('{"name": "b", "path": "/p/b", "base_model_name": "m"}') == LoRAModule("b", "/p/b", "m")
    for bad in ("no-equals", "=/p", '{"name": "x"}', '{"name": "x", "path": "/p", "rank": 4}', "{oops"):
        with pytest.raises(Exception):
            parse_lora_module(bad)


def serve(model, *flags: str) -> subprocess.Popen:
    """`jaxllm serve` that is expected to exit before serving (its output on stderr)."""
    cmd = [sys.executable, "-m", "jaxllm.entrypoints.cli", "serve", str(model), "--port", str(free_port()),
           "--served-model-name", SERVED_NAME, "--no-warmup", "--log-level", "warning", *ENGINE_FLAGS, *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=child_environment())


def assert_exits_with(process: subprocess.Popen, *words: str) -> None:
    output, _ = process.communicate(timeout=180)
    assert process.returncode != 0, output
    for word in words:
        assert word in output, output


@pytest.mark.slow
def test_bad_lora_modules_stop_the_server_at_start(tiny_model_with_tokenizer, adapters):
    started = [  # side by side: two load the model, one stops before
        (serve(tiny_model_with_tokenizer, *LORA_FLAGS, "--lora-modules", f"good={adapters['sql']}",
               f"pickled={adapters['pickled']}"), ("--lora-modules pickled=", "adapter_model.bin", "pickled")),
        (serve(tiny_model_with_tokenizer, *LORA_FLAGS, "--lora-modules", f"wide={adapters['wide']}"),
         ("--lora-modules wide=", "rank 16", "max_lora_rank")),
        (serve(tiny_model_with_tokenizer, "--lora-modules", f"sql={adapters['sql']}"),
         ("--lora-modules needs --enable-lora",)),
    ]
    for process, words in started:
        assert_exits_with(process, *words)


@pytest.mark.parametrize("flags, words", [
    ((*LORA_FLAGS, "--lora-modules", f"{SERVED_NAME}=/p"), "already a served model name"),
    ((*LORA_FLAGS, "--lora-modules", "sql=/p", "sql=/q"), "given twice"),
    ((*LORA_FLAGS, "--lora-modules", '{"name": "x", "path": "/p", "base_model_name": "other"}'), "'other'"),
    (("--lora-modules", "sql=/p"), "needs --enable-lora"),
])
def test_lora_module_flags_checked_before_loading(flags, words):
    """What run_server checks before it loads the model (its first step)."""
    from jaxllm.entrypoints.cli import build_parser
    from jaxllm.entrypoints.openai.api_server import check_lora_args

    args = build_parser().parse_args(["serve", "m", "--served-model-name", SERVED_NAME, *flags])
    with pytest.raises(ValueError, match=words):
        check_lora_args(args)


def test_malformed_lora_module_is_a_usage_error(capsys):
    from jaxllm.entrypoints.cli import build_parser

    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["serve", "m", "--lora-modules", "sql"])
    assert caught.value.code == 2 and "name=path" in capsys.readouterr().err
