"""Torch stays at the edge (docs/design.md, "The torch bridge"): no module of ``jaxcomposer`` imports torch or
torch_bridge, at module level or inside a function, and no method dispatches on torch types; every exception
class lives in ``jaxcomposer/errors.py`` and derives from ``JaxComposerError``."""
import ast
import inspect
from pathlib import Path

import jaxcomposer
from jaxcomposer import errors

PACKAGE = Path(jaxcomposer.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
FORBIDDEN = ("torch", "torch_bridge", "torchvision", "transformers")


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            yield str(node.args[0].value)


def test_the_walk_sees_the_package():
    assert len(SOURCES) > 40 and any(p.name == "trainer.py" for p in SOURCES)


def test_no_module_imports_torch_or_the_bridge():
    offenders = [(str(p.relative_to(PACKAGE)), name) for p in SOURCES for name in _imports(ast.parse(p.read_text()))
                 if name.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_no_source_looks_torch_up_by_hand():
    # sys.modules["torch"] and isinstance(x, torch.nn.Module) are how type dispatch on torch sneaks back in
    offenders = [str(p.relative_to(PACKAGE)) for p in SOURCES
                 if 'modules.get("torch")' in p.read_text() or "torch.nn.Module)" in p.read_text()]
    assert offenders == []


def test_every_exception_class_lives_in_errors_and_derives_from_the_base():
    defined_elsewhere = []
    for p in SOURCES:
        if p.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception", "Interrupt"))
                    for b in node.bases):
                defined_elsewhere.append(f"{p.relative_to(PACKAGE)}:{node.name}")
    assert defined_elsewhere == []
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) >= 10
    for c in classes:  # (and its warnings, which derive from Warning)
        assert issubclass(c, (errors.JaxComposerError, Warning)) or c is errors.Preempted, c
