"""Run every notebook in full, in a fresh Jupyter kernel, and write it back with its outputs (``make notebooks``).

Each ``notebooks/<name>.py`` (the jupytext source the tests pair with ``<name>.ipynb``) is executed in a scratch
directory (run directories land there, not in the repository), with matplotlib's inline backend so plots become
PNG outputs. Before writing, outputs are made portable: no widget state or timing metadata, and the scratch
directory, the repository and the home directory in any text replaced by ``<run dir>``, ``<repo>`` and ``~``. The
notebook's metadata records the SHA-256 of its code cells (``jaxcomposer.code_sha256``), which
``tests/notebooks/test_notebooks.py`` compares with the committed code, and the wall time of the run.

Usage: python notebooks/execute.py [NAME ...]     (default: every notebook)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PLACEHOLDERS = (("{scratch}", "<run dir>"), (str(ROOT), "<repo>"), (str(Path.home()), "~"))


def code_sha256(cells) -> str:
    """The hash the tests compare: every code cell's source, in order."""
    sources = [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
               for c in cells if c["cell_type"] == "code"]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def _portable(value, scratch: str):
    if isinstance(value, str):
        for needle, placeholder in PLACEHOLDERS:
            value = value.replace(needle.format(scratch=scratch), placeholder)
        return value
    if isinstance(value, list):
        return [_portable(v, scratch) for v in value]
    if isinstance(value, dict):
        return {k: v if k.startswith("image/") else _portable(v, scratch) for k, v in value.items()}
    return value


def execute(name: str, timeout: int) -> float:
    import jupytext
    import nbclient
    import nbformat

    nb = jupytext.read(HERE / f"{name}.py")
    nb.metadata.pop("jupytext", None)
    scratch = tempfile.mkdtemp(prefix=f"notebook-{name}-")
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "JAXCOMPOSER_SMOKE")}
    start = time.perf_counter()
    try:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": scratch}}).execute(env=env)
    finally:
        wall = time.perf_counter() - start
        shutil.rmtree(scratch, ignore_errors=True)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"  # stable: a rerun changes outputs only
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = [nbformat.from_dict(_portable(dict(o), scratch)) for o in cell.outputs]
            for output in cell.outputs:
                output.get("metadata", {}).pop("transient", None)
    nb.metadata.pop("widgets", None)
    nb.metadata["jaxcomposer"] = {"code_sha256": code_sha256(nb.cells), "executed_by": "make notebooks",
                                  "wall_time_s": round(wall, 1), "cores": len(os.sched_getaffinity(0))}
    target = HERE / f"{name}.ipynb"
    stored = nbformat.read(target, as_version=4) if target.exists() else None
    if stored is not None and "jupytext" in stored.metadata:  # keep the pairing the sources declare
        nb.metadata["jupytext"] = stored.metadata["jupytext"]
    nbformat.write(nb, target)
    return wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebooks to run (default: all)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = ap.parse_args(argv)
    names = args.names or sorted(p.stem for p in HERE.glob("*.py") if p.name != Path(__file__).name)
    for name in names:
        wall = execute(name, args.timeout)
        print(f"{name}.ipynb: executed in {wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
