"""Structured outputs through the server: response_format (json_object, json_schema), the structured_outputs extra
field and vLLM's guided_* fields, on chat and completions, streamed and not, with the openai client and LangChain;
every bad constraint is a 400 naming its field, and the server keeps serving.

The server runs a tiny random model: JSON is asked for without free whitespace where the API allows, and schemas
have finite languages (enums, booleans), so that outputs end with finish_reason "stop" and are checked whole; any
JSON object (an infinite language) is asked for in a vocabulary of a few JSON tokens (allowed_token_ids).
"""

from __future__ import annotations

import asyncio
import enum
import json
import re
import threading
from types import SimpleNamespace

import httpx
import jsonschema
import pytest

from jaxllm.entrypoints.openai.protocol import CompletionRequest
from jaxllm.entrypoints.openai.serving_completion import CompletionServing
from jaxllm.entrypoints.openai.tokenization import ServerTokenizer
from jaxllm.structured_outputs import params as params_module
from tests.blocked_packages import run_blocked
from tests.server.helpers import MODEL, EngineStub, client

pytestmark = pytest.mark.slow
xgr = pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"},
                                           "score": {"enum": [1, 2, 3]}},
          "required": ["answer", "sure", "score"], "additionalProperties": False}
COMPACT = {"disable_any_whitespace": True}
CHAT = [{"role": "user", "content": "Answer in JSON."}]


def check_json(text: str, schema: dict = SCHEMA) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": MODEL, "max_tokens": 80, **body}, timeout=120)


def chat(server, **body) -> dict:
    reply = post(server, "/v1/chat/completions", {"messages": CHAT, **body})
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    return choice


def completion(server, **body) -> dict:
    reply = post(server, "/v1/completions", {"prompt": "Reply:", **body})
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    return choice


@pytest.fixture(scope="module")
def compact_server(start_module_server):
    """JSON without free whitespace by default (vLLM's --structured-outputs-config): what a client that cannot
    ask for it per request (the openai client's response_format, LangChain) gets."""
    return start_module_server("--max-model-len", "256", "--structured-outputs-config",
                               '{"backend": "xgrammar", "disable_any_whitespace": true}')


def test_json_schema_response_format_with_the_openai_client(compact_server):
    openai_client = client(compact_server.url)
    for temperature in (0.0, 1.0):
        reply = openai_client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=80, temperature=temperature, seed=3,
            response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA,
                                                                    "strict": True}})
        assert reply.choices[0].finish_reason == "stop"
        check_json(reply.choices[0].message.content)
    reply = openai_client.completions.create(model=MODEL, prompt="Say:", max_tokens=20,
                                             extra_body={"structured_outputs": {"choice": ["a", "b"]}})
    assert reply.choices[0].text in ("a", "b")


def test_structured_outputs_field_on_chat_and_completions(server):
    check_json(chat(server, structured_outputs={"json": SCHEMA, **COMPACT})["message"]["content"])
    check_json(completion(server, structured_outputs={"json": SCHEMA, **COMPACT}, temperature=0.8, seed=1)["text"])
    assert re.fullmatch(r"[0-9]{2}-[ab]", chat(server, structured_outputs={"regex": "[0-9]{2}-[ab]"})
                        ["message"]["content"])
    assert completion(server, structured_outputs={"choice": ["left", "right"]})["text"] in ("left", "right")
    grammar = 'root ::= "<" [xy]+ ">"'
    assert re.fullmatch(r"<[xy]+>", chat(server, structured_outputs={"grammar": grammar},
                                         max_tokens=200)["message"]["content"])


def test_guided_fields_and_json_object(server):
    check_json(chat(server, guided_json=SCHEMA, guided_decoding_backend="xgrammar:disable-any-whitespace")
               ["message"]["content"])
    assert chat(server, guided_choice=["up", "down"])["message"]["content"] in ("up", "down")
    assert re.fullmatch(r"[a-c]{3}", completion(server, guided_regex="[a-c]{3}")["text"])


