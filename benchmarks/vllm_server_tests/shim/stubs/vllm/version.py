"""Stub of vllm.version. Tests compare the server's /version to __version__: here it is the version jaxllm
reports, so that the test checks the route and its shape rather than vLLM's release number."""
from importlib.metadata import version as _installed_version

__version__ = _installed_version("jaxllm")
__version_tuple__ = tuple(int(part) for part in __version__.split(".")[:3])


def _prev_minor_version():
    """Used only to build --show-hidden-metrics-for-version values; any well-formed version does."""
    return "0.0"
