#!/usr/bin/env python3
"""Count the untyped JSON-shaped dicts of ggufmtp (issue #32): ``dict[str, Any]`` and its one alias
``JsonObject`` (``ggufmtp/jsontypes.py``), per file, split into those at the JSON edge and the rest.

The rule, on the syntax tree of each module: an occurrence of ``dict[str, Any]`` or ``JsonObject``
(its definition aside) is AT THE JSON EDGE when a function it lies in (its signature or its body,
at any depth of nesting)

  1. converts to or from JSON by its name: ``to_dict``, ``from_dict``, ``to_receipt``,
     ``to_section``, ``to_json``, ``from_json``, ``schema``; or
  2. reads or writes JSON text itself: it calls something whose name holds ``json``
     (``json.load``/``loads``/``dump``/``dumps``, ``atomic_write_json``, ``read_json_file``, ...).

Everything else is NOT at the edge: a field of a class, a module-level name, a helper that takes
or returns a dict without being one of the above. Those are the dicts that cross function or
module boundaries as bundles (settings, results, rows, options), where a typed record belongs; the
alias counts there too, so renaming an internal dict ``JsonObject`` changes nothing. The rule is
conservative: a real JSON document held in a field or handed through a helper (a receipt's
section, a stage's cached record) counts as not at the edge; its shape belongs in a ``TypedDict``.

    python3 tools/count_any_dicts.py            # per file: each spelling, at the edge, not; then the sums
    python3 tools/count_any_dicts.py --lines    # also every occurrence not at the edge

``tests/test_architecture.py`` pins a ceiling on the package's occurrences not at the edge.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "ggufmtp"
ALIAS = "JsonObject"
EDGE_NAMES = frozenset({"to_dict", "from_dict", "to_receipt", "to_section", "to_json", "from_json", "schema"})


@dataclass(frozen=True)
class Hit:
    """One occurrence: where, what, and whether it is at the JSON edge."""

    path: Path
    line: int
    text: str
    edge: bool


def _is_any_dict(node: ast.AST) -> bool:
    return isinstance(node, ast.Subscript) and ast.unparse(node).replace(" ", "") in ("dict[str,Any]", "Dict[str,Any]")


def _is_alias_use(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == ALIAS and isinstance(node.ctx, ast.Load)


def _callee(node: ast.Call) -> str:
    try:
        return ast.unparse(node.func)
    except Exception:  # pragma: no cover - ast.unparse handles every expression
        return ""


def _is_edge_function(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    if fn.name in EDGE_NAMES:
        return True
    return any(isinstance(n, ast.Call) and "json" in _callee(n).lower() for n in ast.walk(fn))


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def hits(path: Path) -> list[Hit]:
    """Every ``dict[str, Any]`` and ``JsonObject`` use in one file, classified."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[Hit] = []

    def visit(node: ast.AST, edge: bool) -> None:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and ALIAS in {ast.unparse(t) for t in _targets(node)}:
            return  # the alias's own definition
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            edge = edge or _is_edge_function(node)
        if _is_any_dict(node) or _is_alias_use(node):
            out.append(Hit(path, node.lineno, ast.unparse(node), edge))
            return
        for child in ast.iter_child_nodes(node):
            visit(child, edge)

    visit(tree, False)
    return out


def package_hits(root: Path = ROOT) -> list[Hit]:
    return [h for p in sorted((root / PACKAGE).rglob("*.py")) for h in hits(p)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    found = package_hits()
    per: dict[Path, list[Hit]] = {}
    for h in found:
        per.setdefault(h.path, []).append(h)
    print(f"{'file':<44} {'dict[str, Any]':>14} {ALIAS:>10} {'edge':>5} {'not edge':>8}")
    rows = sorted(per.items(), key=lambda kv: (-sum(not h.edge for h in kv[1]), str(kv[0])))
    for path, hs in rows + [(ROOT / "all", found)]:
        n_dict, edge = sum(h.text != ALIAS for h in hs), sum(h.edge for h in hs)
        name = "all" if hs is found else str(path.relative_to(ROOT))
        print(f"{name:<44} {n_dict:>14} {len(hs) - n_dict:>10} {edge:>5} {len(hs) - edge:>8}")
    if "--lines" in argv:
        for h in found:
            if not h.edge:
                print(f"{h.path.relative_to(ROOT)}:{h.line}: {h.text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
