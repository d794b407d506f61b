"""Progress of the slow parts of a start: reading the weights, placing them on devices, compiling the programs.

On a terminal each is a tqdm bar on stderr (as vLLM shows for checkpoint shards and graph capture); elsewhere (a
log file, a test) one log line when it ends, on the "jaxllm.progress" logger at INFO. The engine turns both off
for `disable_log_stats` (`--disable-log-stats`):

    with progress.shown(not args.disable_log_stats):
        ...
    for tensor in progress.track(tensors, "Loading weights", "tensors", total=n, nbytes=lambda t: t.nbytes): ...
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Callable, Iterable, Iterator, TypeVar

logger = logging.getLogger("jaxllm.progress")
T = TypeVar("T")
_shown = [True]


@contextlib.contextmanager
def shown(on: bool) -> Iterator[None]:
    """Progress is shown (on) or not inside the block."""
    previous, _shown[0] = _shown[0], on
    try:
        yield
    finally:
        _shown[0] = previous


def track(items: Iterable[T], desc: str, unit: str, total: int | None = None,
          nbytes: Callable[[T], int] | None = None) -> Iterator[T]:
    """`items`, counted as they are taken (and their bytes, with nbytes) on a bar or in a closing log line."""
    if not _shown[0]:
        yield from items
        return
    bar = _bar(desc, unit, total)
    start, count, size = time.perf_counter(), 0, 0
    try:
        for item in items:
            yield item
            count += 1
            size += nbytes(item) if nbytes else 0
            if bar is not None:
                bar.update(1)
                if nbytes:
                    bar.set_postfix_str(f"{size / 2**20:.0f} MiB", refresh=False)
    finally:
        if bar is not None:
            bar.close()
    in_bytes = f" ({size / 2**20:.0f} MiB)" if nbytes else ""
    logger.info("%s: %d %s%s in %.1f s", desc, count, unit, in_bytes, time.perf_counter() - start)


def _bar(desc: str, unit: str, total: int | None):
    """A tqdm bar on stderr when stderr is a terminal, else None."""
    if not sys.stderr.isatty():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=f" {unit}", dynamic_ncols=True, leave=False, file=sys.stderr)
