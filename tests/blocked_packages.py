"""Run Python in a subprocess where some installed packages cannot be imported, as on a machine without them.

`sys.modules[name] = None` makes `import name` (and its submodules) raise ModuleNotFoundError, while
importlib.util.find_spec(name) answers None, as for a package that is not installed; it is set before anything
else is imported, so nothing can have imported the package first.
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what the lent GPU machines lack: the GGUF reader, the HTTP server's packages and xgrammar
GPU_MACHINE_MISSING = ("gguf", "fastapi", "uvicorn", "starlette", "xgrammar")


def blocking_prelude(names=GPU_MACHINE_MISSING) -> str:
    return "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in names)


def run_blocked(code: str, *, names=GPU_MACHINE_MISSING, timeout: float = 300, cwd=None,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """`code` run by this interpreter after the prelude, importing this checkout's jaxllm (not an installed one)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-c", blocking_prelude(names) + code], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
