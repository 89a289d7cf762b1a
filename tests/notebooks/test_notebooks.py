"""Every notebook runs (smoke mode, in a fresh kernel) and its paired .py source is in sync with the .ipynb."""
import json
import os
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_pairing_is_in_sync(notebook):
    import jupytext
    source = jupytext.read(notebook.with_suffix(".py"))
    stored = json.loads(notebook.read_text())
    code = lambda cells: [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
                          for c in cells if c["cell_type"] == "code"]
    assert code(source["cells"]) == code(stored["cells"]), f"run: jupytext --sync {notebook}"


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(notebook, tmp_path):
    """nbclient drives a kernel of this interpreter in a scratch directory (the notebooks write run directories);
    a failing cell raises with its traceback."""
    import nbclient
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    env = {**os.environ, "JAXCOMPOSER_SMOKE": "1", "MPLBACKEND": "Agg"}
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    assert all(o.get("output_type") != "error" for c in nb.cells for o in c.get("outputs", []))


def _execute_module():
    import importlib.util
    path = Path(__file__).parents[2] / "notebooks" / "execute.py"
    spec = importlib.util.spec_from_file_location("notebook_execute", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_come_from_the_committed_code(notebook):
    """``make notebooks`` stored the hash of the code it ran; code changed since fails here until it runs again.
    The outputs are there (a plot where the code draws one), error-free and free of this machine's paths."""
    stored = json.loads(notebook.read_text())
    meta = stored["metadata"].get("jaxcomposer", {})
    assert meta.get("code_sha256") == _execute_module().code_sha256(stored["cells"]), \
        f"{notebook.name}: its outputs were not produced by its code; run: make notebooks"
    code = [c for c in stored["cells"] if c["cell_type"] == "code"]
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert outputs and all(o["output_type"] != "error" for o in outputs)
    source = "".join("".join(c["source"]) for c in code)
    if "plt.show()" in source or "LivePlotLogger(" in source:
        assert any("image/png" in o.get("data", {}) for o in outputs)
    text = json.dumps([{k: v for k, v in o.items() if k != "data"} for o in outputs] +
                      [o.get("data", {}).get("text/plain", "") for o in outputs])
    for path in ("/tmp/", str(Path(__file__).parents[2]), str(Path.home()) + "/"):
        assert path not in text, f"{notebook.name}: an output names {path}"
