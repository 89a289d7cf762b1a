"""Composer's own documented examples, run with only their imports changed (``composer`` -> ``jaxcomposer``).

``composer/NN_name.py`` is a short script taken from MosaicML Composer's documentation, docstrings or example
notebooks (datasets replaced by small synthetic tensors, models by tiny ones, nothing downloaded), ending with
asserts on what Composer gives. ``ported/NN_name.py`` is the same file with only its import statements changed.
Composer itself is not installed here: the ``composer/`` copies are the reference text, the ``ported/`` copies run.

- ``test_ported_differs_only_in_imports``: every pair differs only in import statements, and those differ only
  by ``composer`` -> ``jaxcomposer`` (``import composer`` may become ``import jaxcomposer as composer``).
- ``test_ported_script_runs``: each ported script runs to its end in a fresh directory (all of them in one
  subprocess, ``runner.py``, so JAX and torch are imported once).

``pending/`` holds scripts written the same way that need what jaxcomposer does not have yet (its README says what);
they are not run.
"""
import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

# the scripts run once per worker that holds this file's tests: keep them on one
pytestmark = pytest.mark.xdist_group("composer_scripts")

HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
COMPOSER_DIR = HERE / "composer"
PORTED_DIR = HERE / "ported"
SCRIPT_TIMEOUT_S = 600

SCRIPT_NAMES = sorted(p.name for p in COMPOSER_DIR.glob("[0-9][0-9]_*.py"))


def _import_nodes(tree: ast.AST) -> list:
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _script_items(text: str, tree: ast.AST, spell) -> list:
    """The script as a sequence: ('line', text) for each line outside import statements, ('import', spelling)
    for each import statement (at its first line; the lines it continues onto in parentheses are skipped)."""
    starts, covered = {}, set()
    for node in _import_nodes(tree):
        starts.setdefault(node.lineno, []).append(spell(node))
        covered.update(range(node.lineno, node.end_lineno + 1))
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if number in starts:
            items.extend(("import", spelling) for spelling in starts[number])
        elif number not in covered:
            items.append(("line", line))
    return items


def _top_module(name) -> str:
    return (name or "").split(".")[0]


def _normalize_ported(node):
    """The Composer spelling of a ported import: jaxcomposer[.x] -> composer[.x]; ``import jaxcomposer as
    composer`` -> ``import composer``."""
    if isinstance(node, ast.ImportFrom):
        module = node.module
        if node.level == 0 and _top_module(module) == "jaxcomposer":
            module = "composer" + module[len("jaxcomposer"):]
        return ("from", node.level, module, [(a.name, a.asname) for a in node.names])
    names = []
    for alias in node.names:
        name, asname = alias.name, alias.asname
        if _top_module(name) == "jaxcomposer":
            name = "composer" + name[len("jaxcomposer"):]
            if asname == "composer" and name == "composer":
                asname = None
        names.append((name, asname))
    return ("import", names)


def _spelling(node):
    if isinstance(node, ast.ImportFrom):
        return ("from", node.level, node.module, [(a.name, a.asname) for a in node.names])
    return ("import", [(a.name, a.asname) for a in node.names])


def _imported_top_modules(tree: ast.AST) -> set:
    modules = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                modules.add(_top_module(node.module))
        else:
            modules.update(_top_module(a.name) for a in node.names)
    return modules


def test_script_pairs_are_complete():
    ported = sorted(p.name for p in PORTED_DIR.glob("[0-9][0-9]_*.py"))
    assert SCRIPT_NAMES == ported, (set(SCRIPT_NAMES) ^ set(ported))
    assert len(SCRIPT_NAMES) >= 15, SCRIPT_NAMES


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_ported_differs_only_in_imports(name):
    original_text = (COMPOSER_DIR / name).read_text()
    ported_text = (PORTED_DIR / name).read_text()
    original_tree = ast.parse(original_text, filename=f"composer/{name}")
    ported_tree = ast.parse(ported_text, filename=f"ported/{name}")

    # the reference imports Composer and not jaxcomposer; the port imports jaxcomposer and not Composer
    original_modules = _imported_top_modules(original_tree)
    ported_modules = _imported_top_modules(ported_tree)
    assert "composer" in original_modules and "jaxcomposer" not in original_modules, original_modules
    assert "jaxcomposer" in ported_modules and "composer" not in ported_modules, ported_modules

    # line for line the same, import statements the same ones at the same places up to composer -> jaxcomposer
    original_items = _script_items(original_text, original_tree, _spelling)
    ported_items = _script_items(ported_text, ported_tree, _normalize_ported)
    first_difference = next(((i, a, b) for i, (a, b) in enumerate(zip(original_items, ported_items)) if a != b),
                            f"{len(original_items)} vs {len(ported_items)} lines and imports")
    assert original_items == ported_items, first_difference


@pytest.fixture(scope="module")
def script_results(tmp_path_factory) -> dict:
    """Every ported script run once, in one subprocess (``runner.py``; each in its own working directory)."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    workdir = tmp_path_factory.mktemp("composer_scripts")
    try:
        proc = subprocess.run([sys.executable, str(HERE / "runner.py"), str(workdir),
                               *(str(PORTED_DIR / name) for name in SCRIPT_NAMES)],
                              cwd=workdir, env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"the ported scripts did not finish in {SCRIPT_TIMEOUT_S} s\n--- stderr (tail) ---\n"
                    f"{stderr[-6000:]}")
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("COMPOSER_SCRIPT "):
            result = json.loads(line[len("COMPOSER_SCRIPT "):])
            results[result["name"]] = result
    results["_stderr"] = proc.stderr[-8000:]
    return results


@pytest.mark.slow  # one subprocess running every script: scheduled first, so no worker ends the run alone on it
@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_ported_script_runs(name, script_results):
    result = script_results.get(name)
    if result is None:
        pytest.fail(f"ported/{name} did not report (the runner stopped before it)\n--- stderr (tail) ---\n"
                    f"{script_results['_stderr']}")
    assert result["ok"], f"ported/{name} failed:\n{result['error']}"
