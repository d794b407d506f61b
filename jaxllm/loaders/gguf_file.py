"""A GGUF file's header read with numpy over a memory map: metadata values and the tensor table, bounds-checked.

One pass over the header builds the metadata (scalars as Python values, numeric arrays as numpy views of the map,
string arrays as StringArray: their offsets, decoded only when an item is read) and the tensor table (each
tensor's data a numpy view of the map). Nothing is copied and no object is built per vocabulary string, so a
header with 10**5 tokens and merges reads in milliseconds. Every count the file gives is checked against the bytes
left before it is used, so a corrupt or hostile header is refused (ValueError) instead of looping or allocating.
Layout (little-endian): magic "GGUF", version (2 or 3), tensor count, metadata count; the metadata (key, value type,
value); the tensor table (name, dims, GGML type, offset); padding to general.alignment; the tensor data.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAX_ARRAY_ITEMS = 1 << 24  # a vocabulary has ~10**5 tokens; merges a few 10**5
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32

# GGUF value types -> numpy scalar types (STRING = 8 and ARRAY = 9 are read apart)
_SCALARS = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
            7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9

# GGML tensor types: id -> (name, elements per block, bytes per block)
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
              7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
              12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 24: ("I8", 1, 1),
              25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 30: ("BF16", 1, 2)}
_FLOAT_VIEWS = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type_name: str  # GGML type name ("Q4_1", "F32", ...; "type N" for one this reader does not know)
    shape: tuple[int, ...]  # row-major, outermost first (GGUF stores the dims innermost first)
    data: np.ndarray | None  # plain types: `shape` of that type; BF16 and quantized: uint8 [..., row bytes]

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


class StringArray(Sequence):
    """A metadata array of strings, decoded item by item when read."""

    def __init__(self, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
        self._buffer, self._starts, self._lengths = buffer, starts, lengths

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        start = int(self._starts[index])
        return self._buffer[start:start + int(self._lengths[index])].tobytes().decode("utf-8")

    def tolist(self) -> list[str]:
        return [self[i] for i in range(len(self))]


class GGUFFile:
    """`metadata` (key -> value) and `tensors` of one GGUF file, memory-mapped read-only."""

    def __init__(self, path: str | Path):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if Path(path).stat().st_size else b""
        self._bytes = np.frombuffer(self._map, np.uint8)
        if self._bytes[:4].tobytes() != b"GGUF":
            raise ValueError("not a GGUF file (the first bytes are not 'GGUF')")
        self._pos = 4
        version = self._scalar(np.uint32)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
        tensor_count, key_count = self._count(24), self._count(9)  # each entry takes at least that many bytes
        self.metadata: dict[str, Any] = {}
        for _ in range(key_count):
            key = self._string()
            self.metadata[key] = self._value(self._scalar(np.uint32), key)
        table = [self._tensor_info() for _ in range(tensor_count)]
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or not 0 < alignment <= 1 << 16 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment must be a power of two up to 65536, got {alignment!r}")
        self.data_offset = -(-self._pos // alignment) * alignment
        self.tensors = [self._tensor(*info) for info in table]

    def _slice(self, count: int) -> np.ndarray:
        if count < 0 or self._pos + count > len(self._bytes):
            raise ValueError(f"a read of {count} bytes at byte {self._pos} goes past the end of the file "
                             f"({len(self._bytes)} bytes)")
        piece = self._bytes[self._pos:self._pos + count]
        self._pos += count
        return piece

    def _scalar(self, dtype) -> Any:
        return self._slice(np.dtype(dtype).itemsize).view(dtype)[0].item()

    def _count(self, least_item_bytes: int, what: str = "count") -> int:
        """A uint64 count of items that take at least least_item_bytes each: it must fit in the bytes left."""
        at, count = self._pos, self._scalar(np.uint64)
        left = len(self._bytes) - self._pos
        if count > MAX_ARRAY_ITEMS or count * least_item_bytes > left:
            raise ValueError(f"the {what} at byte {at} claims {count} items, which do not fit in the {left} bytes "
                             f"left in the file (or exceed {MAX_ARRAY_ITEMS})")
        return count

    def _string(self) -> str:
        length = self._count(1, "string length")
        try:
            return self._slice(length).tobytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"a string at byte {self._pos - length} is not UTF-8: {e}") from e

    def _value(self, value_type: int, key: str) -> Any:
        if value_type in _SCALARS:
            return self._scalar(_SCALARS[value_type])
        if value_type == _STRING:
            return self._string()
        if value_type == _ARRAY:
            return self._array(self._scalar(np.uint32), key)
        raise ValueError(f"metadata {key!r} has unknown value type {value_type}")

    def _array(self, item_type: int, key: str) -> np.ndarray | StringArray | list:
        if item_type in _SCALARS:
            dtype = np.dtype(_SCALARS[item_type])
            count = self._count(dtype.itemsize, f"array {key!r}")
            return self._slice(count * dtype.itemsize).view(dtype)
        if item_type == _STRING:
            return self._string_array(self._count(8, f"array {key!r}"))
        if item_type == _ARRAY:  # arrays of arrays: allowed by the format, used by no model jaxllm reads
            return [self._array(self._scalar(np.uint32), key) for _ in range(self._count(12, f"array {key!r}"))]
        raise ValueError(f"metadata {key!r} is an array of unknown value type {item_type}")

    def _string_array(self, count: int) -> StringArray:
        starts, lengths = np.empty(count, np.int64), np.empty(count, np.int64)
        raw, size, pos = self._map, len(self._bytes), self._pos
        for i in range(count):  # each length says where the next string starts: read one after the other
            if pos + 8 > size:
                raise ValueError(f"a string length at byte {pos} goes past the end of the file ({size} bytes)")
            length = int.from_bytes(raw[pos:pos + 8], "little")
            if length > size - pos - 8:
                raise ValueError(f"the string at byte {pos} claims {length} bytes, past the end of the file")
            starts[i], lengths[i], pos = pos + 8, length, pos + 8 + length
        self._pos = pos
        return StringArray(self._bytes, starts, lengths)

    def _tensor_info(self) -> tuple[str, list[int], int, int]:
        name = self._string()
        n_dims = self._scalar(np.uint32)
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} are possible)")
        dims = [self._scalar(np.uint64) for _ in range(n_dims)]
        return name, dims, self._scalar(np.uint32), self._scalar(np.uint64)

    def _tensor(self, name: str, dims: list[int], type_id: int, offset: int) -> GGUFTensor:
        shape = tuple(reversed(dims))
        if type_id not in GGML_TYPES:
            return GGUFTensor(name, f"type {type_id}", shape, None)
        type_name, block, block_bytes = GGML_TYPES[type_id]
        if dims[0] % block:
            raise ValueError(f"tensor {name!r}: a row of {dims[0]} is not a whole number of {type_name} blocks")
        row_bytes = dims[0] // block * block_bytes
        rows = int(np.prod(dims[1:], dtype=object))
        start = self.data_offset + offset
        if start + rows * row_bytes > len(self._bytes):
            raise ValueError(f"tensor {name!r} ({type_name}, shape {list(shape)}) lies past the end of the file")
        raw = self._bytes[start:start + rows * row_bytes]
        if type_name in _FLOAT_VIEWS:
            return GGUFTensor(name, type_name, shape, raw.view(_FLOAT_VIEWS[type_name]).reshape(shape))
        return GGUFTensor(name, type_name, shape, raw.reshape(*shape[:-1], row_bytes))
