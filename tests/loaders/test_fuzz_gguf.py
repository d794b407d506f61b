"""Random corruptions of a valid GGUF file (its bytes, mostly in the metadata and tensor table, and its metadata
values rewritten: absurd integers, NaN, wrong types, missing keys), seeded and bounded in count: each one loads a
still-valid model or is refused by a one-line ModelLoadError naming the file, in bounded time and memory (the
gguf package's reader alone loops without end on an array length that points past the file)."""

from __future__ import annotations

import collections
import math
import random
import struct

import gguf
import pytest

from jaxllm import load_model
from tests.file_corruptions import (HOSTILE_VALUES, assert_finite_params, check_outcome, corrupt_bytes_file,
                                    peak_rss_bytes)
from tests.tiny_models import write_gguf

CASES = 80
SEED = 20240602
V = gguf.GGUFValueType


@pytest.fixture(scope="module")
def gguf_file(tiny_model_dir, tmp_path_factory):
    """The tiny Llama 2 model as a GGUF, with the metadata arrays of a vocabulary (arrays are where a length
    field pointing past the file made the reader loop)."""
    directory = tmp_path_factory.mktemp("gguf")
    plain = write_gguf(tiny_model_dir("llama2")[1], directory / "plain.gguf")
    reader = gguf.GGUFReader(str(plain))
    vocab = [("tokenizer.ggml.tokens", [f"<{i}>" for i in range(256)], V.ARRAY, V.STRING),
             ("tokenizer.ggml.scores", [float(-i) for i in range(256)], V.ARRAY, V.FLOAT32),
             ("tokenizer.ggml.token_type", [1] * 256, V.ARRAY, V.INT32)]
    path = write_with_fields(reader, directory / "model.gguf", "llama", _fields(reader) + vocab)
    load_model(path)  # the template is valid
    return path


def _fields(reader) -> list[tuple]:
    """(key, value, type, array item type) of each metadata field but the architecture (the writer adds it)."""
    return [(key, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
            for key, field in reader.fields.items() if not key.startswith("GGUF.") and key != "general.architecture"]


def write_with_fields(reader, target, arch: str, fields: list[tuple]):
    """`reader`'s tensors written to `target` with these metadata fields."""
    writer = gguf.GGUFWriter(str(target), arch=arch)
    for key, value, vtype, sub_type in fields:
        writer.add_key_value(key, value, vtype, sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def rewrite_metadata(source, target, rng: random.Random) -> str:
    """`source` written again to `target` with one metadata value replaced by a hostile one, or left out."""
    reader = gguf.GGUFReader(str(source))
    arch, fields = reader.fields["general.architecture"].contents(), _fields(reader)
    index = rng.randrange(len(fields) + 1)
    if index == len(fields):
        arch = rng.choice(["gpt2", "", "x" * 5000, "qwen2"])
        write_with_fields(reader, target, arch, fields)
        return f"general.architecture = {arch:.60}"
    key, value = fields[index][0], rng.choice(HOSTILE_VALUES)
    fields[index:index + 1] = [] if value is None else [(key, *_typed(value))]
    write_with_fields(reader, target, arch, fields)
    return f"{key} left out" if value is None else f"{key} = {fields[index][1]!r:.60} as {fields[index][2].name}"


def absurd_length(source, target, rng: random.Random) -> str:
    """`source` copied to `target` with the length of one metadata array or string set to an absurd number."""
    reader = gguf.GGUFReader(str(source))
    key = rng.choice([k for k, f in reader.fields.items() if f.types and f.types[0] in (V.ARRAY, V.STRING)])
    field = reader.fields[key]
    at = field.offset + 8 + len(key.encode()) + 4 + (4 if field.types[0] == V.ARRAY else 0)  # past key and types
    length = rng.choice([2**20, 2**32, 2**40, 2**63])
    data = bytearray(source.read_bytes())
    data[at:at + 8] = struct.pack("<Q", length)
    target.write_bytes(bytes(data))
    return f"{key}: length {length}"


def _typed(value):
    """(value, GGUF value type, array item type) for a hostile value."""
    if isinstance(value, bool):
        return value, V.BOOL, None
    if isinstance(value, int):
        return value % 2**64, V.UINT64 if value >= 2**63 or value < 0 else V.INT64, None
    if isinstance(value, float):
        return value, V.FLOAT64 if math.isfinite(value) and abs(value) > 1e38 else V.FLOAT32, None
    if isinstance(value, str):
        return value, V.STRING, None
    return [1, 2, 3], V.ARRAY, V.INT32  # lists and objects: an array where a scalar belongs


def test_corrupted_gguf_files_load_or_are_refused_by_name(gguf_file, tmp_path):
    header = gguf.GGUFReader(str(gguf_file)).data_offset  # metadata and the tensor table
    baseline = peak_rss_bytes()
    outcomes = collections.Counter()
    for case in range(CASES):
        rng = random.Random(SEED * 1000 + case)
        path = tmp_path / f"case{case}.gguf"
        kind = rng.random()
        if kind < 0.35:
            what = rewrite_metadata(gguf_file, path, rng)
        elif kind < 0.5:
            what = absurd_length(gguf_file, path, rng)
        else:
            path.write_bytes(gguf_file.read_bytes())
            what = corrupt_bytes_file(path, rng, head=header if rng.random() < 0.8 else None)
        what = f"case {case}: {what}"
        outcomes[check_outcome(lambda: assert_finite_params(load_model(path).params), (str(path),), what)] += 1
        path.unlink()
    assert outcomes["refused"] >= CASES // 2, outcomes
    assert peak_rss_bytes() - baseline < 1 << 30
