"""Build a C++ XLA FFI source into a shared library once per machine, and load it.

The library is compiled at first use with the system C++ compiler (`$CXX`, else `c++`) against the XLA FFI headers
that jaxlib ships, for this CPU (`-march=native`), and cached under `$JAXLLM_CACHE_DIR` (default
`~/.cache/jaxllm`) in a file named by a hash of everything that goes into it: the source, the shared headers beside
this module (`*.h`, on the include path), the flags, the compiler's version, jaxlib's version and this CPU's feature
flags. A second process finds it there; concurrent builds each write a temporary file and the last rename wins, with
identical contents.

`NativeBuildError` says why a library could not be built (no compiler, a compile error); callers fall back to a
jnp path and say so.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jaxlib

CXX_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC",
             # reassociation lets the compiler vectorize the dot products; infinities and NaNs keep their meaning
             "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros", "-ffp-contract=fast")
BUILD_TIMEOUT_S = 300
HEADER_DIR = Path(__file__).parent  # the kernels' shared headers (parallel_for.h), on the include path


class NativeBuildError(RuntimeError):
    """A native library could not be built or loaded on this machine."""


@functools.cache
def load_native_library(source: Path) -> ctypes.CDLL:
    """The shared library built from `source` (compiled now unless a cached build matches)."""
    compiler = _compiler()
    command = [compiler, *CXX_FLAGS, f"-I{jax.ffi.include_dir()}", f"-I{HEADER_DIR}"]
    headers = [header.read_text() for header in sorted(HEADER_DIR.glob("*.h"))]
    key = hashlib.sha256("\0".join([source.read_text(), *headers, *command, _compiler_version(compiler),
                                    jaxlib.__version__, cpu_flags()]).encode()).hexdigest()[:16]
    library = _cache_dir() / f"{source.stem}-{key}.so"
    if not library.exists():
        _compile(command, source, library)
    try:
        return ctypes.CDLL(str(library))
    except OSError as error:
        raise NativeBuildError(f"could not load {library}: {error}") from error


@dataclasses.dataclass(frozen=True)
class CpuTarget:
    """An FFI handler `symbol` of the library built from `source`, registered as the CPU custom-call `name`."""
    source: Path
    symbol: str
    name: str

    def register(self) -> None:
        """Build, load and register it (once per process); NativeBuildError if that cannot be done here."""
        _register(self)

    @functools.cached_property
    def error(self) -> str | None:
        """Why it cannot be registered here (no compiler, a build error), or None when it is; asked once."""
        try:
            self.register()
        except NativeBuildError as error:
            return str(error)
        return None


@functools.cache
def _register(target: CpuTarget) -> None:
    library = load_native_library(target.source)
    try:
        handler = jax.ffi.pycapsule(getattr(library, target.symbol))
    except AttributeError as error:
        raise NativeBuildError(f"{target.source.name} built without its handler {target.symbol}: {error}") from error
    jax.ffi.register_ffi_target(target.name, handler, platform="cpu")


def _compile(command: list[str], source: Path, library: Path) -> None:
    library.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=library.parent, prefix=library.stem, suffix=".tmp")
    os.close(fd)
    try:
        done = subprocess.run([*command, str(source), "-o", partial], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise NativeBuildError(f"compiling {source.name} failed:\n{done.stderr[-4000:]}")
        os.replace(partial, library)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NativeBuildError(f"compiling {source.name} failed: {error}") from error
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _compiler() -> str:
    name = os.environ.get("CXX", "c++")
    path = shutil.which(name)
    if path is None:
        raise NativeBuildError(f"no C++ compiler: {name!r} is not on PATH (set CXX to one)")
    return path


@functools.cache
def _compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NativeBuildError(f"{compiler} --version failed: {error}") from error


@functools.cache
def cpu_flags() -> str:
    """This CPU's feature flags (Linux), so that a cache shared between machines never serves a foreign build."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line for line in lines if line.startswith(("flags", "Features"))), "")


def cache_root() -> Path:
    """$JAXLLM_CACHE_DIR, else ~/.cache/jaxllm: native kernels and compiled programs are kept there."""
    return Path(os.environ.get("JAXLLM_CACHE_DIR") or Path.home() / ".cache" / "jaxllm")


def _cache_dir() -> Path:
    return cache_root() / "native"
