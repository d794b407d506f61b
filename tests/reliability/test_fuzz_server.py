"""A seeded mutation fuzzer over valid completion and chat bodies, sent to a real server one after another on one
keep-alive connection.

Each body is a valid request with one to three mutations: a field deleted, its value swapped for another JSON
type, an extreme number, raw JSON text Python's parser takes or refuses (NaN, Infinity, 1e999, a 5000-digit
integer), random Unicode (lone surrogates, NUL, emoji, combining marks), deeply nested junk, a duplicated key, an
unknown field, a broken chat message, a truncated body, a long list. Generation stays short: bodies start with
at most 4 new tokens, and only a mutation of max_tokens itself changes that (the server's max_model_len bounds it).

Expected: no status >= 500, no request past its timeout, every non-2xx body in the OpenAI error shape, every 2xx
body a completion (a stream ends with [DONE] and holds no error event), and at the end /health is 200 and no
request or KV block is left behind. JAXLLM_FUZZ_BODIES sets the number of bodies (CI default 300; run >= 2000
for a thorough pass); JAXLLM_FUZZ_SEED the seed.
"""

from __future__ import annotations

import collections
import copy
import json
import math
import os
import random
import time

import httpx
import pytest

from tests.reliability.helpers import AUTH, MODEL, assert_openai_error, sse_events
from tests.server.helpers import metrics

NUM_BODIES = int(os.environ.get("JAXLLM_FUZZ_BODIES", "300"))
SEED = int(os.environ.get("JAXLLM_FUZZ_SEED", "20240611"))
REQUEST_TIMEOUT_S = 90  # a first request may compile a program; anything slower is a hang
CHAT = "/v1/chat/completions"

SYSTEM_AND_USER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
BASES = [
    ("/v1/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}),
    ("/v1/completions", {"prompt": [101, 2054, 2003, 1996], "max_tokens": 2, "temperature": 0}),
    ("/v1/completions", {"prompt": ["first prompt", "second prompt"], "max_tokens": 2, "temperature": 0.7,
                         "seed": 11}),
    ("/v1/completions", {"model": MODEL, "prompt": "Sample several", "max_tokens": 3, "n": 2, "temperature": 0.8,
                         "seed": 3, "top_p": 0.9, "top_k": 20, "min_p": 0.05}),
    ("/v1/completions", {"prompt": "With logprobs", "max_tokens": 2, "logprobs": 2, "echo": True}),
    ("/v1/completions", {"prompt": "Stops and biases", "max_tokens": 4, "stop": ["\n", "the"],
                         "stop_token_ids": [2, 13], "logit_bias": {"13": -5.0, "42": 2.5},
                         "include_stop_str_in_output": True}),
    ("/v1/completions", {"prompt": "Penalised", "max_tokens": 4, "presence_penalty": 0.5,
                         "frequency_penalty": -0.5, "repetition_penalty": 1.2, "min_tokens": 1, "ignore_eos": True}),
    ("/v1/completions", {"prompt": "Streamed", "max_tokens": 3, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "Best of three", "max_tokens": 2, "n": 2, "best_of": 3, "temperature": 1.0,
                         "seed": 5}),
    (CHAT, {"model": MODEL, "messages": SYSTEM_AND_USER, "max_tokens": 3, "temperature": 0}),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"},
                                                      {"type": "text", "text": " of text"}]}],
            "max_completion_tokens": 2}),
    (CHAT, {"messages": SYSTEM_AND_USER, "max_tokens": 2, "logprobs": True, "top_logprobs": 2, "seed": 1,
            "temperature": 0.5}),
    (CHAT, {"messages": [{"role": "user", "content": "stream please"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}, "stop": ["."]}),
    ("/tokenize", {"model": MODEL, "prompt": "count my tokens"}),
    ("/tokenize", {"messages": SYSTEM_AND_USER}),
]


class Raw(str):
    """JSON text written into the body verbatim (literals no serializer would produce)."""


EXTREME_NUMBERS = [0, -1, 1, 2, 64, 65, 10 ** 6, 2 ** 31, 2 ** 63, 2 ** 64, -(2 ** 63) - 1, 10 ** 100, 1e308,
                   -1e308, 5e-324, 0.5, -0.0, 1.0000001, 255, 49151, 49152]
RAW_LITERALS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" * 5000, "1e-400", "-0", "0.0e0",
                "123456789012345678901234567890", "true", "null", "0x10", "+1", ".5", "01"]
ODD_CHARACTERS = ["\ud800", "\udfff", "\udbff\udbff", "\x00", "\u202e", "\u0301", "\ufeff", "\uffff",
                  "\U0001f600", "\u4e2d\u6587", "\\", '"', "\n", "\t", "<|im_end|>", "<|endoftext|>", "{{", "}}",
                  "\U0010ffff", "\u0000\u0000"]


