"""IncrementalDetokenizer: deltas add up to a full decode for every split of the ids; stop strings when streaming.

Tokenizers: the default model's (byte-level BPE) and two tiny SentencePiece-style ones built here (Unigram with
byte fallback; Llama-2-style normaliser + Strip decoder, and Metaspace pre-tokenizer + decoder).
"""

from __future__ import annotations

import random
import string

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from jaxllm.detokenizer import IncrementalDetokenizer
from jaxllm.sampling_params import SamplingParams

FRAGMENTS = ["the", " ", " ", "Hello", " world", "end", ".", ",", "é", "naïve", "世界", "日本語", "🎉", "👍🏽", "\n",
             "a", "Z", "ß", "STOP", "  ", "wor", "ld"]
PROMPT_TEXT = "Hello world, the"


@pytest.fixture(scope="module")
def smollm():
    from jaxllm.loaders import resolve_model
    from jaxllm.tokenizer import load_tokenizer
    return load_tokenizer(resolve_model(None))


def sentencepiece_tokenizer(style: str) -> PreTrainedTokenizerFast:
    pieces = ["▁", "▁the", "▁Hello", "▁world", "▁wor", "ld", "ello", "▁end", "▁stop", "STOP", ".", ","]
    pieces += [c for c in string.ascii_letters + "!?'" if c not in pieces]
    vocab = ([("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)] + [(f"<0x{b:02X}>", 0.0) for b in range(256)]
             + [(p, -1.0) for p in pieces])
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    if style == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first"),
                                         decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module", params=["smollm", "llama2", "metaspace"])
def tokenizer(request, smollm):
    return smollm if request.param == "smollm" else sentencepiece_tokenizer(request.param)


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def random_text(rng):
    return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12)))


def random_ids(tokenizer, rng):
    """Arbitrary ids: special tokens, pieces of characters, anything, except byte-fallback tokens mixed at random:
    tokenizers' ByteFallback decoder turns every byte of an invalid run into U+FFFD, valid bytes before it
    included, which no streaming decoder can know in advance (encoded text only makes valid runs)."""
    allowed = [i for i, t in enumerate(tokenizer.convert_ids_to_tokens(range(len(tokenizer))))
               if not (t.startswith("<0x") and len(t) == 6)]
    ids = []
    for _ in range(rng.randint(1, 6)):
        ids += encode(tokenizer, rng.choice(FRAGMENTS)) if rng.random() < 0.4 else [rng.choice(allowed)]
    return ids


def stream(tokenizer, prompt, ids, params, rng=None):
    """Feed ids in random chunks (one at a time without rng), the last with finished=True; returns (deltas, detok)."""
    detok = IncrementalDetokenizer(tokenizer, prompt, params)
    deltas, pos = [], 0
    while pos < len(ids) or not deltas:
        size = rng.randint(1, 4) if rng else 1
        chunk, pos = ids[pos:pos + size], pos + size
        deltas.append(detok.update(chunk, finished=pos >= len(ids)))
        if detok.finished:
            break
    return deltas, detok


def continuation(tokenizer, prompt, ids, skip_special_tokens):
    """What a full decode adds to the prompt's text."""
    head = tokenizer.decode(prompt, skip_special_tokens=skip_special_tokens)
    full = tokenizer.decode(prompt + ids, skip_special_tokens=skip_special_tokens)
    assert full.startswith(head)
    return full[len(head):]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_deltas_add_up_to_a_full_decode_for_every_split(tokenizer, skip_special_tokens):
    rng = random.Random(0)
    params = SamplingParams(skip_special_tokens=skip_special_tokens)
    for trial in range(60):
        ids = encode(tokenizer, random_text(rng))
        if trial % 2:
            ids = random_ids(tokenizer, rng)
        prompt = encode(tokenizer, PROMPT_TEXT) if trial % 3 else []
        want = continuation(tokenizer, prompt, ids, skip_special_tokens)
        for split in range(4):
            deltas, detok = stream(tokenizer, prompt, ids, params, rng if split else None)
            assert "".join(deltas) == detok.output_text == want, (ids, deltas)
            if "\ufffd" not in want:
                assert not any("\ufffd" in d for d in deltas)


def test_incomplete_characters_wait_for_their_last_byte(tokenizer):
    prompt = encode(tokenizer, PROMPT_TEXT)
    ids = encode(tokenizer, PROMPT_TEXT + " 🎉")[len(prompt):]
    deltas, _ = stream(tokenizer, prompt, ids, SamplingParams())
    assert "".join(deltas) == " 🎉" and deltas[-1].endswith("🎉") and len(ids) >= 3
    assert all(d in ("", " ") for d in deltas[:-1])


