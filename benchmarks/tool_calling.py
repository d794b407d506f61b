"""Tool calling against a real `jaxllm serve` of the default model (started and stopped here): are the calls of
tool_choice "required" and of a named function valid, do streamed calls reassemble into the non-streamed ones,
and how often does the model call a tool by itself under tool_choice "auto" (hermes parser)?

    python benchmarks/tool_calling.py                          # the server's defaults, every check
    python benchmarks/tool_calling.py --modes compact --tool-sets 6 --skip-auto   # a quick look

Each mode is one server: "any-whitespace" has the default structured-output settings, "compact" adds
--structured-outputs-config '{"disable_any_whitespace": true}' (both --enable-auto-tool-choice --tool-call-parser
hermes). A forced tool_choice's JSON is compact in both (the server asks it of its grammar), so the modes differ
only in what other constraints do; the default runs the first.

How to read it:
  forced calls  every tool set (1-5 tools: strings, bounded integers, numbers, booleans, enums, arrays, nested and
                optional fields, $defs/$ref) with its user message, asked with tool_choice "required" (parallel
                calls allowed, then parallel_tool_calls=false) and with its first tool named, at temperature 0 and
                at a seeded temperature 0.8 (--temperatures; "unset" sends neither temperature nor seed, as a
                client that leaves sampling to the server), through the openai client. A reply is valid when it
                has calls, every call's arguments json.loads, names a declared tool (the named one when named,
                one call at most with parallel_tool_calls=false) and validates against that tool's parameters
                (jsonschema). A reply that reached max_tokens (or, with --max-tokens unset, the end of the
                context) has finish_reason "length" (the finish reasons column): the server closes a forced
                call's JSON within that budget, and the reply is judged by its calls as any other.
  langchain     ChatOpenAI(base_url=...).bind_tools(tools, tool_choice="required") on a subset, temperature 0
                (--langchain-temperature unset: ChatOpenAI's default, none sent); valid as above, read from
                AIMessage.tool_calls (invalid_tool_calls must be empty).
  streaming     a subset asked through the openai client's stream helper (client.chat.completions.stream) at
                temperature 0; its final completion must hold the non-streamed reply's calls (name and
                arguments; ids are random) and finish_reason, and each call's arguments must have come in
                several pieces (deltas after the one with the id and name). Each pair is asked alone, the
                non-streamed request then the streamed one: batched beside other requests, a bfloat16 model's
                greedy tokens may part where two logits lie within the batch shape's rounding, and that is not
                what this compares.
  auto          every tool set with tool_choice "auto", temperature 0 (informative: what a 135M model does by
                itself); "parsed" replies have tool_calls, "valid" ones pass the checks above.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import datetime
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import jsonschema
import openai

MODEL = "default"
MODES = {"any-whitespace": [], "compact": ["--structured-outputs-config", '{"disable_any_whitespace": true}']}


def tool(name: str, description: str, properties: dict, required: list[str] | None = None, **extra) -> dict:
    parameters = {"type": "object", "properties": properties, "required": list(properties) if required is None
                  else required, **extra}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


STRING, INTEGER, NUMBER, BOOLEAN = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
WEATHER = tool("get_weather", "Current weather in a city", {
    "city": {"type": "string", "description": "City name"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"])
ADDRESS = {"type": "object", "properties": {"street": STRING, "city": STRING, "zip": {"type": "string",
                                                                                      "pattern": "^[0-9]{5}$"}},
           "required": ["street", "city"]}
MONEY = {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0},
                                          "currency": {"enum": ["USD", "EUR", "GBP", "JPY"]}},
         "required": ["amount", "currency"]}

# (tools, user message): 1 to 5 tools each; the first tool is the one a named tool_choice asks for
TOOL_SETS: list[tuple[list[dict], str]] = [
    ([WEATHER], "What's the weather like in Paris right now?"),
    ([WEATHER, tool("get_time", "Current local time in a timezone", {"timezone": STRING})],
     "What time is it in Tokyo, and is it raining there?"),
    ([tool("add", "Add two integers", {"a": INTEGER, "b": INTEGER})], "What is 17 plus 25?"),
    ([tool("set_thermostat", "Set the thermostat", {
        "temperature": {"type": "integer", "minimum": 10, "maximum": 30},
        "mode": {"enum": ["heat", "cool", "auto"]}}, ["temperature"])],
     "Set the heating to 21 degrees."),
    ([tool("convert_currency", "Convert money to another currency", {
        "amount": {"type": "number", "exclusiveMinimum": 0}, "from": {"type": "string", "minLength": 3,
                                                                       "maxLength": 3},
        "to": {"type": "string", "minLength": 3, "maxLength": 3}})],
     "How many euros is 120.50 US dollars?"),
    ([tool("toggle_light", "Turn a light on or off", {"room": {"enum": ["kitchen", "bedroom", "living room"]},
                                                       "on": BOOLEAN}),
      tool("dim_light", "Set a light's brightness", {"room": STRING, "level": {"type": "integer", "minimum": 0,
                                                                                "maximum": 100}})],
     "Turn off the kitchen light."),
    ([tool("send_email", "Send an email", {
        "to": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "subject": STRING, "body": STRING, "cc": {"type": "array", "items": STRING}}, ["to", "subject", "body"])],
     "Email alice@example.com and bob@example.com that the meeting moved to 3pm."),
    ([tool("search_products", "Search the catalogue", {
        "query": STRING, "max_price": {"type": "number", "minimum": 0},
        "in_stock": BOOLEAN, "limit": {"type": "integer", "minimum": 1, "maximum": 50}}, ["query"]),
      tool("get_product", "One product by id", {"product_id": {"type": "integer", "minimum": 1}}),
      tool("add_to_cart", "Add a product to the cart", {"product_id": INTEGER,
                                                        "quantity": {"type": "integer", "minimum": 1,
                                                                     "maximum": 10}})],
     "Find me running shoes under 80 dollars that are in stock."),
    ([tool("create_user", "Create a user account", {
        "name": STRING, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "address": ADDRESS, "newsletter": BOOLEAN}, ["name", "address"])],
     "Sign up Maria Lopez, 34, living at 12 Oak Street, Springfield 12345."),
    ([tool("book_flight", "Book a flight", {
        "origin": {"type": "string", "pattern": "^[A-Z]{3}$"}, "destination": {"type": "string",
                                                                               "pattern": "^[A-Z]{3}$"},
        "date": STRING, "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"enum": ["economy", "premium", "business", "first"]}}, ["origin", "destination", "date"]),
      tool("cancel_booking", "Cancel a booking", {"booking_id": STRING}),
      WEATHER],
     "Book a business class flight from JFK to LHR on 2026-12-20 for two people."),
    ([tool("create_event", "Add a calendar event", {
        "title": STRING, "start": STRING, "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 480},
        "attendees": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 5},
        "reminder": {"$ref": "#/$defs/reminder"}}, ["title", "start"],
        **{"$defs": {"person": {"type": "object", "properties": {"name": STRING, "email": STRING},
                                "required": ["name"]},
                     "reminder": {"type": "object", "properties": {
                         "minutes_before": {"type": "integer", "minimum": 0, "maximum": 1440},
                         "method": {"enum": ["email", "popup"]}}, "required": ["minutes_before"]}}})],
     "Schedule a 30 minute call with Sam tomorrow at 10:00 and remind me 15 minutes before."),
    ([tool("transfer", "Transfer money between accounts", {
        "from_account": {"$ref": "#/$defs/account"}, "to_account": {"$ref": "#/$defs/account"},
        "money": {"$ref": "#/$defs/money"}, "note": STRING}, ["from_account", "to_account", "money"],
        **{"$defs": {"account": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{6}$"}, "money": MONEY}}),
      tool("balance", "Account balance", {"account": STRING})],
     "Send 250 euros from account DE123456 to account FR654321 for rent."),
    ([tool("calculate", "Evaluate an arithmetic expression", {"expression": STRING,
                                                              "precision": {"type": "integer", "minimum": 0,
                                                                            "maximum": 10}}, ["expression"]),
      tool("unit_convert", "Convert between units", {"value": NUMBER, "from_unit": STRING, "to_unit": STRING})],
     "What is the square root of 2 to 4 decimal places?"),
    ([tool("translate", "Translate text", {"text": STRING, "target_language": {
        "enum": ["French", "German", "Spanish", "Italian", "Japanese"]}, "formal": BOOLEAN}, ["text",
                                                                                             "target_language"])],
     "Translate 'good morning, how are you?' into Spanish."),
    ([tool("run_sql", "Run a read-only SQL query", {"query": STRING, "database": {"enum": ["sales", "hr",
                                                                                          "inventory"]},
                                                    "max_rows": {"type": "integer", "minimum": 1, "maximum": 1000}},
           ["query", "database"]),
      tool("list_tables", "List the tables of a database", {"database": {"enum": ["sales", "hr", "inventory"]}})],
     "How many orders did we have last month in the sales database?"),
    ([tool("set_alarm", "Set an alarm", {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                         "minute": {"type": "integer", "minimum": 0, "maximum": 59},
                                         "days": {"type": "array", "items": {"enum": ["mon", "tue", "wed", "thu",
                                                                                       "fri", "sat", "sun"]},
                                                  "maxItems": 7},
                                         "label": STRING}, ["hour", "minute"])],
     "Wake me up at 6:45 on weekdays."),
    ([tool("order_pizza", "Order a pizza", {
        "size": {"enum": ["small", "medium", "large"]},
        "toppings": {"type": "array", "items": STRING, "maxItems": 5},
        "extra_cheese": BOOLEAN, "delivery": {"type": "object", "properties": {
            "address": STRING, "asap": BOOLEAN, "tip": {"type": "number", "minimum": 0, "maximum": 100}},
            "required": ["address"]}}, ["size", "toppings"])],
     "Order a large pizza with mushrooms and olives delivered to 5 Elm Road."),
    ([tool("get_stock_price", "Latest price of a stock", {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}),
      tool("get_news", "Latest news about a company", {"company": STRING, "limit": {"type": "integer", "minimum": 1,
                                                                                     "maximum": 20}}, ["company"]),
      tool("get_exchange_rate", "Exchange rate between two currencies", {"base": STRING, "quote": STRING}),
      tool("get_weather_forecast", "Forecast for several days", {"city": STRING, "days": {
          "type": "integer", "minimum": 1, "maximum": 14}}),
      tool("get_sports_score", "Latest score of a team", {"team": STRING})],
     "What is Apple's stock price today?"),
    ([tool("create_ticket", "Open a support ticket", {
        "title": STRING, "priority": {"enum": ["low", "medium", "high", "urgent"]},
        "tags": {"type": "array", "items": STRING}, "customer": {"$ref": "#/$defs/customer"}},
        ["title", "priority", "customer"],
        **{"$defs": {"customer": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1},
                                                                   "email": STRING,
                                                                   "plan": {"enum": ["free", "pro", "enterprise"]}},
                                  "required": ["id"]}}}),
      tool("close_ticket", "Close a ticket", {"ticket_id": INTEGER, "resolution": STRING}, ["ticket_id"])],
     "Customer 4821 on the pro plan cannot log in; open an urgent ticket."),
    ([tool("resize_image", "Resize an image", {"url": STRING, "width": {"type": "integer", "minimum": 1,
                                                                         "maximum": 4096},
                                               "height": {"type": "integer", "minimum": 1, "maximum": 4096},
                                               "keep_aspect": BOOLEAN}, ["url", "width"]),
      tool("crop_image", "Crop an image", {"url": STRING, "box": {
          "type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 4, "maxItems": 4}})],
     "Resize https://example.com/cat.png to 800 pixels wide."),
    ([tool("log_workout", "Record a workout", {
        "activity": {"enum": ["run", "cycle", "swim", "walk"]}, "distance_km": {"type": "number", "minimum": 0,
                                                                                "maximum": 500},
        "duration": {"type": "object", "properties": {"hours": {"type": "integer", "minimum": 0},
                                                      "minutes": {"type": "integer", "minimum": 0, "maximum": 59}},
                     "required": ["minutes"]},
        "heart_rate": {"type": ["integer", "null"]}}, ["activity", "duration"])],
     "Log a 5.2 km run that took 28 minutes."),
    ([tool("get_recipe", "Find a recipe", {"dish": STRING, "servings": {"type": "integer", "minimum": 1,
                                                                         "maximum": 12},
                                           "diet": {"type": "array", "items": {"enum": ["vegan", "vegetarian",
                                                                                        "gluten-free", "halal"]}}},
           ["dish"]),
      tool("add_to_shopping_list", "Add items to the shopping list", {"items": {"type": "array", "items": {
          "type": "object", "properties": {"name": STRING, "quantity": {"type": "number", "exclusiveMinimum": 0}},
          "required": ["name"]}, "minItems": 1}}),
      tool("set_timer", "Start a kitchen timer", {"minutes": {"type": "integer", "minimum": 1, "maximum": 240}})],
     "Add 2 kg of flour and a dozen eggs to my shopping list."),
    ([tool("noop_ping", "Check the service is alive", {}, [])], "Is the service up?"),
    ([tool("update_settings", "Change app settings", {
        "theme": {"enum": ["light", "dark", "system"]}, "font_size": {"type": "integer", "minimum": 8,
                                                                      "maximum": 32},
        "notifications": {"type": "object", "properties": {"email": BOOLEAN, "push": BOOLEAN, "quiet_hours": {
            "type": "object", "properties": {"start": {"type": "integer", "minimum": 0, "maximum": 23},
                                             "end": {"type": "integer", "minimum": 0, "maximum": 23}},
            "required": ["start", "end"]}}},
        "language": {"type": "string", "enum": ["en", "fr", "de", "es"]}}, [], additionalProperties=False)],
     "Switch to dark mode and turn off push notifications."),
]


# ----------------------------------------------------------------------------------------------------- checking


def declared(tools: list[dict]) -> dict[str, dict]:
    return {t["function"]["name"]: t["function"]["parameters"] for t in tools}


def call_problem(name: str, arguments: str | dict, tools: list[dict], named: str | None = None) -> str | None:
    """Why one call is invalid (None when it is valid): arguments not JSON, an undeclared (or not the named) tool,
    arguments not valid against the tool's parameters."""
    schemas = declared(tools)
    if name not in schemas:
        return "undeclared tool"
    if named is not None and name != named:
        return "not the named tool"
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return "arguments not JSON"
    try:
        jsonschema.validate(value, schemas[name])
    except jsonschema.ValidationError as e:
        return f"schema: {e.message[:80]}"
    return None


