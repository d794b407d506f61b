"""Structured outputs through the engine on a tiny random model with the default model's tokenizer: every
constrained output is one the grammar accepts, whatever the batching, the scheduling or the rows beside it.

A random model rambles: JSON is asked for without free whitespace (disable_any_whitespace) and with schemas whose
language is finite, so that each constrained output ends with finish_reason "stop" and can be checked whole.
"""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import numpy as np
import pytest

from jaxllm.compile_counter import CompileCounter
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.llm import LLM
from jaxllm.sampling_params import SamplingParams
from jaxllm.structured_outputs import StructuredOutputsParams
from jaxllm.structured_outputs.compiler import GrammarCompiler
from tests.blocked_packages import run_blocked
from tests.lora.conftest import peft_adapter  # noqa: F401 (a fixture)

xgr = pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": [1, 2, 3]},
                                           "color": {"enum": ["red", "green", "blue"]},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["ok", "size", "color", "tags"], "additionalProperties": False}
CHOICES = ["yes", "no", "perhaps not"]
REGEX = r"[0-9]{3}-[a-z]{2}"
EBNF = 'root ::= "(" item ("," item)? ")"\nitem ::= [a-c] | "xyz"'
EBNF_AS_REGEX = r"\((?:[a-c]|xyz)(?:,(?:[a-c]|xyz))?\)"


def constraints() -> dict[str, StructuredOutputsParams]:
    return {"json": StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
            "choice": StructuredOutputsParams(choice=CHOICES), "regex": StructuredOutputsParams(regex=REGEX),
            "grammar": StructuredOutputsParams(grammar=EBNF)}


def check_output(kind: str, text: str) -> None:
    if kind == "json":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif kind == "choice":
        assert text in CHOICES
    else:
        assert re.fullmatch(REGEX if kind == "regex" else EBNF_AS_REGEX, text), text


@pytest.fixture(scope="module")
def model(tiny_model_with_tokenizer):
    return str(tiny_model_with_tokenizer)


def make_llm(model, **kwargs) -> LLM:
    return LLM(model, **{**dict(max_model_len=160, block_size=8, max_num_seqs=8, max_num_batched_tokens=64),
                         **kwargs})


def workload(num: int, seed: int = 0):
    """(prompt, params, kind or None) triples: every constraint kind, greedy and seeded, beside plain rows."""
    rng = np.random.RandomState(seed)
    kinds = list(constraints()) + [None]
    items = []
    for i in range(num):
        kind = kinds[i % len(kinds)]
        so = None if kind is None else constraints()[kind]
        sampled = dict(temperature=0.9, seed=int(rng.randint(1000))) if i % 2 else dict(temperature=0.0)
        params = SamplingParams(max_tokens=120 if so else 12, structured_outputs=so, **sampled)
        items.append((rng.randint(3, 49152, size=int(rng.randint(2, 30))).tolist(), params, kind))
    return items


def run(llm: LLM, items) -> list:
    outputs = llm.generate([{"prompt_token_ids": p} for p, _, _ in items], [params for _, params, _ in items],
                           use_tqdm=False)
    return [o.outputs[0] for o in outputs]


@pytest.mark.slow
def test_every_constrained_output_is_accepted_and_batching_changes_nothing(model):
    items = workload(20)
    batched = run(make_llm(model), items)
    for (_, _, kind), out in zip(items, batched):
        if kind is not None:
            assert out.finish_reason == "stop", (kind, out.text)
            check_output(kind, out.text)
    sync = run(make_llm(model, async_scheduling=False), items)
    solo_llm = make_llm(model, max_num_seqs=1)
    solo = [run(solo_llm, [item])[0] for item in items[:10]]
    assert [o.token_ids for o in sync] == [o.token_ids for o in batched]
    assert [o.token_ids for o in solo] == [o.token_ids for o in batched[:10]]


@pytest.mark.slow
def test_plain_rows_beside_constrained_rows_are_unchanged(model):
    items = workload(15, seed=1)
    plain = [item for item in items if item[2] is None]
    llm = make_llm(model)
    alone = run(llm, plain)
    beside = [out for (_, _, kind), out in zip(items, run(llm, items)) if kind is None]
    assert [o.token_ids for o in beside] == [o.token_ids for o in alone]


