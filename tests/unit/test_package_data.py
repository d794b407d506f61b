"""Every file the library reads at run time beside its Python modules (the native kernels' C++ sources and headers,
built at first use; the quantizer's text data) is named in pyproject.toml's package-data, so a non-editable install
carries it."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_native_sources_and_data_files_are_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    needed = [path for top in ("jaxllm", "pallas_kernels") for suffix in ("*.cc", "*.h", "*.txt")
              for path in (ROOT / top).rglob(suffix)]
    assert needed  # the search looks where the files are
    missing = []
    for path in needed:
        package = ".".join(path.parent.relative_to(ROOT).parts)
        if not any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns.get(package, [])):
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"not in pyproject.toml's package-data: {missing}"