def random_unicode(rng: random.Random) -> str:
    return "".join(rng.choice(ODD_CHARACTERS) if rng.random() < 0.5 else chr(rng.randrange(32, 0x3000))
                   for _ in range(rng.randint(0, 12)))


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice(EXTREME_NUMBERS)
    if kind == 3:
        return Raw(rng.choice(RAW_LITERALS))
    if kind == 4:
        return random_unicode(rng)
    if kind == 5:
        return rng.choice(["", "text", "user", "assistant", "image_url", MODEL, "tiny-other"])
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == 7:
        return {random_unicode(rng) or "k": random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return nested_junk(rng)


def nested_junk(rng: random.Random) -> Raw:
    depth = rng.choice([2, 50, 500, 3000, 50_000])
    if rng.random() < 0.5:
        return Raw("[" * depth + "]" * depth)
    return Raw('{"a": ' * depth + "0" + "}" * depth)


# ------------------------------------------------------------------------------------------------ mutations
def fields(body: dict) -> list[str]:
    return sorted(key for key in body if key != DUPLICATES)


# Each takes (path, body, rng), changes the body in place, and returns a short description.
def delete_field(path, body, rng):
    keys = fields(body)
    if not keys:
        return "delete: nothing"
    key = rng.choice(keys)
    del body[key]
    return f"delete {key}"


def swap_type(path, body, rng):
    key = rng.choice(fields(body) or ["prompt"])
    body[key] = random_value(rng)
    return f"swap {key}"


def extreme_number(path, body, rng):
    key = rng.choice(["max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "best_of", "seed", "logprobs",
                      "top_logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
                      "max_completion_tokens"])
    body[key] = rng.choice(EXTREME_NUMBERS)
    return f"extreme {key}"


def raw_literal(path, body, rng):
    key = rng.choice(fields(body) + ["temperature", "max_tokens", "seed"])
    body[key] = Raw(rng.choice(RAW_LITERALS))
    return f"raw {key}"


def odd_unicode(path, body, rng):
    if "messages" in body and isinstance(body["messages"], list) and body["messages"] and rng.random() < 0.6:
        message = body["messages"][rng.randrange(len(body["messages"]))]
        if isinstance(message, dict):
            message[rng.choice(["content", "role", "name"])] = random_unicode(rng)
            return "unicode in a message"
    key = rng.choice(["prompt", "stop", "model", "user", random_unicode(rng) or "x"])
    body[key] = random_unicode(rng) if rng.random() < 0.7 else [random_unicode(rng) for _ in range(3)]
    return f"unicode {key!r}"


def junk_value(path, body, rng):
    key = rng.choice(fields(body) + ["logit_bias", "stream_options", "messages"])
    body[key] = nested_junk(rng) if rng.random() < 0.5 else random_value(rng)
    return f"junk {key}"


def duplicate_key(path, body, rng):
    key = rng.choice(fields(body) or ["prompt"])
    body.setdefault(DUPLICATES, []).append((key, random_value(rng), rng.random() < 0.5))
    return f"duplicate {key}"


def unknown_field(path, body, rng):
    body[rng.choice(["extra", "functions", "tools", "response_format", random_unicode(rng) or "z"])] = \
        random_value(rng)
    return "unknown field"


def break_messages(path, body, rng):
    messages = body.get("messages")
    if not isinstance(messages, list):
        body["messages"] = random_value(rng)
        return "messages replaced"
    choice = rng.randrange(5)
    if choice == 0:
        messages.append({"role": rng.choice(["user", "assistant", "system", "tool", "x"]),
                         "content": random_value(rng)})
    elif choice == 1 and messages:
        messages[rng.randrange(len(messages))] = random_value(rng)
    elif choice == 2:
        messages.append({"role": "user", "content": [{"type": rng.choice(["text", "image_url", "audio", ""]),
                                                      "text": random_value(rng)}]})
    elif choice == 3:
        messages.extend([{"role": "user", "content": "again"}] * rng.choice([10, 200]))
    else:
        messages.clear()
    return f"messages {choice}"


def long_list(path, body, rng):
    key = rng.choice(["stop", "stop_token_ids", "logit_bias", "prompt"])
    size = rng.choice([100, 1000, 5000])
    if key == "stop":
        body[key] = [f"s{i}" for i in range(size)]
    elif key == "stop_token_ids":
        body[key] = [rng.randrange(0, 60000) for _ in range(size)]
    elif key == "logit_bias":
        body[key] = {str(rng.randrange(0, 60000)): rng.uniform(-100, 100) for _ in range(size)}
    else:
        body[key] = [rng.randrange(0, 50000) for _ in range(rng.choice([10, 300]))] if rng.random() < 0.5 else \
            ["p"] * rng.choice([5, 50])
    return f"long {key}"


def toggle_stream(path, body, rng):
    body["stream"] = rng.choice([True, False, "true", 1, 0, None])
    if rng.random() < 0.5:
        body["stream_options"] = rng.choice([{"include_usage": True}, {"include_usage": False}, {}, None])
    return "stream toggled"


DUPLICATES = "\0duplicates"  # a key no mutation picks: (key, value, written first) pairs to add as repeated keys
MUTATIONS = [delete_field, swap_type, extreme_number, raw_literal, odd_unicode, junk_value, duplicate_key,
             unknown_field, break_messages, long_list, toggle_stream]


# ------------------------------------------------------------------------------------------------ serialization
def dumps(value, rng: random.Random) -> str:
    """JSON text of `value`: Raw pieces verbatim, strings escaped or (when encodable) raw UTF-8, duplicated keys
    where the body asks for them."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        pairs = [(k, v) for k, v in value.items() if k != DUPLICATES]
        for key, extra, first in value.get(DUPLICATES, []):
            pairs.insert(0, (key, extra)) if first else pairs.append((key, extra))
        return "{" + ", ".join(f"{dumps(str(k), rng)}: {dumps(v, rng)}" for k, v in pairs) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumps(v, rng) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=rng.random() < 0.5 or not encodable(value))
    if isinstance(value, float) and not math.isfinite(value):
        return "1e999" if value > 0 else "-1e999"
    return json.dumps(value)


def encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def make_body(rng: random.Random) -> tuple[str, bytes, dict, list[str]]:
    """(path, body bytes, headers, mutations applied)."""
    path, base = rng.choice(BASES)
    body = copy.deepcopy(base)
    applied = [mutation(path, body, rng) for mutation in rng.sample(MUTATIONS, rng.choice([1, 1, 2, 3]))]
    text = dumps(body, rng).encode()
    headers = {"content-type": "application/json"}
    if rng.random() < 0.03:
        text = text[:rng.randrange(len(text) + 1)]
        applied.append("truncated")
    if rng.random() < 0.02:
        headers = {"content-type": rng.choice(["text/plain", "application/x-www-form-urlencoded", ""])}
        applied.append(f"content-type {headers['content-type']!r}")
    return path, text, headers, applied


# ------------------------------------------------------------------------------------------------ checks
def problems_with(response: httpx.Response) -> str | None:
    """What is wrong with a response to a fuzzed body, or None."""
    if response.status_code >= 500:
        return f"status {response.status_code}: {response.text[:300]}"
    if response.status_code >= 300:
        try:
            assert_openai_error(response)
        except AssertionError as e:
            return f"status {response.status_code}, not an OpenAI error: {e}"
        return None
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = sse_events(response.text)
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        if errors or not events or events[-1] != "[DONE]":
            return f"stream with errors {errors[:2]} or without [DONE]: {response.text[-300:]}"
        return None
    body = response.json()
    if not isinstance(body, dict) or not ("choices" in body or "tokens" in body):
        return f"a 2xx that is neither a completion nor tokens: {response.text[:300]}"
    return None


def wait_until_idle(url: str, timeout_s: float = 10.0) -> dict:
    """/metrics once no request runs or waits and every KV block is free (or the last sample at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = metrics(url)
        idle = now["vllm:num_requests_running"] == 0 and now["vllm:num_requests_waiting"] == 0
        if (idle and now["vllm:kv_cache_usage_perc"] == 0) or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


@pytest.mark.slow
def test_fuzzed_bodies_never_break_the_server(guarded_server, capsys):
    rng = random.Random(SEED)
    statuses: collections.Counter = collections.Counter()
    problems: list[str] = []
    started = time.monotonic()
    with httpx.Client(base_url=guarded_server.url, headers=AUTH,
                      timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10)) as http:
        for index in range(NUM_BODIES):
            path, content, headers, applied = make_body(rng)
            try:
                response = http.post(path, content=content, headers=headers)
            except httpx.TimeoutException:
                problems.append(f"#{index} {path} {applied}: no answer in {REQUEST_TIMEOUT_S}s")
                statuses["timeout"] += 1
                continue
            statuses[response.status_code] += 1
            problem = problems_with(response)
            if problem is not None:
                problems.append(f"#{index} {path} {applied}: {problem}")
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(f"\nfuzz: {NUM_BODIES} bodies in {elapsed:.0f}s (seed {SEED}); statuses "
              f"{dict(sorted(statuses.items(), key=str))}")
    assert not problems, f"{len(problems)} bad responses:\n" + "\n".join(problems[:15])
    assert httpx.get(guarded_server.url + "/health", timeout=10).status_code == 200
    idle = wait_until_idle(guarded_server.url)
    assert idle["vllm:num_requests_running"] == 0 and idle["vllm:kv_cache_usage_perc"] == 0, idle
    assert statuses[200] > NUM_BODIES // 20, statuses  # the fuzzer still produces valid requests too


def test_the_mutator_is_deterministic_and_varied():
    """The same seed gives the same bodies; the bodies differ and cover every mutation."""
    first = [make_body(random.Random(7)) for _ in range(3)]
    assert first == [make_body(random.Random(7)) for _ in range(3)]
    rng = random.Random(SEED)
    bodies = [make_body(rng) for _ in range(400)]
    assert len({content for _, content, _, _ in bodies}) > 350
    applied = {name.split(" ")[0] for *_, names in bodies for name in names}
    assert {"delete", "swap", "extreme", "raw", "unicode", "junk", "duplicate", "unknown", "messages", "long",
            "stream", "truncated"} <= applied, applied
    assert any(b"\\ud8" in content for _, content, _, _ in bodies)  # lone surrogates, escaped
