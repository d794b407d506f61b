"""Prompt logprobs, echo with logprobs and logprobs=0 in vLLM's (and OpenAI's) shapes; the values equal the
offline API's."""

from __future__ import annotations

import httpx
import pytest

from jaxllm import LLM, SamplingParams
from tests.server.helpers import MODEL, client

PROMPT = [1, 504, 3575, 282, 4649, 314, 2]


def _post(server, path, **body):
    return httpx.post(server.url + path, json={"model": MODEL, "temperature": 0, **body}, timeout=60)


@pytest.fixture(scope="module")
def offline(tiny_model_with_tokenizer):
    """The offline API's prompt logprobs (top 2) of PROMPT on the server's model."""
    llm = LLM(str(tiny_model_with_tokenizer), max_model_len=256, max_num_seqs=4)
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2),
                       use_tqdm=False)[0]
    return out.prompt_logprobs


def test_prompt_logprobs_equal_the_offline_api(server, offline):
    completion = _post(server, "/v1/completions", prompt=PROMPT, max_tokens=2, prompt_logprobs=2).json()
    served = completion["choices"][0]["prompt_logprobs"]
    assert len(served) == len(PROMPT) == len(offline) and served[0] is None and offline[0] is None
    for got, want in zip(served[1:], offline[1:]):
        assert set(got) == {str(t) for t in want}
        for token, lp in want.items():
            assert got[str(token)]["logprob"] == pytest.approx(lp.logprob, abs=1e-4)
            assert got[str(token)]["rank"] == lp.rank and got[str(token)]["decoded_token"]
    chat = _post(server, "/v1/chat/completions", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                 prompt_logprobs=0).json()
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    assert all(len(entry) == 1 for entry in chat["prompt_logprobs"][1:])  # the prompt's own token only


def test_prompt_logprobs_are_null_when_not_asked_and_refused_when_bad(server):
    plain = _post(server, "/v1/completions", prompt=PROMPT, max_tokens=2).json()
    assert "prompt_logprobs" in plain["choices"][0] and plain["choices"][0]["prompt_logprobs"] is None
    for body in ({"prompt_logprobs": -1}, {"prompt_logprobs": 2, "stream": True}):
        reply = _post(server, "/v1/completions", prompt=PROMPT, max_tokens=2, **body)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "prompt_logprobs", reply.text


def test_echo_with_logprobs_covers_the_prompt_first_null(server, offline):
    out = client(server.url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True,
                                                logprobs=2).choices[0]
    lp = out.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(PROMPT) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i, token in enumerate(PROMPT[1:], start=1):
        assert lp.token_logprobs[i] == pytest.approx(offline[i][token].logprob, abs=1e-4)
    assert "".join(lp.tokens) == out.text
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    streamed = [c.choices[0] for c in client(server.url).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=2, stream=True) if c.choices]
    assert [t for c in streamed if c.logprobs for t in c.logprobs.token_logprobs] == lp.token_logprobs


def test_logprobs_zero_gives_the_sampled_tokens_own_logprob(server):
    lp = client(server.url).completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0.8, seed=1,
                                               logprobs=0).choices[0].logprobs
    assert len(lp.top_logprobs) == 4
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top == {token: logprob} and logprob <= 0
