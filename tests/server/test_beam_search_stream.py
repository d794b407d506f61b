"""BeamSearchStream over a stand-in engine whose next-token logprobs are fixed: Hugging Face's rules worked out by
hand (which candidates finish, the length normalization, the early-stop heuristic) and the server's output shape
(the EOS left out of token_ids and text unless include_stop_str_in_output)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from jaxllm.beam_search import BeamSearchParams
from jaxllm.entrypoints.openai.beam_search import BeamSearchStream
from jaxllm.entrypoints.openai.serving_base import ServingBase
from jaxllm.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput

EOS = 2
PROMPT = [7, 8]
FIRST = {EOS: -0.5, 3: -1.0, 4: -1.5, 5: -3.0}  # the next-token logprobs after the prompt
LATER = {EOS: -0.2, 3: -2.0, 4: -2.5, 5: -3.0}  # after any generated token


class FakeStream:
    def __init__(self, request_id: str, tokens: list[int]):
        top = FIRST if len(tokens) == len(PROMPT) else LATER
        entry = {t: Logprob(lp, rank=i + 1) for i, (t, lp) in enumerate(top.items())}
        completion = CompletionOutput(0, "", [EOS], None, [entry], "stop")
        self.output = RequestOutput(request_id, None, tokens, None, [completion], True, RequestMetrics(0.0))
        self.closed = False

    async def __aiter__(self):
        yield self.output

    def close(self) -> None:
        self.closed = True


class FakeServing:
    def __init__(self):
        self.engine = SimpleNamespace(engine=SimpleNamespace(eos_token_ids=(EOS,)))
        self.max_model_len = 64
        self.tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: " ".join(map(str, ids)))
        self.steps: list[list[list[int]]] = []

    async def submit(self, request_id, prompts, params, lora_request, priority):
        assert params.max_tokens == 1 and params.logprobs == 4  # K = 2 x W
        self.steps.append([p["prompt_token_ids"] for p in prompts])
        return [FakeStream(f"{request_id}-{i}", p["prompt_token_ids"]) for i, p in enumerate(prompts)]

    collect = staticmethod(ServingBase.collect)


def run(params: BeamSearchParams) -> tuple[RequestOutput, FakeServing]:
    serving = FakeServing()
    stream = BeamSearchStream(serving, "r", {"prompt_token_ids": PROMPT}, params, None, 0, True)

    async def first():
        async for output in stream:
            return output

    return asyncio.run(first()), serving


def test_hand_worked_search():
    """Step 1: EOS (-0.5) is among the 2 best: finished, score -0.5 / 1. Running [3] (-1.0) and [4] (-1.5).
    Step 2: [3, EOS] (-1.2) and [4, EOS] (-1.7) are the 2 best: both end, [3, EOS] scores -0.6, [4, EOS] -0.85 and
    is left out (2 kept). Running [3, 3] (-3.0) could at best score -1.5 < -0.6: the search stops."""
    output, serving = run(BeamSearchParams(beam_width=2, max_tokens=10))
    assert serving.steps == [[PROMPT], [PROMPT + [3], PROMPT + [4]]]
    assert [c.token_ids for c in output.outputs] == [[], [3]]  # the EOS left out
    assert [c.text for c in output.outputs] == ["", "3"]
    assert [c.cumulative_logprob for c in output.outputs] == pytest.approx([-0.5, -1.2])
    assert [(c.finish_reason, c.stop_reason) for c in output.outputs] == [("stop", EOS)] * 2
    assert output.finished and output.prompt_token_ids == PROMPT


def test_eos_kept_with_include_stop_str_in_output_and_length_penalty_reorders():
    output, _ = run(BeamSearchParams(beam_width=2, max_tokens=10, include_stop_str_in_output=True))
    assert [c.token_ids for c in output.outputs] == [[EOS], [3, EOS]]
    # length_penalty 2: [3, EOS] scores -1.2 / 4 = -0.3, better than [EOS]'s -0.5
    output, _ = run(BeamSearchParams(beam_width=2, max_tokens=10, length_penalty=2.0))
    assert [c.token_ids for c in output.outputs][0] == [3]


def test_early_stopping_never_bounds_by_max_tokens():
    """length_penalty 2: after step 2 the finished are [3, EOS] (-1.2 / 4) and [4, EOS] (-1.7 / 4). False bounds a
    running beam at its current length (-3.0 / 2 ** 2 < -0.425: stop); "never" at max_tokens (-3.0 / 4 ** 2: go on),
    and [3, 3, 3, EOS] (-5.2 / 16 = -0.325) then beats [4, EOS]."""
    stopped, serving = run(BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=2.0))
    assert len(serving.steps) == 2 and [c.token_ids for c in stopped.outputs] == [[3], [4]]
    never, serving = run(BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=2.0, early_stopping="never"))
    assert len(serving.steps) == 4 and [c.token_ids for c in never.outputs] == [[3], [3, 3, 3]]
    assert [c.cumulative_logprob for c in never.outputs] == pytest.approx([-1.2, -5.2])


def test_ignore_eos_ends_at_max_tokens():
    output, _ = run(BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True))
    assert all(len(c.token_ids) == 3 and c.finish_reason == "length" for c in output.outputs)
    assert output.outputs[0].token_ids == [EOS, EOS, EOS]  # EOS is an ordinary token: -0.5 - 0.2 - 0.2
