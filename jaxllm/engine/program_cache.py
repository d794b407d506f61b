"""The engine's compiled step programs kept on disk whole, so that a later start skips tracing and lowering too.

JAX's own persistent cache keys a program by its lowered HLO, so even a cached start traces and lowers every
program first: about a tenth of a second each on these machines, a third of a cached start. Here a program is
found by what determines it instead, before any tracing:

- the directory: jax, jaxlib and jaxllm's version and sources, and the CPU (compilation_cache.cache_directory);
- what the program's function closes over (StepPrograms: the model config, the kernels, the mesh) and its key;
- every argument's tree structure, shape, dtype, weak type and sharding;
- the XLA flags, jax's x64 and matmul-precision settings, and the backend's platform version.

A program found is loaded (jax.experimental.serialize_executable; the warm-up loads several at once); one not
found, or that fails to load, is compiled and written. Several processes of one mesh compile each for
themselves: the cache is used only where there is one process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import jax
from jax.experimental import serialize_executable

logger = logging.getLogger(__name__)
SUFFIX = ".program"


def program_key(identity: tuple, args: tuple) -> str:
    """A digest of the program's identity (its static inputs, as a tuple of printable values) and its arguments'
    structure and abstract values."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    device = jax.devices()[0]
    parts = [repr(identity), str(treedef), *map(_leaf_signature, leaves),
             os.environ.get("XLA_FLAGS", ""), repr(jax.config.jax_enable_x64),
             repr(jax.config.jax_default_matmul_precision), device.platform, device.client.platform_version]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _leaf_signature(leaf) -> str:
    sharding = getattr(leaf, "sharding", None)
    return f"{tuple(leaf.shape)} {leaf.dtype} {getattr(leaf, 'weak_type', False)} {sharding!r}"


def load(directory: Path | None, key: str, devices: list):
    """The program kept under `key`, placed on `devices` (its mesh's, in order), or None (none kept, or it fails
    to load: then it is logged). Safe to call from several threads at once (XLA's loading runs without the
    interpreter lock)."""
    if directory is None or jax.process_count() > 1:
        return None
    path = directory / (key + SUFFIX)
    if not path.is_file():
        return None
    try:
        payload, in_tree, out_tree = pickle.loads(path.read_bytes())
        return serialize_executable.deserialize_and_load(payload, in_tree, out_tree, execution_devices=devices)
    except Exception as e:  # written by a process that died mid-way, or by an incompatible runtime
        logger.warning("compiled program %s could not be loaded (%s: %s); compiling it again", path.name,
                       type(e).__name__, e)
        return None


def compile_and_store(directory: Path | None, key: str, compile_program: Callable[[], Any]):
    """compile_program(), kept under `key` unless JAX's own persistent cache served it (switched on by the user:
    an executable it serves cannot be written out again whole)."""
    served = _JaxCacheHits()
    with served:
        compiled = compile_program()
    if directory is not None and jax.process_count() == 1 and not served.count:
        _write(directory / (key + SUFFIX), compiled)
    return compiled


class _JaxCacheHits:
    """Hits of JAX's persistent cache on this thread while active."""
    EVENT = "/jax/compilation_cache/cache_hits"

    def __init__(self):
        self.count, self._thread = 0, threading.get_ident()

    def _listen(self, event: str, **kwargs) -> None:
        if event == self.EVENT and threading.get_ident() == self._thread:
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_listener(self._listen)

    def __exit__(self, *exc_info):
        jax.monitoring.unregister_event_listener(self._listen)


def _write(path: Path, compiled) -> None:
    """The program's serialized form, written to a temporary file renamed into place."""
    try:
        data = pickle.dumps(serialize_executable.serialize(compiled))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=path.parent, prefix=".staging-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(staging, path)
    except Exception as e:  # a program that cannot be serialized, a read-only cache: this start is unaffected
        logger.warning("compiled program not kept on disk (%s: %s)", type(e).__name__, e)
