"""No import circles among jaxcomposer's and torch_bridge's modules: read from their module-level
imports (deferred imports inside functions and ``if TYPE_CHECKING:`` blocks do not count; ``from package import
submodule`` is an edge to the submodule)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("jaxcomposer", "torch_bridge")


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return mods


def _imports(name: str, path: pathlib.Path, mods: dict) -> set[str]:
    found = set()
    for node in ast.parse(path.read_text()).body:
        statements = [node]
        if isinstance(node, ast.If):
            if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                continue
            statements = node.body
        for statement in statements:
            if isinstance(statement, ast.Import):
                found.update(alias.name for alias in statement.names)
            elif isinstance(statement, ast.ImportFrom):
                base = statement.module or ""
                if statement.level:
                    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    package = package[:len(package) - (statement.level - 1)]
                    base = ".".join(package + ([base] if base else []))
                submodules = [f"{base}.{alias.name}" for alias in statement.names if f"{base}.{alias.name}" in mods]
                if len(submodules) < len(statement.names):  # a name the package defines: its __init__ runs first
                    found.add(base)
                found.update(submodules)
    return {m for m in found if m in mods and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def test_no_import_cycles():
    mods = _modules()
    graph = {name: _imports(name, path, mods) for name, path in mods.items()}
    assert len(graph) > 150  # (every module was read)
    assert _cycles(graph) == []


def test_the_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_another_modules_private_names():
    """A ``_name`` is its module's own: another module that needs it needs a public name (deferred imports
    inside functions count too). Third-party private names are listed where they are the library's way."""
    allowed = {("torch.nn.modules.batchnorm", "_BatchNorm")}  # torch's base class of its BatchNorms
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                found += [(name, node.module, alias.name) for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")
                          and (node.module, alias.name) not in allowed]
    assert found == []