@pytest.fixture(scope="module")
def json_tokens(server) -> list[int]:
    """The ids of a few JSON tokens and the end-of-sequence token's: a vocabulary (allowed_token_ids) in which a
    random model's JSON object, whose language is infinite, ends soon. No ",": one key at most; the grammar always
    leaves one of them (a key's string closes with '"', then ':')."""
    def ids(text: str) -> list[int]:
        return httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False},
                          timeout=60).json()["tokens"]

    return [i for piece in ['{', '}', '"', ':', '1', '<|im_end|>'] for i in ids(piece)]


def test_json_object_is_an_object(server, json_tokens):
    for seed in range(3):
        body = {"response_format": {"type": "json_object"}, "allowed_token_ids": json_tokens, "temperature": 1.0,
                "seed": seed, "max_tokens": 150}
        assert isinstance(json.loads(chat(server, **body)["message"]["content"]), dict)
        assert isinstance(json.loads(completion(server, **body)["text"]), dict)


def test_structured_outputs_options_apply_to_another_fields_constraint(server):
    """A structured_outputs object without a constraint of its own lends its options to response_format's or a
    guided_* field's (vLLM merges them): what a client of the openai library sends to get compact JSON."""
    api = client(server.url)
    strict = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
    chats = api.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=80, n=3, seed=1,
                                        response_format=strict, extra_body={"structured_outputs": COMPACT}).choices
    completions = api.completions.create(model=MODEL, prompt="Reply:", max_tokens=80, n=3, seed=1, extra_body={
        "response_format": strict, "structured_outputs": COMPACT}).choices
    assert [c.finish_reason for c in chats + completions] == ["stop"] * 6
    for text in [c.message.content for c in chats] + [c.text for c in completions]:
        check_json(text)
    check_json(chat(server, guided_json=SCHEMA, structured_outputs=COMPACT)["message"]["content"])
    bad = post(server, "/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"},
                                           "structured_outputs": {"colour": 1}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "structured_outputs", bad.text
    assert "unknown field 'colour'" in bad.json()["error"]["message"]


def test_streamed_output_follows_the_schema(server):
    events = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": CHAT, "max_tokens": 80, "stream": True,
                            "structured_outputs": {"json": SCHEMA, **COMPACT}}) as reply:
        assert reply.status_code == 200
        events = [json.loads(line[6:]) for line in reply.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "stop"
    check_json(text)


@pytest.mark.parametrize("body, field, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "response_format", "objec"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "needs json_schema.schema"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs", "parenthesis"),
    ({"structured_outputs": {"grammar": "root ::= nothing"}}, "structured_outputs", "nothing"),
    ({"structured_outputs": {"jsonn": {}}}, "structured_outputs", "unknown field 'jsonn'"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "exactly one of"),
    ({"guided_json": {"type": "string", "pattern": "[a-"}}, "guided_json", "guided_json: "),
    ({"guided_regex": "a", "structured_outputs": {"choice": ["b"]}}, "structured_outputs",
     "only one structured-output constraint per request, got structured_outputs, guided_regex"),
    ({"guided_choice": ["a"], "guided_decoding_backend": "outlines"}, "guided_decoding_backend", "outlines"),
    ({"guided_json": {}, "guided_whitespace_pattern": r"\s*"}, "guided_json", "whitespace_pattern"),
])
def test_a_bad_constraint_is_a_400_naming_its_field(server, body, field, message):
    for path, prompt in (("/v1/chat/completions", {"messages": CHAT}), ("/v1/completions", {"prompt": "x"})):
        reply = post(server, path, {**prompt, **body})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == field and message in error["message"], error
    assert chat(server, structured_outputs={"choice": ["fine"]})["message"]["content"] == "fine"