@pytest.mark.slow
def test_preemption_prefix_caching_and_several_samples(model):
    """A pool too small for the batch preempts (matchers keep their state); n > 1 and best_of each follow the
    grammar; a second round meets the first round's blocks in the prefix cache."""
    llm = make_llm(model, num_gpu_blocks=40, max_num_seqs=6)
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    prompts = [{"prompt_token_ids": list(range(5 + i, 45 + i))} for i in range(6)]
    params = [SamplingParams(n=3, temperature=1.0, seed=i, max_tokens=120, structured_outputs=so) if i % 2 else
              SamplingParams(n=2, best_of=3, temperature=0.8, max_tokens=120, structured_outputs=so) for i in range(6)]
    for _ in range(2):
        outputs = llm.generate(prompts, params, use_tqdm=False)
        for output in outputs:
            assert len(output.outputs) in (2, 3)
            for completion in output.outputs:
                assert completion.finish_reason == "stop"
                check_output("json", completion.text)
    stats = llm.engine.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0


@pytest.mark.slow
def test_tensor_parallel_gives_the_same_constrained_outputs(model):
    items = [item for item in workload(10, seed=2) if item[2] is not None]
    one = run(make_llm(model), items)
    two = run(make_llm(model, tensor_parallel_size=2), items)
    assert [o.token_ids for o in two] == [o.token_ids for o in one]


def test_a_request_waits_for_its_grammar_and_the_engine_does_not(model, monkeypatch):
    release = threading.Event()
    original = GrammarCompiler._compile
    monkeypatch.setattr(GrammarCompiler, "_compile", lambda self, grammar: (release.wait(60),
                                                                             original(self, grammar))[1])
    engine = LLMEngine(EngineArgs(model=model, max_model_len=128, block_size=8, max_num_seqs=4))
    engine.add_request("constrained", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=30,
                                                                structured_outputs=StructuredOutputsParams(
                                                                    choice=CHOICES)))
    engine.add_request("plain", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    finished = {}
    for _ in range(20):
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert "plain" in finished and "constrained" not in finished
    assert engine.scheduler.waiting[0].request_id == "constrained"
    release.set()
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert finished["constrained"].outputs[0].text in CHOICES


def test_a_grammar_that_fails_to_compile_ends_its_request_only(model, monkeypatch):
    def fail(self, grammar):
        raise RuntimeError("out of memory while compiling")

    monkeypatch.setattr(GrammarCompiler, "_compile", fail)
    engine = LLMEngine(EngineArgs(model=model, max_model_len=128, block_size=8, max_num_seqs=4))
    so = StructuredOutputsParams(regex="[0-9]+x")
    engine.add_request("bad", [5, 6], SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=so))
    engine.add_request("plain", [5, 6], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert finished["bad"].outputs[0].finish_reason == "abort"
    assert len(finished["plain"].outputs[0].token_ids) == 3


@pytest.mark.parametrize("fields, message", [
    (dict(json={"type": "objec"}), r"structured_outputs.json: .*objec"),
    (dict(json='{"type": "object"'), r"structured_outputs.json: "),
    (dict(regex="a(b"), r"structured_outputs.regex: .*parenthesis"),
    (dict(grammar="root ::= foo"), r"structured_outputs.grammar: .*foo"),
    (dict(json={"type": "string", "pattern": "[a-"}), r"structured_outputs.json: "),
])
def test_a_bad_constraint_is_a_value_error_at_add_request(model, fields, message):
    llm = make_llm(model)
    with pytest.raises(ValueError, match=message):
        llm.engine.add_request("x", [5, 6], SamplingParams(structured_outputs=StructuredOutputsParams(**fields)))
    assert not llm.engine.has_unfinished_requests()
    out = llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=5, structured_outputs=
                                                                   StructuredOutputsParams(choice=["ab"])),
                       use_tqdm=False)
    assert out[0].outputs[0].text == "ab"


@pytest.mark.parametrize("fields, message", [
    (dict(), "exactly one of json, json_object, regex, choice, grammar, structural_tag must be given, got none"),
    (dict(json={}, regex="a"), "exactly one of .* got json, regex"),
    (dict(choice=[]), "choice must be a non-empty list"),
    (dict(choice=["a", 3]), "choice must be a non-empty list of non-empty strings"),
    (dict(regex=""), "regex must be a non-empty string"),
    (dict(json=5), "json must be a JSON schema"),
    (dict(json_object=True, whitespace_pattern=r"\s*"), "whitespace_pattern is not supported"),
])
def test_constraint_fields_are_checked_on_construction(fields, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**fields)


