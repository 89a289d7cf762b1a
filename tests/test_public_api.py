"""The public names are static for tools: type checkers and IDEs see what ``import jaxcomposer`` gives at run time.

The top level loads its names on first use and ``jaxcomposer.algorithms``/``jaxcomposer.functional`` fill theirs
from the method registry; a ``TYPE_CHECKING`` block and generated ``.pyi`` stubs say the same names statically.
mypy checks a user's script against them, and must catch misspelled names and keywords."""
import ast
import pathlib
import re
import subprocess
import sys

import pytest

import jaxcomposer
from jaxcomposer import stubs

ROOT = pathlib.Path(__file__).resolve().parents[1]
TYPING = ROOT / "tests" / "type_check"


def test_the_generated_stubs_list_every_registered_method():
    assert not stubs.stale(), "the .pyi stubs miss registry changes: run `make stubs` and commit them"


def test_the_type_checking_block_names_every_lazy_top_level_name():
    tree = ast.parse((ROOT / "jaxcomposer" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {}
    for node in block.body:
        for alias in node.names:
            seen[alias.asname] = f"{node.module}.{alias.name}"
    homes = {name: f"{home}.{jaxcomposer._RENAMED.get(name, name)}" for name, home in jaxcomposer._HOMES.items()}
    homes.update({name: f"jaxcomposer.{name}" for name in jaxcomposer._SUBMODULES})
    assert seen == homes


def test_a_users_script_type_checks_and_misspellings_are_caught(tmp_path):
    pytest.importorskip("mypy")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", "--no-incremental",
         "--cache-dir", str(tmp_path), "--no-error-summary", "--hide-error-context", "--no-pretty",
         str(TYPING / "public_api_usage.py"), str(TYPING / "public_api_misuse.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    errors = [line for line in result.stdout.splitlines() if ": error: " in line]
    assert not [e for e in errors if "public_api_usage.py" in e], result.stdout
    got = sorted((int(re.search(r":(\d+): error", e).group(1)), e.split(": error: ")[1]) for e in errors)
    assert [(line, message.split("  [")[0]) for line, message in got] == [
        (6, 'Unexpected keyword argument "modle" for "Trainer"; did you mean "model"?'),
        (7, '"Method" has no attribute "nonexistent_attribute"'),
        (8, 'Module has no attribute "mixup_batches"; maybe "mixup_batch"?'),
        (9, 'Module has no attribute "MixUpp"; maybe "MixUp"?'),
    ], result.stdout + result.stderr
