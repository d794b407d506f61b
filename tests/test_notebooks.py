"""Every notebook in notebooks/ runs top to bottom in small mode (JAXLLM_NB_SMALL=1): a cell error fails the test.

The kernel is the `python3` kernel of the running environment: ipykernel (from the `test` extra) installs its spec
there, jupyter_core prefers an environment's own specs, and jupyter_client starts it with this interpreter (checked
below). Figures go to the inline backend, which renders them to PNG without a display, so the plotting code runs in
full."""

from __future__ import annotations

import os
import pathlib
import sys
import time

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the test extra: pip install -e '.[test]'")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need the test extra: pip install -e '.[test]'")
pytest.importorskip("ipykernel", reason="notebook tests need the test extra: pip install -e '.[test]'")
pytest.importorskip("matplotlib", reason="notebook tests need the test extra: pip install -e '.[test]'")

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600


def test_the_notebooks_are_there_and_committed_without_outputs():
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "paged_attention.ipynb", "benchmarking.ipynb"}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name}: clear outputs first"


def test_python3_kernel_runs_this_interpreter():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys; print(sys.executable)")])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    printed = nb.cells[0].outputs[0].text.strip()
    assert os.path.realpath(printed) == os.path.realpath(sys.executable)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch):
    # The kernel inherits this environment: small mode, headless inline figures.
    monkeypatch.setenv("JAXLLM_NB_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the cell and the traceback
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")
    errors = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
              if o.output_type == "error"]
    assert not errors
