"""Structured outputs on the default model: are the outputs valid, what does a grammar cost to compile, and what does
constraining a batch cost in throughput.

    python benchmarks/structured.py [--parts validity compile throughput] [--max-tokens 512] [--compile-schemas 40]
                                    [--batch 64] [--records 6] [--passes 3] [--model M] [--output-json F]

validity    every constraint of CASES (JSON schemas of many shapes, json_object, regexes, choices, EBNF grammars)
            through llm.chat with a prompt that asks for it, greedy and sampled (seeded), JSON schemas both with
            the default grammar (any whitespace between tokens) and with disable_any_whitespace. An output is valid
            when it finished with "stop" and passes a check independent of xgrammar: json.loads + jsonschema
            (formats checked), re.fullmatch for regexes, membership for choices, a Python recognizer (a regex, or
            a reduction for the one recursive grammar) for each EBNF grammar. "length" (cut by max_tokens) is
            counted invalid and reported apart. Beside it, whether a fresh xgrammar matcher accepts the output's
            tokens (so an output cut by max_tokens is at least a valid prefix).
compile     GrammarCompiler (the engine's) on distinct 10-field JSON schemas (field names vary, so nothing is
            cached): ms from submit() to the compiled grammar, with the parse alone beside it; then the same
            schemas again: submit() with a new params object (as a new request brings; it parses again), with the
            same object (parse kept), and the first fill (a request's matcher made, its first bitmask row filled).
throughput  --batch chat prompts constrained to one JSON schema (an array of exactly --records bounded records,
            no free whitespace: the output's length is set by the schema, not by the model's rambling), greedy,
            against the same prompts unconstrained with ignore_eos and max_tokens = the constrained output's length
            of the same prompt (measured in the warm-up): both runs generate the same tokens per request, so they
            run the same steps at the same batch sizes and output tok/s compare like for like. Warm-up of both
            first (compiles excluded), then --passes of each, alternating; XLA compiles counted (CompileCounter)
            in every measured run, and the process's CPU time (all its threads: less stretched by other
            processes than wall time, though not immune). `fill`: host time in the engine's _sample_constrained
            (bitmask filled from the grammars, then the sampler sent), with RequestGrammar.fill and .accept apart;
            timed by wrapping them here, not in the library. A run's steps are those the engine processed during
            it: the step a run leaves in flight (dispatched ahead for requests that then ended) is processed by the
            next run, so an unconstrained run after a constrained one shows one _sample_constrained call, no fill.

The machine is shared: each part prints the load average (uptime) beside its figures; read the ratios of runs
made side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import statistics
import time
from collections import Counter
from typing import Any, Callable

import jsonschema
import numpy as np
import xgrammar as xgr

from jaxllm import LLM, SamplingParams
from jaxllm.compile_counter import CompileCounter
from jaxllm.engine.engine import LLMEngine
from jaxllm.structured_outputs import StructuredOutputsParams
from jaxllm.structured_outputs.compiler import GrammarCompiler
from jaxllm.structured_outputs.request_state import RequestGrammar


def obj(properties: dict, required: list[str] | None = None, **extra) -> dict:
    """An object schema; required: every property unless given."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, **extra}


STR = {"type": "string", "maxLength": 24}
POINT = obj({"x": {"type": "integer", "minimum": -100, "maximum": 100},
             "y": {"type": "integer", "minimum": -100, "maximum": 100}})