def reply_problem(calls: list[tuple[str, str | dict]], finish: str | None, tools: list[dict], *,
                  named: str | None = None, single: bool = False) -> str | None:
    problem = _calls_problem(calls, tools, named=named, single=single)
    return f"cut by max_tokens: {problem}" if problem and finish == "length" else problem


def _calls_problem(calls: list[tuple[str, str | dict]], tools: list[dict], *, named: str | None,
                   single: bool) -> str | None:
    if not calls:
        return "no calls"
    if single and len(calls) > 1:
        return "several calls with parallel_tool_calls=false"
    return next((p for p in (call_problem(n, a, tools, named) for n, a in calls) if p), None)


# ------------------------------------------------------------------------------------------------------ requests


def request_body(tools: list[dict], message: str, choice: str, temperature: float | None, args) -> dict:
    """temperature None: no temperature and no seed sent, as a client that leaves sampling to the server."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": message}], "tools": tools}
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if temperature is not None and temperature > 0:
        body["seed"] = args.seed
    if choice == "required":
        body["tool_choice"] = "required"
    elif choice == "required, parallel_tool_calls=false":
        body.update(tool_choice="required", parallel_tool_calls=False)
    elif choice == "named":
        body["tool_choice"] = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
    else:
        body["tool_choice"] = choice  # "auto"
    return body


def ask(client: openai.OpenAI, body: dict) -> dict:
    start = time.perf_counter()
    reply = client.chat.completions.create(**body)
    choice = reply.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return {"finish": choice.finish_reason, "calls": calls, "content": choice.message.content,
            "tokens": reply.usage.completion_tokens, "seconds": time.perf_counter() - start}


def ask_streamed(client: openai.OpenAI, body: dict) -> dict:
    """The reply through the openai client's stream helper: its final completion, and how many argument pieces
    each call came in."""
    pieces: collections.Counter = collections.Counter()
    with client.chat.completions.stream(**body) as stream:
        for event in stream:
            if event.type == "chunk" and event.chunk.choices:
                for delta in event.chunk.choices[0].delta.tool_calls or []:
                    pieces[delta.index] += bool(delta.function and delta.function.arguments)
        try:
            choice = stream.get_final_completion().choices[0]
        except openai.LengthFinishReasonError as e:  # the helper refuses to parse a reply cut by max_tokens
            choice = e.completion.choices[0]
    calls = choice.message.tool_calls or []
    return {"finish": choice.finish_reason, "calls": [(c.function.name, c.function.arguments) for c in calls],
            "ids": [c.id for c in calls], "pieces": [pieces[i] for i in range(len(calls))],
            "content": choice.message.content}


def ask_langchain(base_url: str, tools: list[dict], message: str, max_tokens: int | None,
                  temperature: float | None) -> dict:
    """None: ChatOpenAI's default, which sends no max_tokens / temperature."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", temperature=temperature,
                     max_tokens=max_tokens, max_retries=0, timeout=600)
    reply = llm.bind_tools(tools, tool_choice="required").invoke(message)
    calls = [(c["name"], c["args"]) for c in reply.tool_calls]
    finish = reply.response_metadata.get("finish_reason")
    return {"finish": finish, "calls": calls, "invalid": len(reply.invalid_tool_calls)}


