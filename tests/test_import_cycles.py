"""No import circles in ``src/exactly``.

The graph is built with ``ast`` from every import statement of every module, at the top level and
inside functions alike (a function-level import is how a circle is usually hidden: it works until
someone moves it), but not inside ``if TYPE_CHECKING:`` blocks, which never run. An edge goes to the
module named: ``from a.b import c`` points at ``a.b.c`` when that is a module, else at ``a.b``.
Parent packages are not added as edges (Python has already started importing them by the time a
submodule imports a sibling), so a package ``__init__`` that imports its modules is not a circle.
A package ``__init__`` that imports by computed name (``importlib.import_module``) is taken to
import every module directly inside it, the only thing such a registry does.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "exactly"


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Every (imported name, line) outside ``if TYPE_CHECKING:`` blocks, relative ones resolved."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            found.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
            found.append((base, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _imports_dynamically(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                return True
    return False


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        if path.name == "__init__.py" and _imports_dynamically(tree):
            graph[module] |= {m for m in modules if m.rpartition(".")[0] == module}
        names = _imports(tree, module, path.name == "__init__.py")
        targets: dict[int, set[str]] = {}
        for name, line in names:
            if name.split(".")[0] == ROOT and name in modules:
                targets.setdefault(line, set()).add(name)
        for line_targets in targets.values():
            # ``from a.b import c``: the submodule a.b.c when it exists, else a.b itself
            specific = {t for t in line_targets if not any(o.startswith(t + ".") for o in line_targets)}
            graph[module] |= specific - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


def test_the_graph_sees_function_level_imports_and_skips_type_checking() -> None:
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from exactly.b import X\n"
        "def f():\n    from exactly import c\n"
    )
    names = {n for n, _ in _imports(ast.parse(code), "exactly.a", False)}
    assert "exactly.c" in names and "exactly.b.X" not in names and "exactly.b" not in names


def test_cycles_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles_in_src() -> None:
    graph = import_graph()
    assert graph.get("exactly.server.broker")
    found = cycles(graph)
    assert found == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


# Modules allowed to import by computed name (the graph cannot see those edges): the CLI imports
# only the command being run, for start-up time; Spark's worker daemon preloads a list of modules
# before it forks (an entry point of its own process that no module imports, so no circle can run
# through it; a missing optional module is skipped).
DYNAMIC_IMPORTERS = {"exactly.cli.main", "exactly.spark.daemon"}


def test_dynamic_imports_only_where_the_graph_allows_them() -> None:
    """``importlib.import_module`` hid the server's circle from this graph once (the handler
    registry imported its modules by name); a new dynamic import must be added here knowingly."""
    found = {
        module
        for module, path in _modules().items()
        if _imports_dynamically(ast.parse(path.read_text(), str(path)))
    }
    assert found <= DYNAMIC_IMPORTERS, found - DYNAMIC_IMPORTERS
