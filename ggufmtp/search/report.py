"""What a search measured, as a Pareto table (size, KLD, acceptance, speed): text, JSON and an SVG.

The points (:class:`Point`): each measured candidate as the whole file it was measured in (the
baseline with that one group changed: its size is the baseline's with the group's bytes swapped,
known when the table holds the group's baseline-type cost), the allocation's *prediction*, and,
after a proof, the two proved files. A point is on the Pareto front when no other point is at
most as large with a lower KLD. The SVG is written by hand (no plotting dependency) so the card
can embed it: KLD against size, the front joined, the proved points labelled.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from html import escape

from ..fmt import human_bytes
from ..provenance.search_card import SearchPoint
from .allocate import baseline_type
from .prove import ProofResult
from .records import Allocation, SensitivityTable


class PointKind(enum.Enum):
    CANDIDATE = "candidate"   # measured: the baseline with one group at a candidate type
    PREDICTED = "predicted"   # the allocation, as the additive model predicts it
    PROVED = "proved"         # quantized and measured whole (the proof's arms)


@dataclasses.dataclass(frozen=True)
class Point:
    label: str
    kind: PointKind
    n_bytes: int
    kld: float
    acceptance_diff: float | None = None  # a candidate's head against the source, paired
    tokens_per_second: float | None = None
    pareto: bool = False
    acceptance: float | None = None  # a proved file's head, in the proof's one interleaved run

    def to_dict(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "kind": self.kind.value}


def _baseline_bytes(table: SensitivityTable) -> dict[str, int]:
    base_type = baseline_type(table)
    return {c.candidate.group: c.candidate.n_bytes for c in table.costs if c.candidate.qtype == base_type}


def candidate_points(table: SensitivityTable) -> list[Point]:
    """Each measured candidate as the file it was measured in (when the baseline's size is known)."""
    base = _baseline_bytes(table)
    if set(base) != {g.name for g in table.groups}:
        return []
    total = sum(base.values())
    return [Point(f"{c.candidate.group}={c.candidate.qtype}", PointKind.CANDIDATE,
                  total - base[c.candidate.group] + c.candidate.n_bytes, c.kld, c.acceptance_diff)
            for c in table.costs]


def predicted_point(allocation: Allocation, label: str = "searched (predicted)") -> Point:
    return Point(label, PointKind.PREDICTED, allocation.n_bytes, allocation.predicted_kld,
                 allocation.predicted_acceptance_diff)


def proof_points(proof: ProofResult) -> list[Point]:
    return [Point(f"{arm.recipe} (proved)", PointKind.PROVED, arm.n_bytes, arm.kld, None, arm.tokens_per_second,
                  acceptance=arm.acceptance) for arm in (proof.found, proof.shipped)]


def all_points(table: SensitivityTable, allocation: Allocation, proof: ProofResult | None = None) -> list[Point]:
    """Everything measured and predicted. Sizes are bytes of the groups' tensors; with a proof, whole
    files: the other bytes (header, norms) are the found file's size less its groups' bytes, the same
    in every file of this model."""
    points = [*candidate_points(table), predicted_point(allocation)]
    if proof is None:
        return points
    other = proof.found.n_bytes - allocation.n_bytes
    return [dataclasses.replace(p, n_bytes=p.n_bytes + other) for p in points] + proof_points(proof)


def with_front(points: Sequence[Point]) -> list[Point]:
    """The points by size, each marked whether it is on the Pareto front of size and KLD."""
    ordered = sorted(points, key=lambda p: (p.n_bytes, p.kld))
    out, best = [], float("inf")
    for p in ordered:
        out.append(dataclasses.replace(p, pareto=p.kld < best))
        best = min(best, p.kld)
    return out


def _opt(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(points: Sequence[Point], front_only: bool = False) -> str:
    """The Pareto table as text (``*``: on the front); ``front_only``: the front and the predicted and
    proved points, the other candidates counted in one line."""
    rows = [f"{'':1} {'point':<34} {'kind':<10} {'size':>10} {'KLD':>10} {'head':>10} {'tok/s':>8}"]
    marked = with_front(points)
    shown = [p for p in marked if not front_only or p.pareto or p.kind is not PointKind.CANDIDATE]
    for p in shown:
        acc = (f"{p.acceptance_diff * 100:+.1f} pt" if p.acceptance_diff is not None  # against the source
               else f"{p.acceptance * 100:.1f} %" if p.acceptance is not None else "-")  # a proved file's own
        rows.append(f"{'*' if p.pareto else ' ':1} {p.label[:34]:<34} {p.kind.value:<10} {human_bytes(p.n_bytes):>10} "
                    f"{p.kld:>10.6f} {acc:>10} {_opt(p.tokens_per_second, '.1f'):>8}")
    if len(shown) < len(marked):
        rows.append(f"  ({len(marked) - len(shown)} more measured candidates off the front: --json lists every point)")
    return "\n".join(rows)


W, H, PAD = 640, 400, 60
COLOURS = {PointKind.CANDIDATE: "#9aa5b1", PointKind.PREDICTED: "#e8a33d", PointKind.PROVED: "#1f6feb"}


def svg(points: Sequence[Point], title: str = "KLD against size") -> str:
    """The points as an SVG scatter (KLD against size; the front joined; predicted and proved labelled)."""
    pts = with_front(points)
    if not pts:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}"></svg>\n'
    xs, ys = [p.n_bytes for p in pts], [p.kld for p in pts]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = 0.0, max(ys) * 1.1 if max(ys) > 0 else 1.0

    def sx(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD)

    def sy(y: float) -> float:
        return H - PAD - (y - y0) / (y1 - y0) * (H - 2 * PAD)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
           f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>',
           f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
           f'<text x="{W / 2}" y="{H - 15}" text-anchor="middle">size ({escape(human_bytes(x0))} to '
           f'{escape(human_bytes(x1))})</text>',
           f'<text x="15" y="{H / 2}" transform="rotate(-90 15 {H / 2})" text-anchor="middle">KLD (0 to {y1:.4g})</text>']
    front = [p for p in pts if p.pareto]
    if len(front) > 1:
        path = " ".join(f"{sx(p.n_bytes):.1f},{sy(p.kld):.1f}" for p in front)
        out.append(f'<polyline points="{path}" fill="none" stroke="#444" stroke-dasharray="4 3"/>')
    for p in pts:
        out.append(f'<circle cx="{sx(p.n_bytes):.1f}" cy="{sy(p.kld):.1f}" r="{5 if p.kind is not PointKind.CANDIDATE else 3}" '
                   f'fill="{COLOURS[p.kind]}"><title>{escape(p.label)}: {p.kld:.6f}</title></circle>')
        if p.kind is not PointKind.CANDIDATE:
            out.append(f'<text x="{sx(p.n_bytes) + 7:.1f}" y="{sy(p.kld) - 7:.1f}">{escape(p.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def card_points(points: Sequence[Point]) -> list[SearchPoint]:
    """The rows the recipe's ``[[search.points]]`` keep for the card (the shape a receipt reads back):
    the front, the prediction and the proved files (the other candidates are in ``--json``)."""
    return [SearchPoint(label=p.label, kind=p.kind.value, n_bytes=p.n_bytes, kld=p.kld, pareto=p.pareto)
            for p in with_front(points) if p.pareto or p.kind is not PointKind.CANDIDATE]
