"""The import graph of crucible/, acp_host/ and mcp_bridge/, read with `ast` (nothing is
imported): no module imports another that imports it back, counting imports inside
functions; acp_host and mcp_bridge never import crucible or each other; and every import
left inside a function says why on its line or the comment line above its group.

Imports under `if TYPE_CHECKING:` never run and are not counted."""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("crucible", "acp_host", "mcp_bridge")
# Files other branches were rewriting when this test was written: their function-level imports
# get their reasons when that work is merged (the cycle check covers them already).
REASONS_PENDING: set[str] = set()


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: str
    line: int
    in_function: bool


def module_files() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, known: set[str]) -> tuple[list[Edge], list[ast.stmt]]:
    """The module's edges to other known modules, and every import statement inside a function."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    edges: list[Edge] = []
    in_functions: list[ast.stmt] = []

    def target_of(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def add(name: str, node: ast.stmt, in_function: bool) -> None:
        target = target_of(name)
        if target is not None and target != module:
            edges.append(Edge(module, target, rel, node.lineno, in_function))

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    walk(stmt, in_function)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, in_function)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    add(full if full in known else base, child, in_function)
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                in_functions.append(child)
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return edges, in_functions


def import_graph() -> tuple[dict[str, list[Edge]], dict[Path, list[ast.stmt]]]:
    files = module_files()
    known = set(files)
    graph: dict[str, list[Edge]] = {}
    local: dict[Path, list[ast.stmt]] = {}
    for module, path in files.items():
        edges, in_functions = imports_of(module, path, known)
        # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
        parent = module.rpartition(".")[0]
        while parent:
            edges.append(Edge(module, parent, str(path.relative_to(ROOT)), 0, False))
            parent = parent.rpartition(".")[0]
        graph[module] = edges
        local[path] = in_functions
    return graph, local


def cycles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter({e.target for e in graph[root]}))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter({e.target for e in graph[target]})))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(graph: dict[str, list[Edge]], component: list[str]) -> str:
    members = set(component)
    lines = [" <-> ".join(component)]
    for module in component:
        for e in graph[module]:
            where = "in a function" if e.in_function else "at module level"
            line = f"  {e.path}:{e.line} imports {e.target} ({where})"
            if e.target in members and line not in lines:
                lines.append(line)
    return "\n".join(lines)


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph, _ = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(graph, c) for c in found)


def test_the_cycle_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    # The check itself: a cycle made only by an import inside a function is found.
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import b\n")
    b.write_text("def f():\n    import a\n")
    c = tmp_path / "c.py"
    c.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    graph = {name: imports_of(name, path, {"a", "b", "c"})[0] for name, path in
             (("a", a), ("b", b), ("c", c))}
    assert cycles(graph) == [["a", "b"]]
    assert graph["c"] == []  # a TYPE_CHECKING import never runs


@pytest.mark.parametrize("library", ["acp_host", "mcp_bridge"])
def test_the_libraries_never_import_crucible_or_each_other(library: str) -> None:
    graph, _ = import_graph()
    others = {"crucible", *PACKAGES} - {library}
    wrong = [f"{e.path}:{e.line} imports {e.target}" for module, edges in graph.items()
             if module.split(".")[0] == library for e in edges if e.target.split(".")[0] in others]
    assert not wrong, "\n".join(wrong)


def _comment_lines(source: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string
    return out


def _unexplained(path: Path, statements: list[ast.stmt]) -> list[str]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    comments = _comment_lines(source)
    import_lines = {n for s in statements for n in range(s.lineno, (s.end_lineno or s.lineno) + 1)}
    bad = []
    for stmt in statements:
        own = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
        if any(n in comments and not comments[n].startswith(("# noqa", "# type:")) for n in own):
            continue
        above = stmt.lineno - 1
        # A group of imports (blank lines between them too) shares the comment above it.
        while above in import_lines or (above > 0 and not lines[above - 1].strip()):
            above -= 1
        if lines[above - 1].strip().startswith("#"):
            continue
        bad.append(f"{path.relative_to(ROOT)}:{stmt.lineno}: {lines[stmt.lineno - 1].strip()}")
    return bad


def test_every_import_inside_a_function_says_why() -> None:
    _, local = import_graph()
    bad = [line for path, statements in local.items()
           if str(path.relative_to(ROOT)) not in REASONS_PENDING for line in _unexplained(path, statements)]
    assert not bad, ("imports inside functions without a reason (a comment on the line, or above the "
                     "group; only where start-up time needs them):\n" + "\n".join(bad))
