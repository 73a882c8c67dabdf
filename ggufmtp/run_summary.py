"""What ``ggufmtp run`` prints: its summary (:meth:`ggufmtp.pipeline.RunResult.summary`) for people."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .fmt import ci_phrase, pct, points, times
from .jsontypes import JsonObject
from .provenance.head import level_text
from .provenance.verdict import Findings

if TYPE_CHECKING:
    from .measure.verify.reference import ReferencePhaseRecord

__all__ = ["RunSummary", "StageStatus", "format_summary", "verdict_text"]


def verdict_text(s: Mapping[str, Any]) -> str:
    """``pass``, or the verdict with its first reason: ``fail — head degraded: ...``, ``inconclusive —
    head inconclusive: ... needs about 40 prompts``; ``not verified`` without a verification."""
    verdict = s.get("verdict") or "not verified"
    reasons = s.get("reasons") or []
    return f"{verdict} — {reasons[0]}" if verdict != "pass" and reasons else str(verdict)


def format_summary(s: JsonObject) -> str:
    """The summary for people (what ``ggufmtp run`` prints)."""
    def with_ci(v: float | None, ci: list | None, as_pct: bool) -> str:
        if v is None:
            return "-"
        if as_pct:
            return pct(v, space=False) + ci_phrase(ci, scale=100, digits=1, unit="%", sep="-")
        return times(v, nd=2, sign="x") + ci_phrase(ci, digits=2, unit="x", sep="-")

    rows = [
        ("artifact", s["artifact"]),
        ("size", f"{s['size_bytes']:,} bytes, {s['bpw']:.3f} bpw" if s.get("size_bytes") else "-"),
        ("MTP", ", ".join(f"blk.{b}" for b in s.get("mtp_blocks") or [s["mtp_block"]]) + f" {s['mtp_status']}"),
        ("acceptance", with_ci(s["acceptance"], s["acceptance_ci95"], True)),
        ("speedup", with_ci(s["speedup"], s["speedup_ci95"], False)
         + (" vanilla: speed not verified on this hardware (no GPU offload)" if s.get("speed_checked") is False else "")),
        *([("head", _head_text(s["head"]))] if s.get("head") else []),
        ("verdict", (s["verdict"] or "not verified") + _findings_text(s)),
        *([("why", "; ".join(s["reasons"][:3]))] if s.get("reasons") and s.get("verdict") != "pass" else []),
        ("receipt", s["receipt"]),
        ("card", s["card"] or "-"),
    ]
    if s.get("uploaded"):
        rows.append(("uploaded", s["uploaded"]))
    rows.append(("stages", ", ".join(f"{k} {v}" for k, v in s["stages"].items())))
    return "\n".join(f"{k:<11} {v}" for k, v in rows)


def _findings_text(s: Mapping[str, Any]) -> str:
    """`` (head preserved (vs reference); lossless; speed not verified)`` from the summary's findings."""
    f = Findings.of_dict(s.get("findings"))
    if f is not None:
        return f" ({f.text()})"
    return " (MTP head verified; speed not verified on this hardware)" if s.get("speed_checked") is False and \
        s["verdict"] else ""


def _head_text(h: Mapping[str, Any]) -> str:
    lo, hi = (list(h.get("difference_ci") or []) + [None, None])[:2]
    return (f"{pct(h.get('acceptance'), space=False)} vs reference {pct(h.get('reference_acceptance'), space=False)}: "
            f"{points(h.get('difference'))} ({level_text(h.get('level') or 0.95)} CI {points(lo, '')} to {points(hi, '')}; "
            f"margin {h.get('margin', 0) * 100:.1f}): {h.get('decision', 'inconclusive')}")


class StageStatus(enum.StrEnum):
    """What a stage did in this run."""

    RAN = "ran"
    CACHED = "cached"


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """The run in one record: what ``ggufmtp run`` prints (:meth:`format`) or emits as JSON (:meth:`to_dict`)."""

    artifact: str
    receipt: str
    card: str | None
    size_bytes: int | None
    bpw: float | None
    mtp_status: str | None
    mtp_block: int | None  # the first MTP block
    mtp_blocks: list[int]  # every MTP block
    acceptance: float | None
    acceptance_ci95: list[float] | None
    speedup: float | None
    speedup_ci95: list[float] | None
    verdict: str | None
    uploaded: str | None
    stages: dict[str, StageStatus]
    speed_checked: bool | None = None  # whether the verdict judged the speedup (GPU offload)
    findings: JsonObject | None = None  # the verdict's three findings (provenance.verdict.Findings)
    head: JsonObject | None = None  # the judged mode's head against the reference (provenance.head)
    reasons: list[str] = dataclasses.field(default_factory=list)  # why the verdict is not pass
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # each stage's wall time here
    ran_because: dict[str, str] = dataclasses.field(default_factory=dict)  # each stage that ran: why (not cached)
    # the verification's reference phase (settings.reference_phase): its key, the trunk it drafted on,
    # whether it was measured here or read from the cache (measured by a variant with the same trunk)
    reference: ReferencePhaseRecord | None = None

    def to_dict(self) -> JsonObject:
        d = dataclasses.asdict(self)
        d["stages"] = {k: str(v) for k, v in self.stages.items()}
        return d

    def format(self) -> str:
        return format_summary(self.to_dict())
