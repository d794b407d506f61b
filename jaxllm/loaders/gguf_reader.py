"""A GGUFReader that refuses what a corrupt header asks for instead of looping or allocating without end.

The gguf package's reader trusts the counts in the file: a read past the end of the file comes back short (a
memory map sliced beyond its end) instead of failing, so an array whose length field says 2**60 loops, appending
an empty part at each turn, until memory runs out. Here every read must lie within the file, and an array's length
must fit in the bytes left (and stay below MAX_ARRAY_ITEMS: the reader keeps a Python object per item). Both
hooks are the reader's own internal methods (gguf 0.x); the checks only ever raise, so a reader whose internals
change loses them without reading anything differently.
"""

from __future__ import annotations

import numpy as np
from gguf import GGUFReader, GGUFValueType

MAX_ARRAY_ITEMS = 1 << 24  # a vocabulary has ~10**5 tokens; merges a few 10**5
_ARRAY_HEADER_BYTES = 12  # item type (uint32) and length (uint64)
_STRING_HEADER_BYTES = 8  # length (uint64)


class BoundedGGUFReader(GGUFReader):
    def _get(self, offset, dtype, count=1, override_order=None):
        count, itemsize = int(count), np.dtype(dtype).itemsize
        if offset < 0 or count < 0 or offset + count * itemsize > len(self.data):
            raise ValueError(f"a read of {count} x {np.dtype(dtype).name} at byte {offset} goes past the end of "
                             f"the file ({len(self.data)} bytes)")
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type == GGUFValueType.ARRAY:
            item_type = int(self._get(orig_offs, np.uint32)[0])
            length = int(self._get(orig_offs + 4, np.uint64)[0])
            left = len(self.data) - orig_offs - _ARRAY_HEADER_BYTES
            if length > MAX_ARRAY_ITEMS or length * self._least_item_bytes(item_type) > left:
                raise ValueError(f"the metadata array at byte {orig_offs} claims {length} items, which do not fit "
                                 f"in the {left} bytes left in the file (or exceed {MAX_ARRAY_ITEMS})")
        return super()._get_field_parts(orig_offs, raw_type)

    def _least_item_bytes(self, raw_type: int) -> int:
        """The fewest bytes one item of this value type takes in the file."""
        gtype = GGUFValueType(raw_type)  # ValueError for a type that does not exist
        if gtype == GGUFValueType.STRING:
            return _STRING_HEADER_BYTES
        if gtype == GGUFValueType.ARRAY:
            return _ARRAY_HEADER_BYTES
        return np.dtype(self.gguf_scalar_to_np[gtype]).itemsize
