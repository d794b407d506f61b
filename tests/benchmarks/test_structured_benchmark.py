"""benchmarks/structured.py on a tiny random model with the default model's tokenizer: each part runs and reports
what its tables read (the figures themselves come from the default model: benchmarks/RESULTS.md)."""

from __future__ import annotations

import pytest

from jaxllm.llm import LLM
from tests.benchmarks.scripts import load_script

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")


def test_cases_cover_the_constraint_kinds_and_each_check_accepts_and_rejects():
    script = load_script("structured")
    cases = script.cases()
    kinds = {kind: sum(c.kind == kind for c in cases) for kind in ("json", "json_object", "regex", "choice", "grammar")}
    assert kinds["json"] >= 30 and min(kinds.values()) >= 2
    by_name = {c.name: c for c in cases}
    by_name["person"].check('{"name": "Ann", "age": 30}')
    by_name["arithmetic"].check("(1+(2-3))+4")
    for name, text in (("person", '{"name": "Ann", "age": 300}'), ("arithmetic", "(1+2"), ("phone", "555-1234"),
                       ("yes_no", "maybe"), ("object_car", "[1]"), ("event", '{"title": "a", "date": "13/45/2026", '
                                                                               '"attendees": 3}')):
        with pytest.raises((ValueError, AssertionError, jsonschema.ValidationError)):
            by_name[name].check(text)


@pytest.mark.slow
def test_script_parts_on_a_tiny_model(tiny_model_with_tokenizer):
    script = load_script("structured")
    args = script.build_parser().parse_args(["--cases", "1", "--max-tokens", "96", "--compile-schemas", "2",
                                             "--batch", "3", "--records", "1", "--passes", "1"])
    llm = LLM(str(tiny_model_with_tokenizer), max_model_len=512, max_num_seqs=4, max_num_batched_tokens=256)
    results = {"validity": script.run_validity(llm, args), "compile": script.run_compile(llm, args),
               "throughput": script.run_throughput(llm, args)}
    assert [len(records) for records in results["validity"].values()] == [5, 1, 5, 1]  # one case of each kind
    for records in results["validity"].values():
        assert all(r["finish"] in ("stop", "length") and r["valid"] == (r["error"] is None) for r in records)
        assert all(r["matcher_ok"] for r in records)  # the engine sampled no token its grammar forbids
    assert len(results["compile"]["rows"]) == 2 and results["compile"]["first_submit_ms"] > 0
    runs = results["throughput"]["runs"]
    assert list(runs) == ["warm-up", "pass 1"]
    for run in runs.values():  # the unconstrained run generates as many tokens per request as the constrained one
        assert run["constrained"]["lengths"] == run["unconstrained"]["lengths"] == runs["warm-up"]["constrained"][
            "lengths"]
        assert run["constrained"]["host_calls"]["fill"] == run["constrained"]["tokens"]
    assert runs["pass 1"]["constrained"]["compiles"] == runs["pass 1"]["unconstrained"]["compiles"] == 0
    script.report(results)  # the tables render
