"""Fixtures of the reliability suite: the server factory of tests/server (imported, not copied) and the server
the HTTP modules of this package share."""

from __future__ import annotations

import pytest

from tests.reliability.helpers import API_KEY, MAX_BODY_BYTES, start_suite_server
# the server factory fixtures, made visible to this package (pytest sees fixtures only through a conftest)
from tests.server.conftest import start_module_server, start_server, start_test_server  # noqa: F401


@pytest.fixture(scope="session")
def compilation_cache(tmp_path_factory) -> str:
    """A persistent XLA compilation cache shared by the suite's servers (same engine flags, same programs)."""
    return str(tmp_path_factory.mktemp("reliability-compilation-cache"))


@pytest.fixture(scope="package")
def guarded_server(start_server, compilation_cache):  # noqa: F811 - the imported fixture, requested by name
    """The server of the HTTP modules: requires API_KEY and refuses bodies over MAX_BODY_BYTES; stopped once the
    package's tests are done. (The shared `server` of tests/server is not used: it warms up every program, which
    these tests do not need, and has neither limit.)"""
    server = start_suite_server(start_server, compilation_cache, "--api-key", API_KEY,
                                "--max-body-bytes", str(MAX_BODY_BYTES))
    yield server
    server.stop()