def test_langchain_structured_output(compact_server, server, json_tokens):
    langchain_openai = pytest.importorskip("langchain_openai")
    from pydantic import BaseModel

    class Mood(str, enum.Enum):
        happy = "happy"
        sad = "sad"

    class Verdict(BaseModel):
        mood: Mood
        certain: bool

    llm = langchain_openai.ChatOpenAI(base_url=compact_server.url + "/v1", api_key="unused", model=MODEL,
                                      temperature=0, max_tokens=200, max_retries=0)
    for temperature in (0.0, 0.9):
        verdict = llm.bind(temperature=temperature).with_structured_output(Verdict, method="json_schema").invoke(
            "How do you feel?")
        assert isinstance(verdict, Verdict)
    # compact JSON asked per request, on a server without the default (vLLM's structured_outputs options)
    per_request = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model=MODEL,
                                              max_tokens=200, max_retries=0, seed=3,
                                              extra_body={"structured_outputs": COMPACT})
    out = per_request.with_structured_output(Verdict, method="json_schema", include_raw=True).invoke("How?")
    assert out["raw"].response_metadata["finish_reason"] == "stop" and isinstance(out["parsed"], Verdict)
    # json_mode: the schema is the prompt's business, the server enforces a JSON object; a random model closes one
    # soon in a vocabulary of a few JSON tokens
    json_mode = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model=MODEL,
                                            max_tokens=150, max_retries=0, seed=3,
                                            extra_body={"allowed_token_ids": json_tokens})
    out = json_mode.with_structured_output(None, method="json_mode", include_raw=True).invoke("Reply in JSON.")
    assert out["raw"].response_metadata["finish_reason"] == "stop" and isinstance(out["parsed"], dict)


# ------------------------------------------------------------------------- the serving layer, without a server
def test_the_constraint_is_parsed_on_a_tokenizer_worker_once(monkeypatch):
    """Off the event loop and the engine thread; the engine gets params already parsed."""
    threads = []
    parse = params_module._parse
    monkeypatch.setattr(params_module, "_parse", lambda *key: (threads.append(threading.current_thread().name),
                                                               parse(*key))[1])
    engine = EngineStub()
    serving = CompletionServing(engine, [MODEL], ServerTokenizer(SimpleNamespace()))  # a stand-in tokenizer
    request = CompletionRequest(prompt="x", structured_outputs={"regex": "[ab]+"})
    asyncio.run(serving.submit("r", [{"prompt_token_ids": [5]}], serving.sampling_params(request, 8, None)))
    engine.added[0][2].structured_outputs.parsed()  # what the engine's compile does first: parsed already
    assert len(threads) == 1 and threads[0].startswith("tokenize"), threads


def test_without_xgrammar_a_constrained_request_is_a_400_naming_the_package():
    result = run_blocked("""
import asyncio
from types import SimpleNamespace
from jaxllm.entrypoints.openai.errors import OpenAIError
from jaxllm.entrypoints.openai.protocol import CompletionRequest
from jaxllm.entrypoints.openai.serving_completion import CompletionServing
from jaxllm.entrypoints.openai.tokenization import ServerTokenizer
from tests.server.helpers import EngineStub
engine = EngineStub()
serving = CompletionServing(engine, ["tiny"], ServerTokenizer(SimpleNamespace()))
for body in ({"response_format": {"type": "json_object"}}, {}):
    request = CompletionRequest(prompt="x", **body)
    try:
        asyncio.run(serving.submit("r", [{"prompt_token_ids": [5]}], serving.sampling_params(request, 8, None)))
    except OpenAIError as e:
        print("ERROR", e.status, e.param, e.message)
print("submitted", len(engine.added))
""", names=("xgrammar",))
    assert result.returncode == 0, result.stderr
    assert "ERROR 400 response_format response_format: structured outputs (JSON schema, regex, choice, grammar) " \
           "needs the `xgrammar` package: pip install xgrammar" in result.stdout, result.stdout
    assert "submitted 1" in result.stdout  # the plain request, the server serves on
