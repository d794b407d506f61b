"""gguf_file.GGUFFile reads what the gguf package's writer wrote: every metadata value type and the tensor table,
the same values the gguf package's reader gives."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from jaxllm.loaders.gguf_file import GGUFFile, StringArray

V = gguf.GGUFValueType


@pytest.fixture
def written(tmp_path):
    path = tmp_path / "all_types.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    values = {"t.u8": (7, V.UINT8), "t.i8": (-7, V.INT8), "t.u16": (700, V.UINT16), "t.i16": (-700, V.INT16),
              "t.u32": (7 << 20, V.UINT32), "t.i32": (-(7 << 20), V.INT32), "t.f32": (0.5, V.FLOAT32),
              "t.bool": (True, V.BOOL), "t.str": ("héllo", V.STRING), "t.u64": (7 << 40, V.UINT64),
              "t.i64": (-(7 << 40), V.INT64), "t.f64": (0.25, V.FLOAT64)}
    for key, (value, vtype) in values.items():
        writer.add_key_value(key, value, vtype)
    writer.add_key_value("t.strings", ["a", "", "ü", "<|im_end|>"] * 50, V.ARRAY, V.STRING)
    writer.add_key_value("t.ints", list(range(-5, 300)), V.ARRAY, V.INT32)
    writer.add_key_value("t.floats", [0.5, -1.0], V.ARRAY, V.FLOAT32)
    tensors = {"plain": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "half": np.ones((5, 8), np.float16)}
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.add_tensor("q8", gguf.quants.quantize(np.ones((3, 64), np.float32), gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, values, tensors


def test_metadata_and_tensors_equal_the_gguf_package(written):
    path, values, tensors = written
    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    for key, (value, _) in values.items():
        assert ours.metadata[key] == value and type(ours.metadata[key]) is type(value), key
    strings = ours.metadata["t.strings"]
    assert isinstance(strings, StringArray) and len(strings) == 200
    assert strings.tolist() == theirs.fields["t.strings"].contents()
    assert strings[3] == "<|im_end|>" and strings[1:3] == ["", "ü"]
    assert ours.metadata["t.ints"].tolist() == list(range(-5, 300))
    assert ours.metadata["t.floats"].tolist() == [0.5, -1.0]
    assert set(ours.metadata) == set(theirs.fields) - {k for k in theirs.fields if k.startswith("GGUF.")}
    assert ours.data_offset == theirs.data_offset
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert (mine.name, mine.type_name) == (reference.name, reference.tensor_type.name)
        np.testing.assert_array_equal(mine.data, reference.data)
        assert mine.data.dtype == reference.data.dtype
    assert ours.tensors[0].shape == (2, 3, 4) and ours.tensors[2].shape == (3, 64)


@pytest.mark.parametrize("cut", [3, 8, 30, 200])
def test_a_short_file_is_a_value_error_naming_the_read(written, tmp_path, cut):
    path = tmp_path / "short.gguf"
    path.write_bytes(written[0].read_bytes()[:cut])
    with pytest.raises(ValueError, match="past the end of the file|not a GGUF file|claims"):
        GGUFFile(path)


def test_an_empty_file_is_not_a_gguf(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(path)
