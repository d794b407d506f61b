"""Every field of vLLM's request models that jaxllm does not implement is refused by name (a 400, param = the
field) unless it holds the value that changes nothing; fields vLLM does not know are ignored; stream_options and
request_id act as vLLM's."""

from __future__ import annotations

import httpx
import pytest

from jaxllm.entrypoints.openai.request_fields import ANY, FIELDS
from tests.server.helpers import MODEL, client

BODIES = {"completion": ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
          "chat": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                             "max_tokens": 2})}
ASKING = {bool: lambda unused: not unused, float: lambda unused: unused + 1.0, int: lambda unused: unused + 1,
          list: lambda unused: ["word"], dict: lambda unused: {"type": "json_object"},
          str: lambda unused: "required"}


def _asking_value(unused: tuple):
    """A value that asks for the field's feature: not one of the values that leave it unused."""
    typed = [u for u in unused if u is not None]
    return ASKING[type(typed[0])](typed[0]) if typed else {"asks": 1}


CASES = [(kind, name, unused) for kind, fields in FIELDS.items() for name, unused in fields.items()
         if unused is not ANY]


@pytest.mark.parametrize("kind, field, unused", CASES, ids=[f"{k}-{f}" for k, f, _ in CASES])
def test_a_field_not_implemented_is_refused_by_name_unless_unused(server, kind, field, unused):
    path, body = BODIES[kind]
    asked = httpx.post(server.url + path, json={**body, field: _asking_value(unused)}, timeout=60)
    assert asked.status_code == 400, (field, asked.text)
    assert asked.json()["error"]["param"] == field
    assert asked.json()["error"]["message"] == f"{field} is not supported"
    for value in unused:
        assert httpx.post(server.url + path, json={**body, field: value}, timeout=60).status_code == 200, value


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_fields_vllm_does_not_know_and_fields_without_effect_are_accepted(server, kind):
    path, body = BODIES[kind]
    extra = {"not_a_vllm_field": [1, 2]}
    if kind == "chat":
        extra |= {"parallel_tool_calls": True, "include_reasoning": False}
    assert httpx.post(server.url + path, json={**body, **extra}, timeout=60).status_code == 200


@pytest.mark.parametrize("seed", [-(1 << 63) - 1, 1 << 63])
def test_seed_outside_int64_is_refused(server, seed):
    path, body = BODIES["completion"]
    reply = httpx.post(server.url + path, json={**body, "seed": seed}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "seed"
    assert httpx.post(server.url + path, json={**body, "seed": (1 << 63) - 1}, timeout=60).status_code == 200


def test_request_id_names_the_response(server):
    api = client(server.url)
    out = api.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"request_id": "abc"})
    chat = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       extra_body={"request_id": "abc"})
    assert (out.id, chat.id) == ("cmpl-abc", "chatcmpl-abc")
    again = api.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={"request_id": "abc"})
    assert again.id == "cmpl-abc"  # the same id twice is the client's business, not an engine conflict


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(server):
    api = client(server.url)
    options = {"include_usage": True, "continuous_usage_stats": True}
    completion = list(api.completions.create(model=MODEL, prompt="Hi", max_tokens=6, temperature=0, stream=True,
                                             stream_options=options, extra_body={"ignore_eos": True}))
    chat = list(api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                            temperature=0, stream=True, stream_options=options,
                                            extra_body={"ignore_eos": True}))
    for chunks in (completion, chat):
        assert all(c.usage is not None for c in chunks)
        counts = [c.usage.completion_tokens for c in chunks]
        assert counts == sorted(counts) and counts[-1] == 6
        assert len({c.usage.prompt_tokens for c in chunks}) == 1 and chunks[0].usage.prompt_tokens > 0
        assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)
    plain = list(api.completions.create(model=MODEL, prompt="Hi", max_tokens=3, stream=True,
                                        stream_options={"include_usage": True}))
    assert [c.usage is not None for c in plain] == [False] * (len(plain) - 1) + [True]


def test_x_request_id_is_echoed_and_names_the_response(server):
    path, body = BODIES["completion"]
    named = httpx.post(server.url + path, json=body, headers={"X-Request-Id": "client-7"}, timeout=60)
    assert named.headers["x-request-id"] == "client-7" and named.json()["id"] == "cmpl-client-7"
    chat_path, chat_body = BODIES["chat"]
    chat = httpx.post(server.url + chat_path, json={**chat_body, "request_id": "body"},
                      headers={"X-Request-Id": "header"}, timeout=60)
    assert chat.json()["id"] == "chatcmpl-header"  # the header wins over the body's request_id, as in vLLM
    unnamed = httpx.get(server.url + "/health", timeout=10)
    assert len(unnamed.headers["x-request-id"]) == 32  # a fresh id on every response, errors too
    assert httpx.get(server.url + "/nowhere", timeout=10).headers["x-request-id"]


