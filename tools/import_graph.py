#!/usr/bin/env python3
"""Draw ggufmtp's import graph and check it has no cycle.

Every ``import`` / ``from ... import`` in every module counts, at any depth (a function-level
import is an edge like a top-level one; so is one under ``if TYPE_CHECKING:``). Only edges
between ggufmtp's own modules are kept; ``from pkg import name`` points at ``pkg.name`` when that
is a module, else at ``pkg``. Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``;
those implicit edges are left out (they hold only docstrings, see ``tests/test_architecture.py``).

    python3 tools/import_graph.py              # text: each module and what it imports
    python3 tools/import_graph.py --packages   # the same, folded to the folders (the pipeline stages)
    python3 tools/import_graph.py --dot | dot -Tsvg > imports.svg

Exits 1 and names the cycle when there is one. ``tests/test_architecture.py`` uses this module.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "ggufmtp"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file of the package (a package is its ``__init__``)."""
    out: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in (``a.b.func`` -> ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            pkg = ".".join(base + ([node.module] if node.module else []))
        else:
            pkg = node.module or ""
        names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in modules else pkg for a in node.names]
    else:
        return []
    found = (_owner(n, modules) for n in names if n == PACKAGE or n.startswith(PACKAGE + "."))
    return [t for t in found if t is not None]


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the ggufmtp modules it imports (anywhere in its body)."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(tree):
            edges.update(_targets(node, name, is_package, modules))
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None. Depth-first search with white/grey/black marks."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def fold_to_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the package's folders (``ggufmtp.measure.verify.run`` -> ``measure``);
    top-level modules stay themselves."""
    def folder(m: str) -> str:
        parts = m.split(".")
        return parts[1] if len(parts) > 1 else PACKAGE

    out: dict[str, set[str]] = {}
    for src, dsts in graph.items():
        out.setdefault(folder(src), set()).update(folder(d) for d in dsts if folder(d) != folder(src))
    return out


def to_text(graph: dict[str, set[str]]) -> str:
    return "\n".join(f"{m} -> {', '.join(sorted(d)) or '(nothing)'}" for m, d in sorted(graph.items()))


def to_dot(graph: dict[str, set[str]]) -> str:
    lines = ["digraph ggufmtp {", "  rankdir=LR;", "  node [shape=box, fontname=monospace];"]
    for m in sorted(graph):
        lines.append(f'  "{m}";')
        lines += [f'  "{m}" -> "{d}";' for d in sorted(graph[m])]
    lines.append("}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    graph = import_graph()
    shown = fold_to_packages(graph) if "--packages" in argv else graph
    print(to_dot(shown) if "--dot" in argv else to_text(shown))
    cycle = find_cycle(graph)
    if cycle:
        print("import cycle: " + " -> ".join(cycle), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
