"""A forced tool call's JSON closed within its token budget (structured_outputs/budget_closing.py), with the default
model's tokenizer and xgrammar: the forced tokens are the grammar's, the outputs parse and follow the schema where
the budget would have cut them, finish_reason says "length", and nothing changes far from the budget."""

from __future__ import annotations

import json
from concurrent.futures import Future

import jsonschema
import numpy as np
import pytest

from jaxllm.llm import LLM
from jaxllm.loaders import resolve_model
from jaxllm.sampling_params import SamplingParams
from jaxllm.structured_outputs import StructuredOutputsParams
from jaxllm.structured_outputs.budget_closing import WINDOW, BudgetCloser
from jaxllm.structured_outputs.compiler import GrammarCompiler
from jaxllm.structured_outputs.request_state import RequestGrammar
from jaxllm.tokenizer import load_tokenizer
from tests.unit.test_json_closing import DOCUMENTS, SCHEMA, VALIDATOR

xgr = pytest.importorskip("xgrammar")
VOCAB = 49152


@pytest.fixture(scope="module")
def model(tiny_model_with_tokenizer):
    return str(tiny_model_with_tokenizer)


@pytest.fixture(scope="module")
def tokenizer(model):
    return load_tokenizer(resolve_model(model))


def forced_schema(schema: dict = SCHEMA) -> StructuredOutputsParams:
    constraint = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    constraint.close_within_budget = True
    return constraint


def allowed_tokens(mask_row: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask_row.view(np.uint8), bitorder="little"))


