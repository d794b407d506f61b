"""The offline API on the default model: text in, text out, stop strings, chat, streaming deltas."""

from __future__ import annotations

import pytest

from jaxllm import LLM, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=256, max_num_seqs=4)


def test_generate_text_and_stop_string(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    full, = llm.generate("The capital of France is", greedy, use_tqdm=False)
    assert full.prompt == "The capital of France is" and "Paris" in full.outputs[0].text
    assert "." in full.outputs[0].text
    stop = SamplingParams(temperature=0.0, max_tokens=24, stop=["."])
    cut, kept = llm.generate(["The capital of France is"] * 2,
                             [stop, SamplingParams(temperature=0.0, max_tokens=24, stop=["."],
                                                   include_stop_str_in_output=True)], use_tqdm=False)
    head = full.outputs[0].text.split(".")[0]
    assert cut.outputs[0].text == head and cut.outputs[0].finish_reason == "stop"
    assert cut.outputs[0].stop_reason == "."
    assert kept.outputs[0].text == head + "."
    assert cut.metrics.time_to_first_token is not None and cut.metrics.time_to_first_token > 0


def test_chat_and_streaming_deltas_match_the_whole_text(llm):
    reply, = llm.chat([{"role": "user", "content": "Say hello."}], SamplingParams(temperature=0.0, max_tokens=16),
                      use_tqdm=False)
    assert reply.outputs[0].text.strip()
    engine = llm.engine
    engine.add_request("stream", "Once upon a time", SamplingParams(temperature=0.0, max_tokens=20),
                       output_kind="delta")
    pieces, final = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            pieces.append(out.outputs[0].text)
            final = out
    whole, = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=20), use_tqdm=False)
    assert final.finished and "".join(pieces) == whole.outputs[0].text and len(pieces) > 5
