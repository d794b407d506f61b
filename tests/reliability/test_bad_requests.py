"""A table of distinct bad requests against a real server (API key on, body limit on). Each must be answered by the
expected 4xx with the OpenAI error body, never a 5xx or a hang, and the same keep-alive connection must serve a
valid request right after it (checked by the client's local address: a new connection would have a new one).

Each row says why the request is bad. tests/server/test_errors.py checks the messages of the common mistakes;
this table goes through every field's type and range, the JSON parser's edge cases, and the routing and
authentication layers.
"""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from tests.reliability.helpers import AUTH, MAX_BODY_BYTES, MAX_MODEL_LEN, MODEL, assert_openai_error

VOCAB = 49152  # the tiny model's vocabulary: the default model's tokenizer
DEPTH = 100_000  # nesting levels of the deeply nested bodies (about 200 KB, under the body limit)
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
VALID = {"model": MODEL, "prompt": "ok", "max_tokens": 2}


@dataclasses.dataclass(frozen=True)
class Bad:
    name: str
    why: str
    body: dict | bytes | None  # dict: sent as JSON; bytes: sent as they are
    status: int = 400
    path: str = "/v1/completions"
    method: str = "POST"
    param: str | None = None  # the field the error must name (exactly, or as the head of a path)
    headers: dict | None = None  # replaces the content type / authorization of the request
    anonymous: bool = False  # sent without any Authorization header


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields}


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": USER, "max_tokens": 2, **fields}


def raw(text: str) -> bytes:
    return text.encode()


