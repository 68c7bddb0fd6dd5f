"""The notebooks under notebooks/ run top to bottom in a fresh kernel, without errors or stderr.

Each notebook asserts what it shows, so executing it is the test. The kernel is the interpreter
running pytest: a temporary "python3" kernelspec naming `sys.executable` comes first on
JUPYTER_PATH, whatever other kernels the machine has installed.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks need the dev or notebooks extra")
nbclient = pytest.importorskip("nbclient", reason="the notebooks need the dev or notebooks extra")
pytest.importorskip("ipykernel", reason="the notebooks need the dev or notebooks extra")
pytest.importorskip("matplotlib", reason="the notebooks need the dev or notebooks extra")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["01_transcribe.ipynb", "02_summarize.ipynb", "03_inside_the_runtime.ipynb"]


@pytest.fixture
def this_python_kernel(tmp_path, monkeypatch):
    """Make the kernel name "python3" start `sys.executable` in a fresh process."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (pytest)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "python3"


def execute(nb, kernel_name: str):
    """Run every cell in a new kernel started in notebooks/; raises CellExecutionError on an error."""
    client = nbclient.NotebookClient(nb, kernel_name=kernel_name, timeout=600,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def outputs(nb, output_type: str) -> list:
    return [out for cell in nb.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.output_type == output_type]


def run_notebook(name: str, kernel_name: str):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    seconds = execute(nb, kernel_name)
    print(f"{name}: executed in {seconds:.1f} s")
    stderr = [out.text for out in outputs(nb, "stream") if out.name == "stderr"]
    assert not stderr, f"{name} wrote to stderr (a user would stop at it):\n" + "\n".join(stderr)
    return nb


def markdown_outputs(nb) -> str:
    return "\n".join(out.data.get("text/markdown", "") for out in outputs(nb, "display_data"))


@pytest.mark.parametrize("name", NAMES)
def test_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert nb.metadata.kernelspec.name == "python3"


def test_kernel_is_this_interpreter(this_python_kernel):
    cell = nbformat.v4.new_code_cell("import sys; print(sys.executable)")
    nb = nbformat.v4.new_notebook(cells=[cell])
    execute(nb, this_python_kernel)
    assert outputs(nb, "stream")[0].text.strip() == sys.executable


def test_transcribe_notebook(this_python_kernel):
    run_notebook("01_transcribe.ipynb", this_python_kernel)


def test_summarize_notebook_with_random_checkpoint(this_python_kernel, monkeypatch):
    monkeypatch.delenv("ENCDEC_BART_DIR", raising=False)
    nb = run_notebook("02_summarize.ipynb", this_python_kernel)
    shown = markdown_outputs(nb)
    assert "summaries below are meaningless text" in shown
    assert "| '' |" not in shown, "an output in the tables is empty"


def test_summarize_notebook_with_encdec_bart_dir(this_python_kernel, monkeypatch, tiny_bart_dir):
    monkeypatch.setenv("ENCDEC_BART_DIR", str(tiny_bart_dir))
    nb = run_notebook("02_summarize.ipynb", this_python_kernel)
    shown = markdown_outputs(nb)
    assert f"Using the checkpoint in `{tiny_bart_dir}`" in shown and "meaningless" not in shown


def test_inside_the_runtime_notebook(this_python_kernel):
    run_notebook("03_inside_the_runtime.ipynb", this_python_kernel)
