"""Stand-in for the `vllm` package, so that vLLM's OpenAI-server tests import without vLLM installed.

The modules next to this file provide the few incidental names the server tests use (envs, version, tokenizers,
config, exceptions, ...). Any other `vllm.*` module is created on demand; its attributes are classes that raise
VLLMInternalStub when used: a test that reaches one depends on vLLM's internals, not on the server."""
import importlib
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = None  # the real value is in vllm.version


class VLLMInternalStub(RuntimeError):
    """Raised when a test touches a vLLM internal that this stand-in does not provide."""


def _is_dunder(name: str) -> bool:
    return name.startswith("__")


class _StubMeta(type):
    """Class-level attribute access on a stub class (SomeClass.from_config, ...) raises."""

    def __getattr__(cls, name):
        if _is_dunder(name):
            raise AttributeError(name)
        raise VLLMInternalStub(f"vLLM internal {cls.__qualname__}.{name} used")


def make_stub(qualname: str) -> type:
    """A class named after a vLLM internal. Instances can be made (some test modules build them at import time),
    but calling one or reading any of its attributes raises VLLMInternalStub."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise VLLMInternalStub(f"vLLM internal {qualname} used")

    def __getattr__(self, name):
        if _is_dunder(name):
            raise AttributeError(name)
        raise VLLMInternalStub(f"vLLM internal {qualname}().{name} used")

    namespace = {"__init__": __init__, "__call__": __call__, "__getattr__": __getattr__, "__qualname__": qualname}
    return _StubMeta(qualname.rsplit(".", 1)[-1], (object,), namespace)


class _AutoModule(types.ModuleType):
    """A module made on demand: each attribute is a submodule already imported, or else a stub class."""

    def __getattr__(self, name):
        if _is_dunder(name):
            raise AttributeError(name)
        full_name = f"{self.__name__}.{name}"
        if full_name in sys.modules:
            return sys.modules[full_name]
        stub = make_stub(full_name)
        setattr(self, name, stub)
        return stub


class _AutoModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `vllm.x.y`: from a file of this stand-in when there is one, else as an _AutoModule package."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("vllm."):
            return None
        file_spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if file_spec is not None:
            return file_spec
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _AutoModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _AutoModuleFinder())


def __getattr__(name):
    """`vllm.x` as an attribute: the submodule (a file of this stand-in or an _AutoModule)."""
    if _is_dunder(name):
        raise AttributeError(name)
    try:
        return importlib.import_module(f"vllm.{name}")
    except ImportError:
        raise AttributeError(name) from None
