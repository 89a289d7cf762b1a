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
