"""Where the engine keeps its compiled programs between starts: on by default, one directory per key.

The directory's key is what a program depends on beyond the engine's own description of it (program_cache.py):
jax's and jaxlib's versions, jaxllm's version and a digest of its sources (the Python files and the native
kernels' C++), and this CPU's feature flags (XLA's CPU code is built for the host). A change of any of them starts
an empty directory, so no program built by another version is ever loaded. Only the newest KEEP_KEYS directories
under a root are kept: each upgrade or source edit would otherwise leave its programs behind.

JAX's own persistent cache is not used: it keys a program by its lowered HLO, so a start would trace and lower
every program before finding it; and an executable it serves cannot be written out again whole (XLA:CPU then
leaves out its compiled functions), so the engine's cache could not be filled from it.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
from pathlib import Path

import jax
import jaxlib

import jaxllm
import pallas_kernels
from pallas_kernels.native_build import cache_root, cpu_flags

KEEP_KEYS = 4
_SOURCE_SUFFIXES = (".py", ".cc", ".h")
_KEY_PREFIX = "jaxllm-"


def cache_directory(root: str | None) -> Path:
    """Where this process's programs are cached: <root>/<key> (root: $JAXLLM_CACHE_DIR/xla by default)."""
    base = Path(root).expanduser() if root else cache_root() / "xla"
    return base / cache_key()


@functools.cache
def cache_key() -> str:
    parts = [jax.__version__, jaxlib.__version__, jaxllm.__version__, source_digest(), cpu_flags()]
    return _KEY_PREFIX + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


@functools.cache
def source_digest() -> str:
    """A digest of jaxllm's and its kernels' source files."""
    return digest_sources([Path(package.__file__).parent for package in (jaxllm, pallas_kernels)])


def digest_sources(roots: list[Path]) -> str:
    """A digest of the names and contents of the source files (.py, .cc, .h) under `roots`."""
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


_directory: list[Path | None] = [None]


def use(directory: Path | None) -> None:
    """Keep the programs built from now on in `directory` (created; older keys pruned); None: keep none."""
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        _prune_other_keys(directory)
    _directory[0] = directory


def directory_in_use() -> Path | None:
    return _directory[0]


def _prune_other_keys(directory: Path) -> None:
    siblings = [p for p in directory.parent.iterdir() if p.is_dir() and p.name.startswith(_KEY_PREFIX)
                and p != directory]
    siblings.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in siblings[KEEP_KEYS - 1:]:
        shutil.rmtree(stale, ignore_errors=True)