CASES = [
    # ------------------------------------------------------------------ the body is not a JSON object
    Bad("truncated-json", "the JSON text ends inside the object", raw('{"prompt": "x", ')),
    Bad("empty-body", "no body at all where a JSON object is required", b""),
    Bad("json-top-level-string", "valid JSON, but a string where the request object belongs", raw('"hi"')),
    Bad("json-null", "valid JSON null instead of an object", raw("null"), path=CHAT),
    Bad("invalid-utf8", "bytes that are not UTF-8 inside a JSON string", b'{"prompt": "\xff\xfe"}'),
    Bad("form-encoded", "a form body, not JSON", raw("prompt=hi&max_tokens=2"),
        headers={"content-type": "application/x-www-form-urlencoded"}),
    Bad("nested-lists-100k", "100k nested lists: recursion in the JSON parser must not become a 5xx",
        raw('{"prompt": ' + "[" * DEPTH + "]" * DEPTH + "}")),
    Bad("nested-objects-100k", "100k nested objects in an ignored field",
        raw('{"prompt": "hi", "user": ' + '{"a": ' * DEPTH + "1" + "}" * DEPTH + "}")),
    Bad("nan-temperature", "NaN: not JSON, though Python's parser takes it; not a temperature either",
        raw('{"prompt": "hi", "temperature": NaN}'), param="temperature"),
    Bad("infinite-top-p", "Infinity as top_p", raw('{"prompt": "hi", "top_p": Infinity}'), param="top_p"),
    Bad("overflowing-max-tokens", "1e999 parses as infinity: not an integer",
        raw('{"prompt": "hi", "max_tokens": 1e999}'), param="max_tokens"),
    Bad("body-over-limit", "a body larger than --max-body-bytes is refused before it is parsed",
        completion(prompt="x " * MAX_BODY_BYTES), status=413),
    # ------------------------------------------------------------------ model and prompt
    Bad("model-not-a-string", "model is a name", completion(model=5), param="model"),
    Bad("prompt-an-int", "a prompt is text, token ids, or a list of either", completion(prompt=5), param="prompt"),
    Bad("prompt-null", "the required prompt is null", completion(prompt=None), param="prompt"),
    Bad("prompt-mixed-list", "a list mixing text and token ids", completion(prompt=["a", 5]), param="prompt"),
    Bad("prompt-empty-token-list", "the one prompt in the list has no tokens", completion(prompt=[[]]),
        param="prompt"),
    Bad("prompt-negative-token", "token ids are >= 0", completion(prompt=[5, -1]), param="prompt"),
    Bad("prompt-token-out-of-vocab", "token id beyond the vocabulary (and beyond int64)",
        completion(prompt=[10 ** 30]), param="prompt"),
    Bad("prompt-too-long-second-of-two", "the second prompt alone exceeds max_model_len",
        completion(prompt=[[5, 6], list(range(1000, 1000 + MAX_MODEL_LEN + 10))]), param="prompt"),
    Bad("prompt-lone-surrogate", "a lone UTF-16 surrogate is valid JSON but not Unicode",
        raw('{"prompt": "a\\ud800b", "max_tokens": 2}'), param="prompt"),
    Bad("prompt-list-lone-surrogate", "a lone surrogate in the second prompt of a list",
        raw('{"prompt": ["fine", "\\udfff"], "max_tokens": 2}'), param="prompt"),
    Bad("key-lone-surrogate", "a lone surrogate in a key of the body (an unknown field's name)",
        raw('{"prompt": "hi", "max_tokens": 2, "\\ud800": 1}')),
    Bad("nested-key-lone-surrogate", "a lone surrogate in a key inside a message",
        raw('{"messages": [{"role": "user", "content": "x", "\\udfff": 2}], "max_tokens": 2}'), path=CHAT),
    Bad("suffix-unsupported", "suffix (insertion) is not supported", completion(suffix="tail"), param="suffix"),
    # ------------------------------------------------------------------ chat messages
    Bad("messages-a-string", "messages is a list of message objects", chat(messages="hi"), path=CHAT,
        param="messages"),
    Bad("messages-empty", "at least one message is needed", chat(messages=[]), path=CHAT, param="messages"),
    Bad("message-without-role", "every message has a role", chat(messages=[{"content": "hi"}]), path=CHAT,
        param="messages"),
    Bad("message-content-an-int", "content is text or a list of content parts",
        chat(messages=[{"role": "user", "content": 5}]), path=CHAT, param="messages"),
    Bad("content-part-image", "only text content parts are supported",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]),
        path=CHAT, param="messages"),
    Bad("content-parts-not-objects", "content parts are objects", chat(messages=[{"role": "user", "content": [5]}]),
        path=CHAT, param="messages"),
    Bad("chat-lone-surrogate", "a lone surrogate in a message",
        raw('{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}'), path=CHAT,
        param="messages"),
    Bad("content-part-lone-surrogate", "a lone surrogate inside a text content part",
        raw('{"messages": [{"role": "user", "content": [{"type": "text", "text": "x\\udc00"}]}]}'), path=CHAT,
        param="messages"),
    Bad("max-completion-tokens-negative", "max_completion_tokens must be >= 1",
        chat(max_completion_tokens=-1, max_tokens=None), path=CHAT),
    # ------------------------------------------------------------------ sampling fields: types and ranges
    Bad("max-tokens-fraction", "max_tokens is an integer", completion(max_tokens=1.5), param="max_tokens"),
    Bad("max-tokens-negative", "max_tokens must be >= 1", completion(max_tokens=-5), param="max_tokens"),
    Bad("max-tokens-past-context", "prompt + max_tokens exceed max_model_len", completion(max_tokens=10 ** 9)),
    Bad("temperature-a-word", "temperature is a number", completion(temperature="hot"), param="temperature"),
    Bad("top-p-above-one", "top_p is in (0, 1]", completion(top_p=1.5), param="top_p"),
    Bad("top-p-an-object", "top_p is a number", completion(top_p={}), param="top_p"),
    Bad("n-fraction", "n is an integer", completion(n=2.5, temperature=1), param="n"),
    Bad("n-negative", "n must be >= 1", completion(n=-1, temperature=1), param="n"),
    Bad("n-a-million", "n above the server's per-request limit (--max-n, default 64)",
        completion(n=10 ** 6, temperature=1), param="n"),
    Bad("n-just-over-limit", "n = 65, one above the default limit", completion(n=65, temperature=1), param="n"),
    Bad("n-greedy", "several samples of a greedy request would all be the same", completion(n=2, temperature=0),
        param="n"),
    Bad("best-of-below-n", "best_of samples from which the n best are returned: it cannot be below n",
        completion(n=3, best_of=2, temperature=1), param="best_of"),
    Bad("best-of-a-million", "best_of above the server's per-request limit",
        completion(best_of=10 ** 6, temperature=1), param="best_of"),
    Bad("best-of-a-word", "best_of is an integer", completion(best_of="x", temperature=1), param="best_of"),
    Bad("stop-an-int", "stop is a string or a list of strings", completion(stop=5), param="stop"),
    Bad("stop-list-of-ints", "stop strings, not token ids (those go in stop_token_ids)", completion(stop=[1, 2]),
        param="stop"),
    Bad("stop-empty-string", "an empty stop string would match everywhere", completion(stop=[""]), param="stop"),
    Bad("seed-a-word", "seed is an integer", completion(seed="abc", temperature=1), param="seed"),
    Bad("seed-fraction", "seed is an integer", completion(seed=1.5, temperature=1), param="seed"),
    Bad("stream-two", "stream is a boolean; 2 is not one", completion(stream=2), param="stream"),
    Bad("stream-a-list", "stream is a boolean", completion(stream=[]), param="stream"),
    Bad("stream-options-without-stream", "stream_options only apply to a streamed response (as in vLLM)",
        completion(stream_options={"include_usage": True}), param="stream_options"),
    Bad("stream-options-a-string", "stream_options is an object", completion(stream=True, stream_options="usage"),
        param="stream_options"),
    Bad("include-usage-a-word", "include_usage is a boolean",
        chat(stream=True, stream_options={"include_usage": "maybe"}), path=CHAT, param="stream_options"),
    Bad("logit-bias-a-list", "logit_bias maps token ids to biases", completion(logit_bias=[1, 2]),
        param="logit_bias"),
    Bad("logit-bias-value-a-word", "biases are numbers", completion(logit_bias={"5": "big"}), param="logit_bias"),
    Bad("logit-bias-out-of-vocab", "a bias for a token the model does not have", completion(logit_bias={
        str(VOCAB): 1.0}), param="logit_bias"),
    Bad("logit-bias-negative-id", "token ids are >= 0", completion(logit_bias={"-1": 1.0}), param="logit_bias"),
    Bad("logit-bias-not-an-id", "keys are decimal token ids", completion(logit_bias={"1e3": 1.0}),
        param="logit_bias"),
    Bad("logit-bias-infinite", "an infinite bias", raw('{"prompt": "hi", "logit_bias": {"5": -Infinity}}'),
        param="logit_bias"),
    Bad("presence-penalty-out-of-range", "presence_penalty is in [-2, 2]", completion(presence_penalty=3),
        param="presence_penalty"),
    Bad("frequency-penalty-out-of-range", "frequency_penalty is in [-2, 2]", completion(frequency_penalty=-2.5),
        param="frequency_penalty"),
    Bad("presence-penalty-a-word", "presence_penalty is a number", chat(presence_penalty="x"), path=CHAT,
        param="presence_penalty"),
    Bad("top-k-below-minus-one", "top_k is -1 or 0 (off) or >= 1", completion(top_k=-2), param="top_k"),
    Bad("top-k-fraction", "top_k is an integer", completion(top_k=1.5), param="top_k"),
    Bad("min-p-above-one", "min_p is in [0, 1]", completion(min_p=1.5), param="min_p"),
    Bad("min-p-negative", "min_p is in [0, 1]", chat(min_p=-0.1), path=CHAT, param="min_p"),
    Bad("repetition-penalty-negative", "repetition_penalty is > 0", completion(repetition_penalty=-1),
        param="repetition_penalty"),
    Bad("min-tokens-negative", "min_tokens is >= 0", completion(min_tokens=-1), param="min_tokens"),
    Bad("min-tokens-above-max-tokens", "cannot generate at least 10 tokens out of at most 5",
        completion(min_tokens=10, max_tokens=5), param="min_tokens"),
    Bad("stop-token-ids-out-of-vocab", "a stop token the model does not have", completion(stop_token_ids=[VOCAB]),
        param="stop_token_ids"),
    Bad("stop-token-ids-a-string", "stop_token_ids is a list of integers", completion(stop_token_ids="5"),
        param="stop_token_ids"),
    Bad("stop-token-ids-negative", "token ids are >= 0", chat(stop_token_ids=[-1]), path=CHAT,
        param="stop_token_ids"),
    Bad("logprobs-negative", "completion logprobs is the number of alternatives, >= 0", completion(logprobs=-1),
        param="logprobs"),
    Bad("logprobs-above-limit", "at most 20 alternatives per token", completion(logprobs=21), param="logprobs"),
    Bad("chat-logprobs-a-word", "chat logprobs is a boolean", chat(logprobs="x"), path=CHAT, param="logprobs"),
    Bad("top-logprobs-above-limit", "at most 20 alternatives per token", chat(logprobs=True, top_logprobs=21),
        path=CHAT),
    Bad("top-logprobs-negative", "top_logprobs is >= 0", chat(logprobs=True, top_logprobs=-1), path=CHAT),
    Bad("echo-a-word", "echo is a boolean", completion(echo="x"), param="echo"),
    Bad("ignore-eos-five", "ignore_eos is a boolean", completion(ignore_eos=5), param="ignore_eos"),
    Bad("user-an-int", "user is a string", completion(user=5), param="user"),
    # ------------------------------------------------------------------ tokenizer endpoints
    Bad("tokenize-lone-surrogate", "a lone surrogate cannot be encoded", raw('{"prompt": "\\ud800"}'),
        path="/tokenize", param="prompt"),
    Bad("tokenize-prompt-and-messages", "exactly one of prompt and messages", {"prompt": "x", "messages": USER},
        path="/tokenize"),
    Bad("tokenize-neither", "exactly one of prompt and messages", {"model": MODEL}, path="/tokenize"),
    Bad("detokenize-strings", "token ids are integers", {"tokens": ["a"]}, path="/detokenize", param="tokens"),
    # ------------------------------------------------------------------ routing and authentication
    Bad("unknown-endpoint", "no such route", None, status=404, method="GET", path="/v1/engines"),
    Bad("get-completions", "completions are created with POST", None, status=405, method="GET"),
    Bad("put-chat", "chat completions are created with POST", chat(), status=405, method="PUT", path=CHAT),
    Bad("delete-tokenize", "tokenize takes POST", None, status=405, method="DELETE", path="/tokenize"),
    Bad("missing-api-key", "the server was started with --api-key", completion(), status=401, anonymous=True),
    Bad("wrong-api-key", "a key that is not the server's", completion(), status=401,
        headers={"Authorization": "Bearer not-the-key"}),
    Bad("basic-auth-scheme", "the key must come as a Bearer token", chat(), status=401, path=CHAT,
        headers={"Authorization": "Basic cmVsaWFiaWxpdHkta2V5"}),
    Bad("models-without-key", "/v1 routes all need the key", None, status=401, method="GET", path="/v1/models",
        anonymous=True),
]