def test_structured_outputs_must_be_its_params_class():
    with pytest.raises(ValueError, match="structured_outputs must be a StructuredOutputsParams, got dict"):
        SamplingParams(structured_outputs={"json": {}})


def test_the_matcher_rolls_back(model):
    from jaxllm.structured_outputs.request_state import RequestGrammar
    from jaxllm.tokenizer import load_tokenizer
    from jaxllm.loaders import resolve_model

    tokenizer = load_tokenizer(resolve_model(model))
    compiler = GrammarCompiler(tokenizer, 49152, (2,))
    grammar = RequestGrammar(compiler.submit(StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)))
    width = -(-49152 // 32)
    masks = np.zeros((3, width), np.int32)
    grammar.fill(masks, 0)
    for token in tokenizer.encode('{"ok"', add_special_tokens=False):
        assert grammar.accept(token)
    grammar.fill(masks, 1)
    assert not np.array_equal(masks[0], masks[1])
    grammar.rollback(grammar.num_accepted)
    grammar.fill(masks, 2)
    np.testing.assert_array_equal(masks[2], masks[0])
    assert not grammar.accept(tokenizer.encode("]", add_special_tokens=False)[0])  # not allowed first


def test_a_grammars_mask_lies_on_its_requests_row_after_speculating_chunks(model):
    """A step's sampled chunks: a speculating one (3 proposals: rows 0-3), the constrained one (row 4), a plain
    one, another speculating (1 proposal: rows 6-7), a second constrained (row 8). Counting one row per chunk put
    the masks on rows 1 and 4, so both constrained requests sampled unmasked."""
    from jaxllm.structured_outputs.request_state import RequestGrammar, step_bitmask
    from jaxllm.tokenizer import load_tokenizer
    from jaxllm.loaders import resolve_model

    compiler = GrammarCompiler(load_tokenizer(resolve_model(model)), 49152, (2,))
    width = -(-49152 // 32)
    choice = RequestGrammar(compiler.submit(StructuredOutputsParams(choice=CHOICES)))
    regex = RequestGrammar(compiler.submit(StructuredOutputsParams(regex=REGEX)))
    bitmask = step_bitmask([None, choice, None, None, regex], [[7, 8, 9], [], [], [7], []], width)  # [9, W]
    assert bitmask.shape == (9, width)
    alone = np.zeros((2, width), np.int32)
    choice.fill(alone, 0)
    regex.fill(alone, 1)
    assert (alone != -1).any(axis=1).all()  # each grammar forbids some tokens
    np.testing.assert_array_equal(bitmask[4], alone[0])
    np.testing.assert_array_equal(bitmask[8], alone[1])
    unconstrained = [row for row in range(9) if row not in (4, 8)]
    assert (bitmask[unconstrained] == -1).all()


def test_a_speculating_grammars_rows_follow_its_proposals_and_its_matcher_is_left_as_it_was(model):
    """A constrained chunk with proposals owns k + 1 rows: row i is the grammar's mask after proposals 1 .. i;
    from a proposal the grammar refuses on, the rows allow every token (that proposal is rejected at the row
    before it); the matcher ends where it began."""
    from jaxllm.structured_outputs.request_state import RequestGrammar, step_bitmask
    from jaxllm.tokenizer import load_tokenizer
    from jaxllm.loaders import resolve_model

    tokenizer = load_tokenizer(resolve_model(model))
    compiler = GrammarCompiler(tokenizer, 49152, (2,))
    width = -(-49152 // 32)
    grammar = RequestGrammar(compiler.submit(StructuredOutputsParams(regex="[0-9]{3}-[a-z]{2}")))
    digits = [tokenizer.encode(c, add_special_tokens=False)[0] for c in "123"]
    letter = tokenizer.encode("x", add_special_tokens=False)[0]  # refused: "-" must follow three digits
    bitmask = step_bitmask([None, grammar], [[5, 6], [*digits, letter, digits[0]]], width)  # rows 0-2, 3-8
    assert bitmask.shape == (9, width)
    expected = np.full((4, width), -1, np.int32)
    grammar.fill(expected, 0)
    for i, token in enumerate(digits):
        assert grammar.accept(token)
        grammar.fill(expected, i + 1)
    grammar.rollback(len(digits))
    np.testing.assert_array_equal(bitmask[3:7], expected)
    assert not np.array_equal(bitmask[3], bitmask[6])  # after three digits the mask is another one
    assert (bitmask[7:] == -1).all() and (bitmask[:3] == -1).all()
    assert grammar.num_accepted == 0
    again = np.zeros((1, width), np.int32)
    grammar.fill(again, 0)
    np.testing.assert_array_equal(again[0], bitmask[3])


@pytest.mark.slow
@pytest.mark.parametrize("speculative", [{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
                                         "self-draft"], ids=["ngram", "draft-model"])
def test_speculation_keeps_constrained_outputs_and_proposes_for_them(model, speculative):
    """Constrained requests speculate: the outputs of plain decoding (greedy and seeded), every one accepted by
    its grammar, and proposals made and accepted for the constrained requests themselves."""
    items = [item for item in workload(16, seed=4) if item[2] is not None]
    items += [([7, 7, 7, 7], SamplingParams(max_tokens=60, structured_outputs=StructuredOutputsParams(
        regex="(ab)+c"), temperature=0.0), "repeats")]  # a loop the proposals can follow
    plain = run(make_llm(model), items)
    spec = {"model": model, "num_speculative_tokens": 3} if speculative == "self-draft" else speculative
    llm = make_llm(model, speculative_config=spec)
    outputs = run(llm, items)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain]
    for (_, _, kind), out in zip(items, outputs):
        if kind != "repeats":
            check_output(kind, out.text)
    stats = llm.engine.stats()
    assert stats["spec_decode_num_draft_tokens"] > 0, stats
    if speculative != "self-draft":  # the draft's proposals are its unconstrained argmax: the grammar refuses most
        assert stats["spec_decode_num_accepted_tokens"] > 0, stats


def test_the_same_constraint_compiles_once(model):
    from jaxllm.tokenizer import load_tokenizer
    from jaxllm.loaders import resolve_model

    compiler = GrammarCompiler(load_tokenizer(resolve_model(model)), 49152, (2,))
    first = compiler.submit(StructuredOutputsParams(regex="[ab]+"))
    assert compiler.submit(StructuredOutputsParams(regex="[ab]+")) is first
    assert compiler.submit(StructuredOutputsParams(regex="[ab]+c")) is not first


def test_without_xgrammar_a_constrained_request_names_the_package(model):
    result = run_blocked(f"""
from jaxllm.engine.args import EngineArgs
from jaxllm.engine.engine import LLMEngine
from jaxllm.sampling_params import SamplingParams
from jaxllm.structured_outputs import StructuredOutputsParams
engine = LLMEngine(EngineArgs(model={model!r}, max_model_len=64, block_size=8, max_num_seqs=2))
try:
    engine.add_request("x", [5], SamplingParams(structured_outputs=StructuredOutputsParams(regex="a")))
except ImportError as e:
    print("ERROR", e)
engine.add_request("y", [5], SamplingParams(max_tokens=2, ignore_eos=True))
while engine.has_unfinished_requests():
    engine.step()
print("served")
""", names=("xgrammar",))
    assert result.returncode == 0, result.stderr
    assert "ERROR structured outputs (JSON schema, regex, choice, grammar) needs the `xgrammar` package: pip " \
           "install xgrammar" in result.stdout and "served" in result.stdout


@pytest.mark.slow
def test_constrained_requests_with_lora_adapters(quantizable_model, peft_adapter):
    """Requests on two adapters and the base model, constrained, batched: each output follows its grammar and
    equals the same request run alone (the tiny Llama with a byte-level tokenizer)."""
    from jaxllm.lora import LoRARequest

    model_dir, _ = quantizable_model("llama3")
    loras = [None] + [LoRARequest(name, i + 1, str(peft_adapter("llama3", name)[0]))
                      for i, name in enumerate(["a", "b"])]
    llm = make_llm(str(model_dir), enable_lora=True, max_loras=2, max_lora_rank=8)
    kinds = ["choice", "regex", "grammar"]
    items = [([3 + i, 40 + i, 9], SamplingParams(temperature=0.0 if i % 2 else 0.7, seed=i, max_tokens=60,
                                                structured_outputs=constraints()[kinds[i % 3]]),
              loras[i % 3], kinds[i % 3]) for i in range(9)]

    def generate(batch):
        return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p, _, _, _ in batch],
                                                   [params for _, params, _, _ in batch], use_tqdm=False,
                                                   lora_request=[lora for _, _, lora, _ in batch])]

    together = generate(items)
    for (_, _, _, kind), out in zip(items, together):
        assert out.finish_reason == "stop"
        check_output(kind, out.text)
    assert [o.token_ids for o in together] == [generate([item])[0].token_ids for item in items]


