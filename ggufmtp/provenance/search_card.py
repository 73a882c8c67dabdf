"""How a searched recipe was found, from its receipt to its card (issue #43).

A recipe ``ggufmtp search`` wrote carries a ``[search]`` table: the method, the budget, the
predicted KLD, the proof against the shipped recipe (``[search.proof]``) and the Pareto table's
front with the prediction and the proved files (``[[search.points]]``). :func:`search_record` reads
the part a receipt keeps, strictly: the recipe file is input like any other, so only known keys of
the right types are kept (finite numbers, short one-line strings), and only from the very bytes
whose sha256 the receipt records. :func:`search_lines` renders the card's section: the search's
claims, labelled as such (they are the search's own measurements of other files, bound to this file
by the recipe's digest, and this file's audit does not judge them), the Pareto table and a text plot
of KLD against size, which renders wherever the card does (the Hub, GitHub, a terminal).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from ..errors import TomlError
from ..files.tomlfile import loads_toml
from ..fmt import divergence, human_bytes

__all__ = ["SEARCH_HEADING", "SearchPoint", "SearchRecord", "search_lines", "search_record", "text_plot"]

SEARCH_HEADING = "## How the recipe was found"
MAX_POINTS = 40
MAX_TEXT = 400


class SearchPoint(TypedDict):
    label: str
    kind: str  # "candidate", "predicted" or "proved"
    n_bytes: int
    kld: float
    pareto: bool


class SearchProof(TypedDict, total=False):
    verdict: str
    against: str
    reason: str
    kld: float
    shipped_kld: float
    kld_diff: float
    kld_diff_ci95: list[float]
    n_bytes: int
    shipped_n_bytes: int
    acceptance_diff: float
    acceptance_diff_ci95: list[float]


class SearchRecord(TypedDict, total=False):
    method: str
    baseline_recipe: str
    corpus: str
    table_sha256: str
    budget_bytes: int
    n_bytes: int
    bpw: float
    predicted_kld: float
    proof: SearchProof
    points: list[SearchPoint]


_TEXT = ("method", "baseline_recipe", "corpus", "table_sha256")
_INTS = ("budget_bytes", "n_bytes")
_FLOATS = ("bpw", "predicted_kld")
_PROOF_TEXT = ("verdict", "against", "reason")
_PROOF_INTS = ("n_bytes", "shipped_n_bytes")
_PROOF_FLOATS = ("kld", "shipped_kld", "kld_diff", "acceptance_diff")
_PROOF_PAIRS = ("kld_diff_ci95", "acceptance_diff_ci95")
_KINDS = ("candidate", "predicted", "proved")


def _text(v: object) -> str | None:
    """A short one-line string, or None: a recipe's strings reach a markdown card."""
    if not isinstance(v, str) or not v or len(v) > MAX_TEXT or any(c in v for c in "\r\n|`<>"):
        return None
    return v


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 else None