# (name, what the prompt asks for, schema): nested objects, arrays with minItems/maxItems, enums, anyOf/oneOf,
# numeric bounds, string patterns, formats, lengths, required/optional fields, booleans, null, $ref, maps, unions
SCHEMAS: list[tuple[str, str, dict]] = [
    ("person", "a person", obj({"name": STR, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("address", "a postal address in the USA", obj({"street": STR, "city": STR,
                                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                                    "country": {"enum": ["US", "CA", "MX"]}})),
    ("product", "a product in a shop", obj({"id": {"type": "integer", "minimum": 1},
                                            "name": STR, "price": {"type": "number", "minimum": 0, "maximum": 10000},
                                            "in_stock": {"type": "boolean"},
                                            "tags": {"type": "array", "items": STR, "maxItems": 3}})),
    ("book", "a book", obj({"title": STR, "author": obj({"first": STR, "last": STR}),
                            "year": {"type": "integer", "minimum": 1450, "maximum": 2026},
                            "isbn": {"type": "string", "pattern": "^97[89]-[0-9]{10}$"}})),
    ("weather", "today's weather in a city", obj({"city": STR, "temperature_c": {"type": "number", "minimum": -50,
                                                                                  "maximum": 60},
                                                   "condition": {"enum": ["sunny", "cloudy", "rain", "snow"]},
                                                   "humidity": {"type": "integer", "minimum": 0, "maximum": 100}})),
    ("todo", "a to-do list", obj({"items": {"type": "array", "minItems": 2, "maxItems": 4,
                                            "items": obj({"task": STR, "done": {"type": "boolean"}})}})),
    ("rgb", "an RGB color", obj({c: {"type": "integer", "minimum": 0, "maximum": 255} for c in "rgb"})),
    ("event", "a meeting", obj({"title": STR, "date": {"type": "string", "format": "date"},
                                "attendees": {"type": "integer", "minimum": 0, "maximum": 500}})),
    ("contact", "a contact card", obj({"name": STR, "email": {"type": "string", "format": "email"},
                                       "phone": {"type": "string", "pattern": "^\\+[0-9]{11}$"},
                                       "fax": {"type": "string", "pattern": "^[0-9]{7}$"}},
                                      required=["name", "email", "phone"])),
    ("server", "a server's network address", obj({"host": {"type": "string", "format": "ipv4"},
                                                  "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                                                  "tls": {"type": "boolean"}})),
    ("account", "a user account", obj({"id": {"type": "string", "format": "uuid"},
                                       "username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,15}$"},
                                       "active": {"type": "boolean"}})),
    ("shape", "a geometric shape", obj({"shape": {"anyOf": [
        obj({"kind": {"const": "circle"}, "radius": {"type": "number", "exclusiveMinimum": 0, "maximum": 100}}),
        obj({"kind": {"const": "rectangle"}, "width": {"type": "integer", "minimum": 1, "maximum": 100},
             "height": {"type": "integer", "minimum": 1, "maximum": 100}})]}})),
    ("nullable", "a person whose middle name may be unknown", obj({"first": STR, "middle": {"type": ["string", "null"],
                                                                                            "maxLength": 24},
                                                                   "last": STR, "deceased": {"type": "null"}})),
    ("matrix", "a small matrix of digits", obj({"rows": {"type": "array", "minItems": 2, "maxItems": 3, "items": {
        "type": "array", "minItems": 2, "maxItems": 3, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}})),
    ("recipe", "a recipe", obj({"name": STR, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                                "ingredients": {"type": "array", "minItems": 1, "maxItems": 5, "items": obj(
                                    {"item": STR, "grams": {"type": "number", "minimum": 0, "maximum": 5000}})},
                                "vegetarian": {"type": "boolean"}})),
    ("movie", "a movie review", obj({"title": STR, "rating": {"type": "number", "minimum": 0, "maximum": 10},
                                     "genres": {"type": "array", "minItems": 1, "maxItems": 3,
                                                "items": {"enum": ["drama", "comedy", "action", "horror"]}}})),
    ("coordinates", "the coordinates of a city", obj({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                                      "lon": {"type": "number", "minimum": -180, "maximum": 180}})),
    ("flags", "a set of feature flags", obj({f: {"type": "boolean"} for f in ("dark_mode", "beta", "telemetry",
                                                                             "autosave")})),
    ("mixed_enum", "a status", obj({"status": {"enum": ["ok", 1, None, True, 2.5]}})),
    ("const", "a versioned message", obj({"version": {"const": "1.0"}, "type": {"const": "greeting"},
                                          "text": STR})),
    ("optional", "a profile where only the name is required", obj({"name": STR, "bio": STR,
                                                                    "age": {"type": "integer", "minimum": 0,
                                                                            "maximum": 120},
                                                                    "website": STR}, required=["name"])),
    ("company", "a company and its CEO", obj({"company": obj({"name": STR, "ceo": obj({"name": STR, "contact": obj(
        {"email": {"type": "string", "format": "email"}})})})})),
    ("invoice", "an invoice", obj({"lines": {"type": "array", "minItems": 1, "maxItems": 3, "items": obj({
        "sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{3}$"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 99},
        "unit_price": {"type": "number", "minimum": 0, "maximum": 1000}})},
        "total": {"type": "number", "minimum": 0}})),
    ("refs", "a line segment", {"$defs": {"point": POINT}, **obj({"start": {"$ref": "#/$defs/point"},
                                                                  "end": {"$ref": "#/$defs/point"}})}),
    ("one_of", "a payment", obj({"payment": {"oneOf": [
        obj({"method": {"const": "card"}, "last4": {"type": "string", "pattern": "^[0-9]{4}$"}}),
        obj({"method": {"const": "cash"}, "amount": {"type": "integer", "minimum": 1, "maximum": 1000}})]}})),
    ("top_array", "a list of lottery numbers", {"type": "array", "minItems": 3, "maxItems": 5,
                                                 "items": {"type": "integer", "minimum": 1, "maximum": 49}}),
    ("string_length", "a discount code", obj({"code": {"type": "string", "minLength": 4, "maxLength": 8}})),
    ("exclusive", "a percentage strictly between 0 and 100", obj({"pct": {"type": "integer", "exclusiveMinimum": 0,
                                                                         "exclusiveMaximum": 100}})),
    ("sentiment", "the sentiment of 'I love this phone'", obj({"label": {"enum": ["positive", "negative",
                                                                                  "neutral"]},
                                                               "confidence": {"type": "number", "minimum": 0,
                                                                              "maximum": 1}})),
    ("map", "a shop's inventory counts by item", {"type": "object", "additionalProperties": {
        "type": "integer", "minimum": 0, "maximum": 1000}, "maxProperties": 4}),
    ("playlist", "a music playlist", obj({"name": STR, "songs": {"type": "array", "minItems": 1, "maxItems": 3,
                                                                "items": obj({"title": STR,
                                                                              "seconds": {"type": "integer",
                                                                                          "minimum": 30,
                                                                                          "maximum": 600},
                                                                              "artists": {"type": "array",
                                                                                          "minItems": 1,
                                                                                          "maxItems": 2,
                                                                                          "items": STR}})}})),
    ("union", "a measurement", obj({"value": {"type": ["integer", "string"], "maxLength": 12},
                                    "unit": {"enum": ["m", "kg", "s"]}})),
    ("month", "a month of the year", obj({"month": {"enum": ["January", "February", "March", "April", "May",
                                                             "June", "July", "August", "September", "October",
                                                             "November", "December"]}})),
    ("hex_color", "a theme", obj({"primary": {"type": "string", "pattern": "^#[0-9a-f]{6}$"},
                                  "secondary": {"type": "string", "pattern": "^#[0-9a-f]{6}$"},
                                  "rounded": {"type": "boolean"}})),
]

REGEXES: list[tuple[str, str, str]] = [  # (name, what the prompt asks for, regex)
    ("phone", "a US phone number", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    ("date", "today's date", r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"),
    ("ipv4", "an IPv4 address", r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])"),
    ("hex", "a hex color", r"#[0-9a-fA-F]{6}"),
    ("words", "three to five lowercase words", r"[a-z]+( [a-z]+){2,4}"),
    ("email", "an email address", r"[a-z]{3,10}@[a-z]{3,8}\.(com|org|net)"),
]

CHOICES: list[tuple[str, str, list[str]]] = [  # (name, question, choices)
    ("sentiment", "What is the sentiment of 'This movie was great'?", ["positive", "negative", "neutral"]),
    ("yes_no", "Is the sky blue?", ["yes", "no"]),
    ("capital", "What is the capital of France?", ["Paris", "London", "Berlin", "New York City"]),
    ("color", "What color is grass?", ["red", "green", "blue", "dark green"]),
    ("quote", 'Which is a quotation mark?', ['"', "'", "none of \"these\""]),
]


def _arithmetic(text: str) -> bool:
    """root ::= expr; expr ::= term (("+" | "-") term)*; term ::= [0-9]+ | "(" expr ")": innermost groups reduced."""
    flat = r"[0-9]+([+-][0-9]+)*"
    while True:
        reduced = re.sub(r"\((" + flat + r")\)", "0", text)
        if reduced == text:
            return re.fullmatch(flat, text) is not None
        text = reduced


GRAMMARS: list[tuple[str, str, str, Callable[[str], bool]]] = [  # (name, what to write, EBNF, Python recognizer)
    ("sql", "an SQL query on the users table",
     'root ::= "SELECT " col (", " col)* " FROM " table ";"\ncol ::= "name" | "age" | "city"\n'
     'table ::= "users" | "orders"',
     lambda t: re.fullmatch(r"SELECT (name|age|city)(, (name|age|city))* FROM (users|orders);", t) is not None),
    ("query_string", "a URL query string", 'root ::= pair ("&" pair)*\npair ::= [a-z]+ "=" [0-9]+',
     lambda t: re.fullmatch(r"[a-z]+=[0-9]+(&[a-z]+=[0-9]+)*", t) is not None),
    ("answer", "whether cats can fly, with a reason", 'root ::= ("yes" | "no") ", because " [a-z ]+ "."',
     lambda t: re.fullmatch(r"(yes|no), because [a-z ]+\.", t) is not None),
    ("arithmetic", "an arithmetic expression", 'root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
                                               'term ::= [0-9]+ | "(" expr ")"', _arithmetic),
    ("string_list", "a list of fruits", 'root ::= "[" item (", " item)* "]"\nitem ::= "\\"" [a-z]+ "\\""',
     lambda t: re.fullmatch(r'\["[a-z]+"(, "[a-z]+")*\]', t) is not None),
    ("log_line", "a log line", 'root ::= level ": " msg\nlevel ::= "INFO" | "WARN" | "ERROR"\nmsg ::= [A-Za-z ]+',
     lambda t: re.fullmatch(r"(INFO|WARN|ERROR): [A-Za-z ]+", t) is not None),
]

FORMATS = jsonschema.FormatChecker()  # date, email, ipv4, uuid, ... (those its installed extras support)


@dataclasses.dataclass
class Case:
    kind: str  # json, json_object, regex, choice, grammar
    name: str
    prompt: str
    constraint: Any  # the schema, regex, choices or grammar (True for json_object)
    recognizer: Callable[[str], bool] | None = None  # grammar: the Python check

    def params(self, no_whitespace: bool) -> StructuredOutputsParams:
        if self.kind == "json":
            return StructuredOutputsParams(json=self.constraint, disable_any_whitespace=no_whitespace)
        return StructuredOutputsParams(**{self.kind: self.constraint})

    def check(self, text: str) -> None:
        """Raises (ValueError, jsonschema.ValidationError, AssertionError) when text is not valid."""
        if self.kind == "json":
            jsonschema.validate(json.loads(text), self.constraint, format_checker=FORMATS)
        elif self.kind == "json_object":
            assert isinstance(json.loads(text), dict), "not an object"
        elif self.kind == "regex":
            assert re.fullmatch(self.constraint, text), "no full match"
        elif self.kind == "choice":
            assert text in self.constraint, "not a choice"
        else:
            assert self.recognizer(text), "not derived by the grammar"


def cases() -> list[Case]:
    out = [Case("json", name, f"Reply with only a JSON value describing {what}. It must follow this JSON schema: "
                f"{json.dumps(schema)}", schema) for name, what, schema in SCHEMAS]
    out += [Case("json_object", "object_" + what.split()[-1], f"Reply with only a JSON object describing {what}.",
                 True) for what in ("a car", "a city")]
    out += [Case("regex", name, f"Reply with only {what}, matching the regular expression {regex}", regex)
            for name, what, regex in REGEXES]
    out += [Case("choice", name, f"{question} Answer with one of: {', '.join(choices)}.", choices)
            for name, question, choices in CHOICES]
    out += [Case("grammar", name, f"Reply with only {what}, following this grammar:\n{ebnf}", ebnf, recognizer)
            for name, what, ebnf, recognizer in GRAMMARS]
    return out


# ---------------------------------------------------------------------------------------------------- validity
def first_of_each_kind(items: list[Case], count: int) -> list[Case]:
    seen = Counter()
    return [case for case in items if seen.update([case.kind]) or seen[case.kind] <= count]


def validity_mode(llm: LLM, compiler: GrammarCompiler, items: list[Case], no_whitespace: bool, seeded: bool,
                  max_tokens: int, temperature: float) -> list[dict]:
    """One chat run over items; a record per case: kind, name, finish reason, valid, tokens, why not valid."""
    params = [SamplingParams(max_tokens=max_tokens, structured_outputs=case.params(no_whitespace),
                             **(dict(temperature=temperature, seed=1000 + i) if seeded else dict(temperature=0.0)))
              for i, case in enumerate(items)]
    outputs = llm.chat([[{"role": "user", "content": case.prompt}] for case in items], params, use_tqdm=False)
    compiled = [compiler.submit(p.structured_outputs).result() for p in params]
    return [judge(case, out.outputs[0], grammar) for case, out, grammar in zip(items, outputs, compiled)]


def judge(case: Case, completion, compiled) -> dict:
    """valid: finished "stop" and passes the case's check. matcher_ok: a fresh xgrammar matcher of the same
    compiled grammar accepts every output token (EOS included) and, when it finished "stop", is terminated: the
    engine never sampled a token its grammar forbids, even in an output cut by max_tokens."""
    record = dict(kind=case.kind, name=case.name, finish=completion.finish_reason, tokens=len(completion.token_ids),
                  text=completion.text, valid=False, error=None, matcher_ok=matcher_accepts(compiled, completion))
    try:
        case.check(completion.text)
        record["valid"] = completion.finish_reason == "stop"
        if not record["valid"]:
            record["error"] = f"passes its check but finished {completion.finish_reason!r}"
    except (ValueError, AssertionError, jsonschema.ValidationError) as e:
        cut = "cut by max_tokens; " if completion.finish_reason == "length" else ""
        record["error"] = f"{cut}{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return record


def matcher_accepts(compiled, completion) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    if not all(matcher.accept_token(token) for token in completion.token_ids):
        return False
    return completion.finish_reason != "stop" or matcher.is_terminated()


def run_validity(llm: LLM, args) -> dict:
    """Every case in every mode (JSON schemas with and without free whitespace; the others once per sampling)."""
    all_cases = cases() if not args.cases else first_of_each_kind(cases(), args.cases)
    results, compiler = {}, grammar_compiler(llm)
    for seeded in (False, True):
        for no_ws in (False, True):
            items = [c for c in all_cases if c.kind == "json" or not no_ws]
            label = f"{'seeded' if seeded else 'greedy'}, {'no whitespace' if no_ws else 'any whitespace'}"
            start = time.perf_counter()
            results[label] = validity_mode(llm, compiler, items, no_ws, seeded, args.max_tokens, args.temperature)
            print(f"validity {label}: {len(items)} requests in {time.perf_counter() - start:.1f} s, {load()}",
                  flush=True)
    compiler.shutdown()
    return results


def grammar_compiler(llm: LLM) -> GrammarCompiler:
    """A compiler of the engine's vocabulary, apart from the engine's own (its cache is not touched)."""
    engine = llm.engine
    return GrammarCompiler(engine.tokenizer, engine.model_config.vocab_size, engine.eos_token_ids)


def validity_table(results: dict) -> str:
    lines = ["| mode | kind | valid / total | finish reasons | fresh matcher accepts | output tokens p50 / max |",
             "|---|---|---:|---|---:|---:|"]
    for label, records in results.items():
        for kind in dict.fromkeys(r["kind"] for r in records):
            rows = [r for r in records if r["kind"] == kind]
            finishes = ", ".join(f"{k} {v}" for k, v in Counter(r["finish"] for r in rows).most_common())
            tokens = [r["tokens"] for r in rows]
            lines.append(f"| {label} | {kind} | {sum(r['valid'] for r in rows)} / {len(rows)} | {finishes} | "
                         f"{sum(r['matcher_ok'] for r in rows)} / {len(rows)} | {statistics.median(tokens):.0f} / "
                         f"{max(tokens)} |")
    return "\n".join(lines)


def invalid_report(results: dict) -> str:
    return "\n".join(f"  {label} / {r['kind']} {r['name']}: finish {r['finish']}, {r['tokens']} tokens, fresh matcher "
                     f"accepts: {r['matcher_ok']}: {r['error']}; "
                     f"text {r['text'][:120]!r}{'...' if len(r['text']) > 120 else ''}"
                     for label, records in results.items() for r in records if not r["valid"])


# ---------------------------------------------------------------------------------------------------- compile time
TEN_FIELDS = [({"type": "string", "maxLength": 32}, True), ({"type": "integer", "minimum": 0, "maximum": 150}, True),
              ({"type": "number", "minimum": 0}, True), ({"type": "boolean"}, True),
              ({"enum": ["new", "open", "closed"]}, True), ({"type": "string", "format": "email"}, False),
              ({"type": "array", "items": {"type": "string"}, "maxItems": 5}, True),
              (obj({"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}), False),
              ({"type": ["string", "null"]}, False), ({"type": "string", "format": "date"}, True)]


def ten_field_schema(i: int) -> dict:
    """A typical 10-field object schema; i varies the field names (distinct text: no cache hit)."""
    names = [f"{base}_{i}" for base in ("name", "age", "score", "active", "status", "email", "tags", "address",
                                         "nickname", "joined")]
    return obj({n: field for n, (field, _) in zip(names, TEN_FIELDS)},
               required=[n for n, (_, req) in zip(names, TEN_FIELDS) if req])


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


def compile_once(compiler: GrammarCompiler, schema: dict, bitmask: np.ndarray) -> dict:
    """ms of one schema: parse alone, parse + compile (fresh), cached submit (new params / same params), first
    fill."""
    start = time.perf_counter()
    StructuredOutputsParams(json=schema).parsed()
    parse = ms(start)
    params = StructuredOutputsParams(json=schema)
    start = time.perf_counter()
    compiler.submit(params).result()
    compile_ms = ms(start)
    start = time.perf_counter()
    future = compiler.submit(StructuredOutputsParams(json=schema))
    cached_new = ms(start)
    start = time.perf_counter()
    compiler.submit(params).result()
    cached_same = ms(start)
    start = time.perf_counter()
    RequestGrammar(future).fill(bitmask, 0)
    first_fill = ms(start)
    return dict(parse=parse, compile=compile_ms, cached_new=cached_new, cached_same=cached_same,
                first_fill=first_fill, cached_total=cached_new + first_fill)


def run_compile(llm: LLM, args) -> dict:
    compiler = grammar_compiler(llm)
    bitmask = np.zeros((1, -(-llm.engine.model_config.vocab_size // 32)), np.int32)
    start = time.perf_counter()
    compiler.submit(StructuredOutputsParams(json=ten_field_schema(-1))).result()
    first = ms(start)  # builds the vocabulary's TokenizerInfo once
    rows = [compile_once(compiler, ten_field_schema(i), bitmask) for i in range(args.compile_schemas)]
    compiler.shutdown()
    print(f"compile: {len(rows)} schemas, {load()}", flush=True)
    return dict(first_submit_ms=first, rows=rows)


def compile_table(result: dict) -> str:
    lines = ["| what | p50 ms | p90 ms | max ms |", "|---|---:|---:|---:|"]
    names = {"compile": "compile: submit() -> compiled, new schema (parse + compile)", "parse": "  of which: parse",
             "cached_new": "cached: submit(), new params object (parses again)",
             "cached_same": "cached: submit(), same params object", "first_fill": "first fill (matcher + 1 row)",
             "cached_total": "cached, new params + first fill"}
    for key, label in names.items():
        values = [row[key] for row in result["rows"]]
        lines.append(f"| {label} | {percentile(values, 50):.2f} | {percentile(values, 90):.2f} | {max(values):.2f} |")
    first = f"first submit of the process (TokenizerInfo built): {result['first_submit_ms']:.0f} ms"
    return "\n".join(lines) + "\n\n" + first


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


# ---------------------------------------------------------------------------------------------------- throughput
RECORD = obj({"id": {"type": "integer", "minimum": 0, "maximum": 9999}, "name": {"type": "string", "maxLength": 16},
              "score": {"type": "integer", "minimum": 0, "maximum": 100}, "ok": {"type": "boolean"},
              "tag": {"enum": ["red", "green", "blue", "gold"]}}, additionalProperties=False)
THINGS = [f"{adjective} {noun}" for adjective in ("famous", "cheap", "old", "small", "fast", "rare", "popular", "new")
          for noun in ("books", "cars", "cities", "songs", "games", "plants", "tools", "movies")]


def batch_schema(records: int) -> dict:
    """An array of exactly `records` bounded records: the output's length is set by the schema."""
    return obj({"records": {"type": "array", "minItems": records, "maxItems": records, "items": RECORD}},
               additionalProperties=False)


def batch_prompts(batch: int, records: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"List {records} {THINGS[i % len(THINGS)]} as JSON records with an id, a "
                                         f"name, a score, ok and a tag."}] for i in range(batch)]


class HostTimers:
    """Wall time in LLMEngine._sample_constrained (fill + sampler dispatch), RequestGrammar.fill and .accept: the
    class attributes are wrapped while the timers are active (in this process only; the library is unchanged)."""

    TARGETS = ((LLMEngine, "_sample_constrained"), (RequestGrammar, "fill"), (RequestGrammar, "accept"))

    def __init__(self):
        self.seconds, self.calls, self._originals = Counter(), Counter(), {}

    def __enter__(self) -> "HostTimers":
        for owner, name in self.TARGETS:
            self._originals[owner, name] = getattr(owner, name)
            setattr(owner, name, self._timed(name, self._originals[owner, name]))
        return self

    def __exit__(self, *exc_info) -> None:
        for (owner, name), original in self._originals.items():
            setattr(owner, name, original)

    def _timed(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.calls[name] += 1
        return timed


def timed_run(llm: LLM, prompts, params, timers: HostTimers) -> dict:
    timers.seconds.clear(), timers.calls.clear()
    steps = llm.engine.num_steps
    with CompileCounter() as compiles:
        start, cpu_start = time.perf_counter(), time.process_time()
        outputs = llm.chat(prompts, params, use_tqdm=False)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    lengths = [len(out.outputs[0].token_ids) for out in outputs]
    return dict(wall_s=wall, cpu_s=cpu, tokens=sum(lengths), tok_s=sum(lengths) / wall, lengths=lengths,
                steps=llm.engine.num_steps - steps, compiles=compiles.count,
                compiled=sorted({name for name, _ in compiles.events}),
                finishes=dict(Counter(out.outputs[0].finish_reason for out in outputs)),
                host_s={k: v for k, v in timers.seconds.items()}, host_calls=dict(timers.calls),
                texts=[out.outputs[0].text for out in outputs])


def run_throughput(llm: LLM, args) -> dict:
    prompts = batch_prompts(args.batch, args.records)
    schema = StructuredOutputsParams(json=batch_schema(args.records), disable_any_whitespace=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, structured_outputs=schema)
    runs = {"warm-up": {}}
    with HostTimers() as timers:
        runs["warm-up"]["constrained"] = timed_run(llm, prompts, constrained, timers)
        lengths = runs["warm-up"]["constrained"]["lengths"]
        plain = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
        runs["warm-up"]["unconstrained"] = timed_run(llm, prompts, plain, timers)
        for i in range(args.passes):
            order = ("constrained", "unconstrained") if i % 2 == 0 else ("unconstrained", "constrained")
            runs[f"pass {i + 1}"] = {kind: timed_run(llm, prompts, constrained if kind == "constrained" else plain,
                                                     timers) for kind in order}
            print(f"throughput pass {i + 1}: {load()}", flush=True)
    return dict(schema=batch_schema(args.records), runs=runs)


def throughput_table(result: dict) -> str:
    lines = ["| run | workload | output tokens | steps | wall s | output tok/s | constrained / unconstrained | "
             "process CPU s (c / u) | XLA compiles | _sample_constrained ms x calls (fill, accept: ms in all) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for label, runs in result["runs"].items():
        ratio = runs["constrained"]["tok_s"] / runs["unconstrained"]["tok_s"]
        cpu_ratio = runs["constrained"]["cpu_s"] / runs["unconstrained"]["cpu_s"]
        for kind, run in runs.items():
            host, calls = run["host_s"], run["host_calls"]
            fill = "-" if not calls.get("_sample_constrained") else (
                f"{host['_sample_constrained'] / calls['_sample_constrained'] * 1e3:.2f} x "
                f"{calls['_sample_constrained']} ({host.get('fill', 0) * 1e3:.0f}, {host.get('accept', 0) * 1e3:.0f})")
            lines.append(f"| {label} | {kind} | {run['tokens']} | {run['steps']} | {run['wall_s']:.2f} | "
                         f"{run['tok_s']:.1f} | {ratio:.3f} | {run['cpu_s']:.1f} ({cpu_ratio:.3f}) | "
                         f"{run['compiles']} | {fill} |")
    return "\n".join(lines)


def throughput_summary(result: dict) -> str:
    passes = [runs for label, runs in result["runs"].items() if label != "warm-up"]
    ratios = [r["constrained"]["tok_s"] / r["unconstrained"]["tok_s"] for r in passes]
    cpu = [r["constrained"]["cpu_s"] / r["unconstrained"]["cpu_s"] for r in passes]
    lengths = {tuple(r["constrained"]["lengths"]) for r in result["runs"].values()}
    warm = result["runs"]["warm-up"]["constrained"]
    return (f"ratio constrained / unconstrained: median {statistics.median(ratios):.3f} (passes: "
            f"{', '.join(f'{r:.3f}' for r in ratios)}); process CPU time constrained / unconstrained: median "
            f"{statistics.median(cpu):.3f}; compiles in measured runs: "
            f"{sum(r[k]['compiles'] for r in passes for k in r)}; constrained lengths the same every run: "
            f"{len(lengths) == 1}; output tokens per request: min {min(warm['lengths'])}, median "
            f"{statistics.median(warm['lengths']):.0f}, max {max(warm['lengths'])}; finishes {warm['finishes']}")


# ---------------------------------------------------------------------------------------------------- main
def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("validity", "compile", "throughput"),
                        default=["validity", "compile", "throughput"])
    parser.add_argument("--model", default=None, help="default: the default model")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.8, help="of the seeded validity runs")
    parser.add_argument("--cases", type=int, default=0, help="validity: only the first N cases of each kind (0: all)")
    parser.add_argument("--compile-schemas", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--records", type=int, default=6, help="records in each throughput output")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--output-json", default=None)
    return parser


def report(results: dict) -> None:
    if "validity" in results:
        print(validity_table(results["validity"]))
        print("not valid:\n" + (invalid_report(results["validity"]) or "  none"))
    if "compile" in results:
        print(compile_table(results["compile"]))
    if "throughput" in results:
        print(throughput_table(results["throughput"]))
        print(throughput_summary(results["throughput"]))


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    print(f"start {utc()}, {load()}", flush=True)
    llm = LLM(args.model, max_num_seqs=max(64, args.batch))
    parts = dict(validity=run_validity, compile=run_compile, throughput=run_throughput)
    results = {part: parts[part](llm, args) for part in args.parts}
    print(f"end {utc()}, {load()}", flush=True)
    report(results)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"args": vars(args), **results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