def run_all(fn, jobs: list, concurrency: int) -> list:
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda job: fn(*job), jobs))


# --------------------------------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(flags: list[str], timeout: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "jaxllm.entrypoints.cli", "serve", "--port", str(port), "--served-model-name", MODEL,
           "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--log-level", "warning", *flags]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}: {server.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"the server was not healthy after {timeout} s")


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


# -------------------------------------------------------------------------------------------------------- tables


def summarize(rows: list[dict]) -> tuple[str, str, str, str, str]:
    valid = sum(r["problem"] is None for r in rows)
    finishes = collections.Counter(r["finish"] for r in rows)
    problems = collections.Counter(r["problem"] for r in rows if r["problem"])
    tokens = [r["tokens"] for r in rows if "tokens" in r]
    return (f"{valid}/{len(rows)}", ", ".join(f"{k} {v}" for k, v in finishes.most_common()),
            f"{sum(len(r['calls']) for r in rows) / len(rows):.1f}",
            f"{sum(tokens) / len(tokens):.0f}" if tokens else "-",
            "; ".join(f"{k} ({v})" for k, v in problems.most_common()) or "-")


def table(title: str, groups: dict[str, list[dict]]) -> str:
    lines = [f"**{title}**", "", "| request | valid | finish reasons | calls/reply | completion tokens/reply | "
             "invalid because |", "|---|---:|---|---:|---:|---|"]
    lines += [f"| {label} | " + " | ".join(summarize(rows)) + " |" for label, rows in groups.items() if rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- runs


def forced_calls(client: openai.OpenAI, sets: list, args) -> dict[str, list[dict]]:
    choices = ["required", "required, parallel_tool_calls=false", "named"]
    temperatures = args.temperatures
    jobs = [(i, c, t) for t in temperatures for c in choices for i in range(len(sets))]

    def one(i: int, choice: str, temperature: float) -> dict:
        tools, message = sets[i]
        result = ask(client, request_body(tools, message, choice, temperature, args))
        result["problem"] = reply_problem(result["calls"], result["finish"], tools,
                                          named=tools[0]["function"]["name"] if choice == "named" else None,
                                          single=choice.endswith("false"))
        result.update(set=i, choice=choice, temperature=temperature)
        return result

    rows = run_all(one, jobs, args.concurrency)
    return {f"{c}, {temperature_label(t, args.seed)}": [r for r in rows if (r["choice"], r["temperature"]) == (c, t)]
            for t in temperatures for c in choices}


def temperature_label(temperature: float | None, seed: int) -> str:
    if temperature is None:
        return "temperature and seed unset (the server's default sampling)"
    return "T=0" if temperature == 0 else f"T={temperature} seed {seed}"


def temperature_arg(text: str) -> float | None:
    return None if text == "unset" else float(text)


def max_tokens_arg(text: str) -> int | None:
    return None if text == "unset" else int(text)


def langchain_calls(url: str, sets: list, args) -> list[dict]:
    def one(i: int) -> dict:
        tools, message = sets[i]
        try:
            result = ask_langchain(url + "/v1", tools, message, args.max_tokens, args.langchain_temperature)
        except Exception as e:  # noqa: BLE001 - a client-side failure is a result here
            return {"set": i, "finish": "error", "calls": [], "problem": f"{type(e).__name__}: {str(e)[:80]}"}
        result["problem"] = ("invalid_tool_calls" if result["invalid"] else
                             reply_problem(result["calls"], result["finish"], tools))
        result["set"] = i
        return result

    return run_all(one, [(i,) for i in range(min(args.langchain_sets, len(sets)))], args.concurrency)


def streamed_calls(client: openai.OpenAI, sets: list, forced: dict[str, list[dict]], args) -> list[dict]:
    """Streams the first --stream-sets tool sets (temperature 0, every forced choice), each right after the same
    request non-streamed, one request at a time, and compares the two."""
    labels = [label for label in forced if label.endswith("T=0")]
    jobs = [(label, row) for label in labels for row in forced[label] if row["set"] < args.stream_sets]

    def one(label: str, row: dict) -> dict:
        tools, message = sets[row["set"]]
        body = request_body(tools, message, row["choice"], 0.0, args)
        whole, streamed = ask(client, body), ask_streamed(client, body)
        same = streamed["calls"] == whole["calls"] and streamed["finish"] == whole["finish"]
        ids = all(streamed["ids"]) and len(set(streamed["ids"])) == len(streamed["ids"])
        pieces = bool(streamed["pieces"]) and min(streamed["pieces"]) >= 2
        return {"label": label, "set": row["set"], "same": same, "ids": ids, "pieces": pieces,
                "finish": streamed["finish"], "whole": whole, "streamed": streamed}

    return run_all(one, jobs, 1)


def auto_calls(client: openai.OpenAI, sets: list, args) -> list[dict]:
    def one(i: int) -> dict:
        tools, message = sets[i]
        result = ask(client, request_body(tools, message, "auto", 0.0, args))
        result["problem"] = reply_problem(result["calls"], result["finish"], tools)
        result["set"] = i
        result["tagged"] = "<tool_call>" in (result["content"] or "")
        return result

    return run_all(one, [(i,) for i in range(len(sets))], args.concurrency)


def mode_report(mode: str, args, sets: list, out: list[str], raw: dict) -> None:
    model_len = ["--max-model-len", str(args.max_model_len)] if args.max_model_len else []
    flags = [*model_len, "--max-num-seqs", str(args.concurrency), *MODES[mode]]
    server, url = (None, args.url) if args.url else start_server(flags, args.timeout)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=900)
        start = time.perf_counter()
        forced = forced_calls(client, sets, args)
        out.append(table(f"{mode}: forced calls, openai client ({time.perf_counter() - start:.0f} s)", forced))
        raw[mode] = {"forced": forced}
        if args.langchain_sets:
            rows = langchain_calls(url, sets, args)
            label = temperature_label(args.langchain_temperature, None).split(" (")[0]
            out.append(table(f"{mode}: LangChain bind_tools(tool_choice='required'), {label}",
                             {f"first {len(rows)} tool sets": rows}))
            raw[mode]["langchain"] = rows
        if args.stream_sets:
            rows = streamed_calls(client, sets, forced, args)
            lines = [f"**{mode}: streamed vs non-streamed, T=0, first {args.stream_sets} tool sets, each pair "
                     f"alone**", "",
                     "| request | reassembled == non-streamed | unique non-empty ids | every call's arguments "
                     "in >= 2 pieces | argument pieces per call (mean) |", "|---|---:|---:|---:|---:|"]
            for label in dict.fromkeys(r["label"] for r in rows):
                group = [r for r in rows if r["label"] == label]
                counts = [n for r in group for n in r["streamed"]["pieces"]]
                lines.append(f"| {label} | {sum(r['same'] for r in group)}/{len(group)} | "
                             f"{sum(r['ids'] for r in group)}/{len(group)} | "
                             f"{sum(r['pieces'] for r in group)}/{len(group)} | "
                             f"{sum(counts) / max(1, len(counts)):.1f} |")
            out.append("\n".join(lines))
            raw[mode]["stream"] = rows
        if mode == args.modes[0] and not args.skip_auto:
            rows = auto_calls(client, sets, args)
            parsed = sum(bool(r["calls"]) for r in rows)
            tagged = sum(r["tagged"] for r in rows)
            out.append(table("tool_choice 'auto', hermes parser, T=0 (informative)", {"auto": rows}) +
                       f"\n\nreplies with parsed tool_calls: {parsed}/{len(rows)}; content still holding "
                       f"'<tool_call>' (unparsed): {tagged}/{len(rows)}")
            raw["auto"] = rows
    finally:
        if server is not None:
            stop_server(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES)[:1])
    parser.add_argument("--tool-sets", type=int, default=len(TOOL_SETS), help="the first N tool sets")
    parser.add_argument("--langchain-sets", type=int, default=8, help="LangChain on the first N tool sets (0: off)")
    parser.add_argument("--langchain-temperature", type=temperature_arg, default=0.0,
                        help="LangChain's temperature; 'unset' leaves it to the server, as ChatOpenAI's default")
    parser.add_argument("--stream-sets", type=int, default=8, help="streaming on the first N tool sets (0: off)")
    parser.add_argument("--skip-auto", action="store_true", help="no tool_choice 'auto' run")
    parser.add_argument("--max-tokens", type=max_tokens_arg, default=1024, help="ample: the longest reply that "
                        "ended by itself in a trial ran to 577 tokens; 'unset' sends none, as a client that leaves "
                        "it to the server (the rest of the context)")
    parser.add_argument("--seed", type=int, default=1234, help="the seed of the requests with a temperature > 0")
    parser.add_argument("--temperatures", type=temperature_arg, nargs="+", default=[0.0, 0.8],
                        help="the forced calls' temperatures; 'unset' sends neither temperature nor seed")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (also --max-num-seqs)")
    parser.add_argument("--max-model-len", type=int, default=2048, help="0: the model's own")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the server to become healthy")
    parser.add_argument("--url", default=None, help="a running server (served as 'default', hermes parser) "
                        "instead of one started per mode: give one --modes, the one it runs")
    parser.add_argument("--output-json", default=None, help="every reply, for a closer look")
    args = parser.parse_args()
    sets = TOOL_SETS[:args.tool_sets]
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {len(sets)} tool sets, max_tokens {args.max_tokens}\n")
    out: list[str] = []
    raw: dict = {}
    for mode in args.modes:
        mode_report(mode, args, sets, out, raw)
        print("\n\n".join(out) + "\n", flush=True)
        out.clear()
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(raw, f, indent=1, default=str)


if __name__ == "__main__":
    main()