def test_sentencepiece_leading_space_of_the_first_output_token():
    sp = sentencepiece_tokenizer("llama2")
    ids = encode(sp, "Hello world")
    assert stream(sp, [], ids, SamplingParams())[0] == ["Hello", " world"]
    assert stream(sp, encode(sp, "the"), ids, SamplingParams())[0] == [" Hello", " world"]


def test_stop_string_across_token_boundaries(smollm):
    text = "The answer is 42. Done here."
    ids = encode(smollm, text)
    assert "s 42" not in [smollm.decode([i]) for i in ids]  # the stop string spans tokens
    deltas, detok = stream(smollm, [], ids, SamplingParams(stop=["s 42"]))
    assert (detok.output_text, detok.finished_by_stop, "".join(deltas)) == ("The answer i", "s 42", "The answer i")
    deltas, detok = stream(smollm, [], ids, SamplingParams(stop=["s 42"], include_stop_str_in_output=True))
    assert "".join(deltas) == detok.output_text == "The answer is 42"
    deltas, detok = stream(smollm, [], ids, SamplingParams(stop=["Done", "answer"]))
    assert ("".join(deltas), detok.finished_by_stop) == ("The ", "answer")


def test_stop_string_inside_one_multi_token_update(smollm):
    ids = encode(smollm, "one two three four")
    detok = IncrementalDetokenizer(smollm, [], SamplingParams(stop=[" three"]))
    assert detok.update(ids) == "one two" and detok.finished and detok.finished_by_stop == " three"
    with pytest.raises(RuntimeError, match="finished"):
        detok.update(ids[:1])


def test_text_that_may_start_a_stop_string_is_held_back_then_released(smollm):
    ids = encode(smollm, "The answer is 4")
    detok = IncrementalDetokenizer(smollm, [], SamplingParams(stop=["42!"]))
    streamed = "".join(detok.update([i]) for i in ids)
    assert streamed == "The answer is "  # "4" could start "42!"
    assert detok.update([], finished=True) == "4" and detok.finished_by_stop is None
    ids = encode(smollm, "is 4 and more")
    detok = IncrementalDetokenizer(smollm, [], SamplingParams(stop=["42!"]))
    assert [detok.update([i]) for i in ids] == ["is", " ", "", "4 and", " more"]  # "4" waits for " and"


def test_stop_strings_ignore_text_of_the_first_min_tokens(smollm):
    ids = encode(smollm, "The cat. The dog.")
    deltas, detok = stream(smollm, [], ids, SamplingParams(stop=["The"], min_tokens=2))
    assert "".join(deltas) == detok.output_text == "The cat. "


def test_stop_terminated_drops_the_stop_token_text_unless_included(smollm):
    ids = encode(smollm, "Hello there.")
    for include, want in ((False, "Hello there"), (True, "Hello there.")):
        detok = IncrementalDetokenizer(smollm, [], SamplingParams(include_stop_str_in_output=include))
        text = detok.update(ids[:-1]) + detok.update(ids[-1:], stop_terminated=True)
        assert text == detok.output_text == want and detok.finished
    eos = smollm.eos_token_id
    detok = IncrementalDetokenizer(smollm, [], SamplingParams(skip_special_tokens=False))
    assert detok.update(ids + [eos], stop_terminated=True) == "Hello there."


def test_streaming_with_stop_strings_is_consistent_for_every_split(tokenizer):
    rng = random.Random(1)
    for _ in range(40):
        text = random_text(rng)
        ids = encode(tokenizer, text)
        full = continuation(tokenizer, [], ids, True)
        stops = [full[i:i + rng.randint(1, 4)] for i in rng.sample(range(len(full)), min(2, len(full)))]
        stops = [s for s in stops if s.strip()] + ["never-there"]
        include = rng.random() < 0.5
        params = SamplingParams(stop=stops, include_stop_str_in_output=include)
        reference = stream(tokenizer, [], ids, params)[1]
        out, stop = reference.output_text, reference.finished_by_stop
        if stop is None:
            assert out == full and not any(s in full for s in stops)
        else:
            head = out[:len(out) - len(stop)] if include else out
            assert full.startswith(head + stop)
            assert not any(s in (head + stop)[:-1] for s in stops)  # no stop string completed earlier
        for _ in range(3):
            deltas, detok = stream(tokenizer, [], ids, params, rng)
            assert "".join(deltas) == detok.output_text == out and detok.finished_by_stop == stop
