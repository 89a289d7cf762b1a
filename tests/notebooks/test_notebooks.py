"""Every notebook runs (nbmake, smoke mode) and its paired .py source is in sync with the .ipynb."""
import json
import os
import subprocess
import sys
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
def test_notebook_executes(notebook):
    env = {**os.environ, "JAXCOMPOSER_SMOKE": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--nbmake", "--nbmake-timeout=600", "-p", "no:xdist",
                           "-q", str(notebook)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