def _float(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _pair(v: object) -> list[float] | None:
    if not isinstance(v, list) or len(v) != 2:
        return None
    lo, hi = _float(v[0]), _float(v[1])
    return None if lo is None or hi is None else [lo, hi]


def _proof(doc: object) -> SearchProof | None:
    if not isinstance(doc, Mapping):
        return None
    out: dict[str, object] = {}
    for keys, read in ((_PROOF_TEXT, _text), (_PROOF_INTS, _int), (_PROOF_FLOATS, _float), (_PROOF_PAIRS, _pair)):
        for k in keys:
            v = read(doc.get(k))
            if v is not None:
                out[k] = v
    return SearchProof(**out) if "verdict" in out else None  # type: ignore[typeddict-item]


def _point(doc: object) -> SearchPoint | None:
    if not isinstance(doc, Mapping):
        return None
    label, n, kld = _text(doc.get("label")), _int(doc.get("n_bytes")), _float(doc.get("kld"))
    kind, pareto = doc.get("kind"), doc.get("pareto")
    if label is None or n is None or kld is None or kld < 0 or kind not in _KINDS or not isinstance(pareto, bool):
        return None
    return SearchPoint(label=label, kind=str(kind), n_bytes=n, kld=kld, pareto=pareto)


def record_of(table: object) -> SearchRecord | None:
    """The receipt's part of a recipe's ``[search]`` table (see the module doc); None when it is not one."""
    if not isinstance(table, Mapping):
        return None
    out: dict[str, object] = {}
    for keys, read in ((_TEXT, _text), (_INTS, _int), (_FLOATS, _float)):
        for k in keys:
            v = read(table.get(k))
            if v is not None:
                out[k] = v
    if "method" not in out:
        return None
    proof = _proof(table.get("proof"))
    if proof:
        out["proof"] = proof
    raw = table.get("points")
    points = [p for p in (_point(x) for x in raw[:MAX_POINTS]) if p] if isinstance(raw, list) else []
    if points:
        out["points"] = points
    return SearchRecord(**out)  # type: ignore[typeddict-item]


def search_record(recipe_path: str | Path | None, sha256: str | None) -> SearchRecord | None:
    """The ``[search]`` record of the recipe file at ``recipe_path`` when its bytes are still the ones
    whose sha256 the receipt records; None for a recipe without one (or a file changed since)."""
    if recipe_path is None or sha256 is None:
        return None
    try:
        data = Path(recipe_path).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != sha256:
        return None
    try:
        doc = loads_toml(data)
    except TomlError:
        return None
    return record_of(doc.get("search"))


def text_plot(points: Sequence[SearchPoint], width: int = 56, height: int = 12) -> list[str]:
    """KLD (up) against size (right) as text: ``.`` a measured candidate, ``o`` the prediction, ``*`` a
    proved file, ``#`` where several fall on one cell."""
    if not points:
        return []
    xs, ys = [p["n_bytes"] for p in points], [p["kld"] for p in points]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y1 = max(ys) * 1.05 if max(ys) > 0 else 1.0
    grid = [[" "] * width for _ in range(height)]
    mark = {"candidate": ".", "predicted": "o", "proved": "*"}
    for p in points:
        col = round((p["n_bytes"] - x0) / (x1 - x0) * (width - 1))
        row = height - 1 - round(p["kld"] / y1 * (height - 1))
        cell = grid[row][col]
        grid[row][col] = mark[p["kind"]] if cell == " " else "#"
    label = f"{y1:.4g}"
    pad = len(label)
    lines = [f"{label if i == 0 else '0'.rjust(pad) if i == height - 1 else ' ' * pad} |{''.join(r)}"
             for i, r in enumerate(grid)]
    lines.append(f"{' ' * pad} +{'-' * width}")
    left, right = human_bytes(x0), human_bytes(x1)
    lines.append(f"{' ' * pad}  {left}{right.rjust(width - len(left))}")
    lines.append(f"{' ' * pad}  KLD against size: . measured  o predicted  * proved")
    return lines


def _proof_line(proof: SearchProof) -> list[str]:
    ci = proof.get("kld_diff_ci95")
    kld = (f" KLD {divergence(proof['kld'])} against {divergence(proof['shipped_kld'])}"
           if "kld" in proof and "shipped_kld" in proof else "")
    kld += f" (paired difference, 95% CI {ci[0]:+.6f} to {ci[1]:+.6f})" if ci else ""
    head = proof.get("acceptance_diff_ci95")
    acc = (f"; its head against the shipped file's: {proof['acceptance_diff'] * 100:+.1f} pts "
           f"(95% CI {head[0] * 100:+.1f} to {head[1] * 100:+.1f})" if head and "acceptance_diff" in proof else "")
    against = f" against `{proof['against']}`" if "against" in proof else ""
    return [f"Its proof{against}: **{proof['verdict']}**.{kld}{acc}.", ""]


def search_lines(record: SearchRecord | None, recipe_name: str) -> list[str]:
    """The card's section on how the recipe was found (empty without a record)."""
    if not record:
        return []
    size = f" under a budget of {human_bytes(record['budget_bytes'])}" if "budget_bytes" in record else ""
    bpw = f", {record['bpw']:.2f} bits per weight over its groups" if "bpw" in record else ""
    lines = [f"{SEARCH_HEADING}\n",
             f"The recipe `{recipe_name}` was found by `ggufmtp search` ({record['method']}, baseline "
             f"`{record.get('baseline_recipe', '?')}`){size}{bpw}. The figures in this section are the search's own "
             "measurements, recorded in the recipe file and bound to this file by the recipe's sha256 in the receipt. "
             "This file's audit does not judge them.", ""]
    if "proof" in record:
        lines += _proof_line(record["proof"])
    points = record.get("points") or []
    if points:
        lines += ["| point | kind | size | KLD | Pareto front |", "|---|---|---|---|---|"]
        lines += [f"| {p['label']} | {p['kind']} | {human_bytes(p['n_bytes'])} | {divergence(p['kld'])} | "
                  f"{'yes' if p['pareto'] else ''} |" for p in sorted(points, key=lambda p: p["n_bytes"])]
        lines += ["", "```text", *text_plot(points), "```", ""]
    return lines