@pytest.mark.parametrize("document", DOCUMENTS, ids=["unicode", "nested", "enum-array"])
def test_a_reply_cut_anywhere_is_closed_by_grammar_tokens_within_its_budget(tokenizer, document):
    """The model writes the document from a cut on, with budget_at_cut tokens left at the cut; where the document
    does not fit, the closer forces a closing: the grammar takes every forced token and is complete within the
    budget."""
    budget_at_cut = 26  # the longest closing here (from an empty reply) takes 23 tokens
    compiler = GrammarCompiler(tokenizer, VOCAB, (tokenizer.eos_token_id,))
    constraint = forced_schema()
    compiled, vocab = compiler.submit(constraint), compiler.token_bytes()
    vocab.result()  # the engine's requests wait for their grammar; the vocabulary follows it on the same thread
    ids = tokenizer.encode(json.dumps(document, ensure_ascii=False, separators=(", ", ": ")),
                           add_special_tokens=False)
    mask = np.zeros((1, -(-VOCAB // 32)), np.int32)
    num_closed = 0
    for cut in range(len(ids)):
        closer = BudgetCloser(SCHEMA, vocab)
        grammar = RequestGrammar(compiled, closer=closer)
        written = list(ids[:cut])
        for token in written:
            assert grammar.accept(token)
        for budget in range(budget_at_cut, 0, -1):
            if grammar.matcher.is_completed():
                break
            grammar.fill(mask, 0, budget)
            allowed = allowed_tokens(mask[0])
            if len(allowed) > 1 and written == ids[:len(written)]:
                token = ids[len(written)]  # the model's choice, while it follows the document
            else:
                token = int(allowed[0])  # forced; or, once the closer has turned the text, the first allowed
            assert grammar.accept(token)
            written.append(token)
        assert grammar.matcher.is_completed(), (cut, tokenizer.decode(written))
        VALIDATOR.validate(json.loads(tokenizer.decode(written)))
        if written != ids:  # the document did not fit: the closer ended it
            assert closer.used
            num_closed += 1
    assert num_closed > len(ids) // 2


def test_random_walks_through_every_benchmark_tool_set_are_closed_within_their_budget(tokenizer):
    """A writer of random allowed tokens (what a confused model may do) under the forced schemas of the tool
    calling benchmark's 24 tool sets (patterns, $refs, enums, bounds, nested objects and arrays), required and
    named, each walk with the budget its empty reply's closing needs plus a random number of free tokens: every
    reply ends complete within its budget and valid under its schema."""
    from tests.benchmarks.scripts import load_script
    from jaxllm.structured_outputs.json_closing import JsonPrefix
    from jaxllm.tool_calling import named_schema, required_schema

    compiler = GrammarCompiler(tokenizer, VOCAB, (tokenizer.eos_token_id,))
    vocab = compiler.token_bytes().result()
    rng = np.random.default_rng(0)
    mask = np.zeros((1, -(-VOCAB // 32)), np.int32)
    for tools, _ in load_script("tool_calling").TOOL_SETS:
        for schema in (required_schema(tools), named_schema(tools, tools[0]["function"]["name"])):
            compiled = compiler.submit(forced_schema(schema))
            needed = len(vocab.split(JsonPrefix(schema).closing()))
            for _ in range(3):
                grammar = RequestGrammar(compiled, closer=BudgetCloser(schema, compiler.token_bytes()))
                written = []
                for budget in range(needed + 2 + int(rng.integers(0, 60)), 0, -1):
                    if grammar.matcher.is_completed():
                        break
                    grammar.fill(mask, 0, budget)
                    allowed = allowed_tokens(mask[0])
                    token = int(rng.choice(allowed[allowed != tokenizer.eos_token_id]))
                    assert grammar.accept(token)
                    written.append(token)
                text = tokenizer.decode(written)
                assert grammar.matcher.is_completed(), text
                jsonschema.validate(json.loads(text), schema)


def test_nothing_is_forced_before_the_window_nor_without_the_vocabulary(tokenizer):
    compiler = GrammarCompiler(tokenizer, VOCAB, (tokenizer.eos_token_id,))
    compiled = compiler.submit(forced_schema())
    pending = Future()
    grammar = RequestGrammar(compiled, closer=BudgetCloser(SCHEMA, pending))
    plain = RequestGrammar(compiled)
    masks = np.zeros((3, -(-VOCAB // 32)), np.int32)
    grammar.fill(masks, 0, 23)  # the empty reply's closing fits 23 tokens, but the vocabulary is not there yet
    plain.fill(masks, 1)
    np.testing.assert_array_equal(masks[0], masks[1])
    grammar = RequestGrammar(compiled, closer=BudgetCloser(SCHEMA, compiler.token_bytes()))
    compiler.token_bytes().result()
    grammar.fill(masks, 0, WINDOW + 1)
    np.testing.assert_array_equal(masks[0], masks[1])
    grammar.fill(masks, 2, 23)
    assert len(allowed_tokens(masks[2])) == 1 and grammar.closed_by_budget


def run(llm: LLM, constraint: StructuredOutputsParams, max_tokens: int, num: int = 8):
    prompts = [{"prompt_token_ids": list(range(100 + 7 * i, 120 + 7 * i))} for i in range(num)]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, structured_outputs=constraint)
              for i in range(num)]
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


def valid(text: str) -> bool:
    try:
        VALIDATOR.validate(json.loads(text))
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@pytest.mark.slow
def test_a_random_model_s_forced_calls_end_valid_where_the_budget_cuts_them(model):
    """The tiny random model writes strings that never close: cut at max_tokens, its forced calls are invalid
    JSON; closed within the budget, every one parses and follows the schema, finish_reason "length". Far from
    the budget (the tokens before the last WINDOW) the outputs are the model's own. Speculative decoding (its
    proposal rows each with their own budget) gives the same outputs."""
    llm = LLM(model, max_model_len=256, block_size=8, max_num_seqs=8)
    plain = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    cut = run(llm, plain, max_tokens=100)
    closed = run(llm, forced_schema(), max_tokens=100)
    assert sum(not valid(o.text) for o in cut) >= 4  # what the closer is for
    for before, after in zip(cut, closed):
        assert valid(after.text), after.text
        assert len(after.token_ids) <= 100
        assert after.token_ids[:100 - WINDOW] == before.token_ids[:100 - WINDOW]
        if valid(before.text):  # ended by itself, before the closer could act
            assert after.token_ids == before.token_ids and after.finish_reason == before.finish_reason
        else:
            assert after.finish_reason == "length"
    speculating = LLM(model, max_model_len=256, block_size=8, max_num_seqs=8,
                      speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1})
    assert [o.token_ids for o in run(speculating, forced_schema(), max_tokens=100)] == [o.token_ids for o in closed]
    stats = speculating.engine.stats()
    assert stats["spec_decode_num_draft_tokens"] > 0 and stats["spec_decode_num_accepted_tokens"] > 0, stats
