"""Structured outputs through the server: response_format (json_object, json_schema), the structured_outputs extra
field and vLLM's guided_* fields, on chat and completions, streamed and not, with the openai client and LangChain;
every bad constraint is a 400 naming its field, and the server keeps serving.

The server runs a tiny random model: JSON is asked for without free whitespace where the API allows, and schemas
have finite languages (enums, booleans), so that outputs end with finish_reason "stop" and are checked whole.
"""

from __future__ import annotations

import enum
import json
import re

import httpx
import jsonschema
import openai
import pytest

from tests.server.helpers import MODEL, client

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
def compact_server(start_server):
    """JSON without free whitespace by default (vLLM's --structured-outputs-config): what a client that cannot
    ask for it per request (the openai client's response_format, LangChain) gets."""
    return start_server("--max-model-len", "256", "--structured-outputs-config",
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
    reply = post(server, "/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"},
                                                  "max_tokens": 60})
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:  # a random model may write an endless object: what it wrote is a JSON object's beginning
        assert choice["message"]["content"].lstrip().startswith("{")


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


def test_langchain_structured_output(compact_server):
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
    # json_mode: the schema is the prompt's business; the server enforces a JSON object (which a random model may
    # not close within max_tokens: then what it wrote opens an object)
    try:
        result = llm.with_structured_output(None, method="json_mode", include_raw=True).invoke("Reply in JSON.")
        assert isinstance(result["parsed"], dict)
    except openai.LengthFinishReasonError as e:  # the client's own check, before LangChain parses
        assert e.completion.choices[0].message.content.lstrip().startswith("{")