def test_ping_and_invocations_are_vllms_routes(server):
    assert httpx.get(server.url + "/ping", timeout=10).status_code == 200
    assert httpx.post(server.url + "/ping", timeout=10).status_code == 200
    for kind in ("completion", "chat"):
        path, body = BODIES[kind]
        via_route = httpx.post(server.url + path, json={**body, "temperature": 0}, timeout=60).json()
        invoked = httpx.post(server.url + "/invocations", json={**body, "temperature": 0}, timeout=60).json()
        assert invoked["object"] == via_route["object"] and invoked["choices"] == via_route["choices"]
    bad = httpx.post(server.url + "/invocations", json={"prompt": "Hi", "max_tokens": "many"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"


PREFILLED = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]


def test_chat_template_options_and_echo(server):
    def tokens(**options):
        reply = httpx.post(server.url + "/tokenize", json={"messages": PREFILLED[:1], **options}, timeout=60)
        return reply.json()["tokens"]

    opened, closed = tokens(), tokens(add_generation_prompt=False)
    assert len(opened) > len(closed) and opened[:len(closed)] == closed  # the assistant's turn is opened
    prefill = httpx.post(server.url + "/tokenize", json={"messages": PREFILLED, "add_generation_prompt": False,
                                                         "continue_final_message": True}, timeout=60).json()
    assert prefill["token_strs"] is None and prefill["tokens"][:len(opened)] == opened
    text = httpx.post(server.url + "/detokenize", json={"tokens": prefill["tokens"]}, timeout=60).json()["prompt"]
    assert text.endswith("assistant\nThe colour is")  # the last message is left open: nothing after its text
    both = httpx.post(server.url + "/tokenize", json={"messages": PREFILLED, "continue_final_message": True},
                      timeout=60)
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"

    api = client(server.url)
    options = dict(model=MODEL, messages=PREFILLED, max_tokens=4, temperature=0,
                   extra_body={"add_generation_prompt": False, "continue_final_message": True, "echo": True})
    reply = api.chat.completions.create(**options).choices[0].message.content
    assert reply.startswith("The colour is") and len(reply) > len("The colour is")
    assert api.chat.completions.create(**options).usage.prompt_tokens == len(prefill["tokens"])
    streamed = "".join(c.choices[0].delta.content or "" for c in api.chat.completions.create(**options, stream=True)
                       if c.choices)
    assert streamed == reply


def test_tokenize_returns_token_strings_when_asked(server):
    out = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world", "return_token_strs": True},
                     timeout=60).json()
    assert len(out["token_strs"]) == len(out["tokens"]) and all(isinstance(t, str) for t in out["token_strs"])


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(server):
    prompt = [504, 3575, 282, 4649, 314, 1300, 42]

    def complete(**body):
        return httpx.post(server.url + "/v1/completions", json={"model": MODEL, "max_tokens": 4, "temperature": 0,
                                                                **body}, timeout=60).json()

    cut = complete(prompt=prompt, truncate_prompt_tokens=3)
    assert cut["usage"]["prompt_tokens"] == 3
    assert cut["choices"][0]["text"] == complete(prompt=prompt[-3:])["choices"][0]["text"]
    right = complete(prompt=prompt, truncate_prompt_tokens=3, truncation_side="right")
    assert right["choices"][0]["text"] == complete(prompt=prompt[:3])["choices"][0]["text"]
    assert complete(prompt=prompt, truncate_prompt_tokens=-1)["usage"]["prompt_tokens"] == len(prompt)
    chat = httpx.post(server.url + "/v1/chat/completions", json={**BODIES["chat"][1], "truncate_prompt_tokens": 2},
                      timeout=60).json()
    assert chat["usage"]["prompt_tokens"] == 2
    zero = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": prompt,
                                                            "truncate_prompt_tokens": 0}, timeout=60)
    assert zero.status_code == 400 and zero.json()["error"]["param"] == "truncate_prompt_tokens"


def test_allowed_token_ids_are_checked_against_the_vocabulary(server):
    path, body = BODIES["completion"]
    assert httpx.post(server.url + path, json={**body, "allowed_token_ids": [504, 7302]}, timeout=60).status_code == 200
    bad = httpx.post(server.url + path, json={**body, "allowed_token_ids": [10 ** 6]}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "allowed_token_ids"


@pytest.mark.parametrize("field, value, words", [
    ("logit_bias", {"bad1": 5.0, "2": 1.0, "bad2": 1.0}, ["'bad1'", "'bad2'"]),  # every bad key named
    ("prompt", None, ["Either prompt or prompt_embeds must be provided and non-empty"]),
    ("prompt", [10 ** 6], ["out of vocabulary"]),
    ("seed", 1 << 63, ["[type=less_than_equal]"]),  # pydantic's kind of check, as vLLM shows it
])
def test_refusals_are_worded_as_vllm_words_them(server, field, value, words):
    path, body = BODIES["completion"]
    reply = httpx.post(server.url + path, json={**body, field: value}, timeout=60)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == field, error
    assert all(word in error["message"] for word in words), error