@pytest.mark.parametrize("config, message", [
    ({"backend": "outlines"}, "backend 'outlines' is not available: auto or xgrammar"),
    ({"disable_any_whitespace": "yes"}, "disable_any_whitespace must be true or false"),
    ({"whitespace": True}, "unknown key 'whitespace'"),
])
def test_the_structured_outputs_config_is_checked(config, message):
    with pytest.raises(ValueError, match=f"structured_outputs_config: {message}"):
        EngineArgs(structured_outputs_config=config)


def test_the_engine_config_makes_json_compact_by_default(model):
    llm = make_llm(model, structured_outputs_config={"disable_any_whitespace": True})
    params = SamplingParams(temperature=0.0, max_tokens=120, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and "\n" not in out.text
    check_output("json", out.text)
    assert params.structured_outputs.disable_any_whitespace is False  # the caller's params are left as they were


def test_a_constraint_sent_again_is_not_parsed_again():
    first = StructuredOutputsParams(json={"type": "object", "properties": {"b": {"type": "integer"}}})
    again = StructuredOutputsParams(json={"type": "object", "properties": {"b": {"type": "integer"}}})
    assert again.parsed() is first.parsed()
    assert StructuredOutputsParams(json={"type": "object"}).parsed() is not first.parsed()


@pytest.mark.slow
def test_a_reasoning_gate_holds_the_grammar_back_until_the_reasoning_ends(model):
    """While the output reasons every token is allowed and none reaches the matcher; the token completing
    </think> opens the gate, and from the next token on the grammar constrains (as a fresh one would)."""
    from jaxllm.structured_outputs.request_state import ReasoningGate, RequestGrammar
    from jaxllm.tokenizer import load_tokenizer
    from jaxllm.loaders import resolve_model

    tokenizer = load_tokenizer(resolve_model(model))
    compiled = GrammarCompiler(tokenizer, 49152, (2,)).submit(StructuredOutputsParams(json=SCHEMA,
                                                                                     disable_any_whitespace=True))
    compiled.result()
    gate = ReasoningGate("</think>", tokenizer.decode)
    grammar, fresh = RequestGrammar(compiled, gate), RequestGrammar(compiled)
    masks = np.zeros((3, -(-49152 // 32)), np.int32)
    fresh.fill(masks, 0)
    thinking = tokenizer.encode("<think>]] not JSON </th", add_special_tokens=False)
    for token in thinking:
        grammar.fill(masks, 1)
        assert (masks[1] == -1).all() and not grammar.is_terminated and not grammar.active
        assert grammar.accept(token)
    assert not gate.open and grammar.num_accepted == 0
    for token in tokenizer.encode("ink>", add_special_tokens=False):
        grammar.accept(token)
    assert gate.open and grammar.active and grammar.num_accepted == 0
    grammar.fill(masks, 2)
    np.testing.assert_array_equal(masks[2], masks[0])
    assert not grammar.accept(tokenizer.encode("]", add_special_tokens=False)[0])
    assert grammar.accept(tokenizer.encode("{", add_special_tokens=False)[0]) and grammar.num_accepted == 1


@pytest.mark.slow
def test_a_constraint_after_reasoning_waits_for_its_end_unless_the_prompt_closed_it(model):
    """reasoning_end set (a server's reasoning parser): a prompt that ends with </think> (thinking disabled by the
    template) is constrained from the first token; one that opens a think section is not constrained while the
    (random) model never closes it."""
    llm = make_llm(model)
    tokenizer = llm.get_tokenizer()
    outputs = {}
    for name, prompt in (("closed", "Answer.<think>\n\n</think>\n\n"), ("open", "Answer.<think>\n")):
        so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
        so.reasoning_end = "</think>"
        params = SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=so)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        outputs[name] = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0]
    assert outputs["closed"].finish_reason == "stop"
    check_output("json", outputs["closed"].text)
    assert outputs["open"].finish_reason == "length" and "</think>" not in outputs["open"].text
    assert not outputs["open"].text.startswith('{"ok":')  # a random model's free text, not the schema's