@pytest.fixture(scope="module")
def http(guarded_server):
    """One keep-alive client for the whole table: each case must leave its connection usable."""
    with httpx.Client(base_url=guarded_server.url, headers=AUTH, timeout=httpx.Timeout(60, connect=10)) as client:
        yield client


def send(http: httpx.Client, case: Bad) -> httpx.Response:
    kwargs = {}
    if isinstance(case.body, bytes):
        kwargs["content"] = case.body
        kwargs["headers"] = {"content-type": "application/json"}
    elif case.body is not None:
        kwargs["json"] = case.body
    request = http.build_request(case.method, case.path, **kwargs)
    request.headers.update(case.headers or {})
    if case.anonymous:
        del request.headers["Authorization"]
    return http.send(request)


def local_address(response: httpx.Response):
    """The client side (host, port) of the connection that carried the response."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


def test_the_table_holds_distinct_cases():
    assert len(CASES) >= 40
    assert len({case.name for case in CASES}) == len(CASES)
    assert len({(case.method, case.path, repr(case.body), repr(case.headers), case.anonymous)
                for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_bad_request_is_a_4xx_in_the_openai_shape_and_the_connection_stays_usable(http, case):
    response = send(http, case)
    assert response.status_code == case.status, f"{case.why}: {response.status_code} {response.text[:500]}"
    error = assert_openai_error(response)
    if case.param is not None:
        param = error["param"] or ""
        assert param == case.param or param.startswith((case.param + ".", case.param + "[")), error
    assert response.headers.get("connection", "").lower() != "close", response.headers
    connection = local_address(response)
    valid = http.post("/v1/completions", json=VALID)
    assert valid.status_code == 200, valid.text
    assert valid.json()["usage"]["completion_tokens"] == 2
    assert local_address(valid) == connection, "the valid request needed a new connection"
