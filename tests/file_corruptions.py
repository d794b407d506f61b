"""Seeded random corruptions of valid model files, and the one outcome every loader must give them.

Each corruption takes a random.Random and returns a short description of what it did (shown when a case fails):

    corrupt_json_file      a JSON file: a key deleted, added or set to a hostile value (absurd integers, NaN,
                           infinities, wrong types, nesting), or the text truncated
    corrupt_bytes_file     any file: truncated, bytes flipped, a window set to 0xFF (absurd lengths), junk appended
    corrupt_safetensors_header   a safetensors file's header: a tensor's dtype, shape or offsets changed
    corrupt_safetensors_values   a safetensors file's tensors: NaN or an infinity written in, or cast to integers

check_outcome(load, names) runs one load under a time limit and asserts the outcome: a load that returns, or a
refusal (ModelLoadError, or ValueError for the adapter paths that raise it) on one line naming one of `names`.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import resource
import signal
import struct
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

HOSTILE_VALUES = [0, -1, 1, 3, 2**31, 2**63, 10**9, 10**30, 0.5, -0.0, math.nan, math.inf, -math.inf, 1e308, "",
                  "4", "x" * 5000, None, True, False, [], [1], [[2]], {}, {"a": 1}, {"rope_type": "llama3"}]
TIME_LIMIT_S = 10.0  # one load of a tiny model takes well under a second


# ------------------------------------------------------------------ JSON files
def corrupt_json_file(path: Path, rng: random.Random) -> str:
    text = path.read_text()
    if rng.random() < 0.1:
        cut = rng.randrange(len(text))
        path.write_text(text[:cut])
        return f"{path.name}: truncated at {cut}"
    doc = json.loads(text)
    holder, key = _random_slot(doc, rng)
    op = rng.choice(["set", "set", "set", "delete", "add"] if isinstance(holder, dict) else ["set"])
    if op == "delete" and isinstance(holder, dict):
        del holder[key]
        what = f"deleted {key!r}"
    elif op == "add" and isinstance(holder, dict):
        key = rng.choice(["extra", "num_hidden_layers", "rope_scaling", "weight_map", "r", "lora_alpha", "dtype"])
        holder[key] = rng.choice(HOSTILE_VALUES)
        what = f"{key!r} = {_short(holder[key])}"
    else:
        holder[key] = rng.choice(HOSTILE_VALUES) if rng.random() < 0.8 else _scaled(holder[key], rng)
        what = f"{key!r} = {_short(holder[key])}"
    if rng.random() < 0.03:
        doc, what = [doc], what + ", document wrapped in a list"
    path.write_text(json.dumps(doc))
    return f"{path.name}: {what}"


def _random_slot(doc: Any, rng: random.Random) -> tuple[Any, Any]:
    """A (container, key) somewhere in the document, nested ones included."""
    slots: list[tuple[Any, Any]] = []

    def walk(node: Any, depth: int) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
        for key, value in list(items)[:64]:
            slots.append((node, key))
            if depth < 3:
                walk(value, depth + 1)

    walk(doc, 0)
    return rng.choice(slots)


def _scaled(value: Any, rng: random.Random) -> Any:
    """A number pushed far out of its range (others left as they are)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return type(value)(value * rng.choice([0, -1, 10**6, 10**12]))
    return value


# ------------------------------------------------------------------ any file's bytes
def corrupt_bytes_file(path: Path, rng: random.Random, head: int | None = None) -> str:
    """head: flips and windows fall in the first `head` bytes (a header, where the lengths are)."""
    data = bytearray(path.read_bytes())
    span = min(len(data), head or len(data))
    op = rng.choice(["truncate", "flip", "flip", "window", "append"])
    if op == "truncate":
        cut = rng.randrange(len(data))
        data = data[:cut]
        what = f"truncated to {cut} bytes"
    elif op == "flip":
        where = sorted(rng.randrange(span) for _ in range(rng.randint(1, 8)))
        for i in where:
            data[i] ^= 1 << rng.randrange(8)
        what = f"bits flipped at {where}"
    elif op == "window":
        start = rng.randrange(max(span - 8, 1))
        data[start:start + 8] = b"\xff" * len(data[start:start + 8])
        what = f"0xFF x 8 at {start}"
    else:
        data += rng.randbytes(rng.randint(1, 64))
        what = "junk appended"
    path.write_bytes(bytes(data))
    return f"{path.name}: {what}"


# ------------------------------------------------------------------ safetensors files
def corrupt_safetensors_header(path: Path, rng: random.Random) -> str:
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    name = rng.choice([n for n in header if n != "__metadata__"])
    entry = header[name]
    field = rng.choice(["dtype", "shape", "data_offsets"])
    if field == "dtype":
        entry["dtype"] = rng.choice(["I32", "I64", "U8", "BOOL", "F64", "F16", "BF16", "F8_E4M3", "Q4", 7])
    elif field == "shape":
        entry["shape"] = rng.choice([[], [0], [2**40, 2**40], [-1, 4], [1] * 9, [entry["shape"][0]],
                                     list(reversed(entry["shape"]))])
    else:
        begin, end = entry["data_offsets"]
        entry["data_offsets"] = rng.choice([[end, begin], [begin, end + 4], [begin, 2**62], [-4, end], [0, 0]])
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data[8 + size:])
    return f"{path.name}: {name} {field} = {_short(entry[field])}"


def corrupt_safetensors_values(path: Path, rng: random.Random) -> str:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    name = rng.choice(sorted(tensors))
    array = tensors[name].copy()
    op = rng.choice(["nan", "inf", "-inf", "int32", "int8", "float64"])
    if op in ("int32", "int8", "float64"):
        array = array.astype(op)
    else:
        array.reshape(-1)[rng.randrange(array.size)] = float(op)
    tensors[name] = array
    save_file(tensors, str(path))
    return f"{path.name}: {name} {op}"


# ------------------------------------------------------------------ the outcome
class TookTooLong(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """TookTooLong when the block runs longer (a loop in Python code that never ends is broken off). The alarm
    repeats every second: one raised inside a callback that swallows exceptions (a gc callback) is not the last."""
    def expire(signum, frame):
        raise TookTooLong(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_outcome(load: Callable[[], Any], names: tuple[str, ...], what: str,
                  refusals: tuple[type[Exception], ...] = ()) -> str:
    """Run `load`: "loaded", or "refused" by a ModelLoadError (or one of `refusals`) on one line naming one of
    `names`; anything else (another exception, a multi-line message, a message naming no file, a load that runs
    past TIME_LIMIT_S) fails with `what` (the corruption) in the message."""
    from jaxllm import ModelLoadError

    start = time.monotonic()
    try:
        with time_limit(TIME_LIMIT_S):
            load()
        outcome = "loaded"
    except (ModelLoadError, *refusals) as e:
        message = str(e)
        assert "\n" not in message and len(message) < 2000, f"{what}: not one line: {message[:3000]}"
        assert any(name in message for name in names), f"{what}: the error names none of {names}: {message}"
        outcome = "refused"
    except BaseException as e:
        raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e
    assert time.monotonic() - start < TIME_LIMIT_S, what
    return outcome


def peak_rss_bytes() -> int:
    """The process's peak resident memory so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def assert_finite_params(params) -> None:
    """A load that succeeded gave floating-point params, every value finite."""
    import jax

    for leaf in jax.tree_util.tree_leaves(params):
        array = np.asarray(leaf, np.float32)
        assert np.isfinite(array).all()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."
