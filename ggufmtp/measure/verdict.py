"""verify's verdict: the thresholds (:class:`Thresholds`), the verdict (:class:`Verdict`) and the
policy that turns each thinking mode's numbers into a verdict (:func:`evaluate_verdict`).

Policy (see :mod:`ggufmtp.measure.verify`): acceptance >= ``min_acceptance`` whenever a threshold
is set; outputs identical to vanilla in at least ``min_identical`` of the pairs of EVERY comparison
verify made (each mode's chat arm, ``--raw``, every sweep window; default 1.0: any differing reply
fails, and the reason names the comparison and the first differing prompt); speedup >=
``min_speedup`` only when the model was offloaded to a GPU (or ``enforce_speedup``), since a small
model on CPU is compute-bound and MTP is expected to be slower there.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..fmt import pct, times
from .verify_summary import Comparison

__all__ = ["Verdict", "Thresholds", "evaluate_verdict"]


class Verdict(str, enum.Enum):
    """The outcome of a verification; its value is the JSON string ("pass" / "fail")."""

    PASS = "pass"
    FAIL = "fail"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Thresholds:
    """What a verification must reach. ``source`` says where the figures came from ("none",
    "recipe NAME", "flags", "recipe NAME + flags")."""

    min_acceptance: float | None = None
    min_speedup: float | None = None
    min_identical: float = 1.0
    enforce_speedup: bool = False
    source: str = "none"

    @classmethod
    def from_recipe(cls, table: Any, name: str | None = None) -> "Thresholds":
        """The thresholds of a recipe's ``[verify]`` table (``ggufmtp.quant.recipe.VerifyThresholds``)."""
        return cls(min_acceptance=getattr(table, "min_acceptance", None),
                   min_speedup=getattr(table, "min_speedup", None),
                   source=f"recipe {name}" if name else "recipe")

    def merged(self, min_acceptance: float | None = None, min_speedup: float | None = None,
               min_identical: float | None = None, enforce_speedup: bool = False) -> "Thresholds":
        """These thresholds with explicit settings (command-line flags) over them: a given
        acceptance or speedup replaces this one and adds "flags" to ``source``; ``min_identical``
        replaces when given; ``enforce_speedup`` can only switch the check on."""
        th = self
        if min_acceptance is not None or min_speedup is not None:
            th = dataclasses.replace(
                th, min_acceptance=th.min_acceptance if min_acceptance is None else min_acceptance,
                min_speedup=th.min_speedup if min_speedup is None else min_speedup,
                source="flags" if th.source == "none" else f"{th.source} + flags")
        return dataclasses.replace(th, enforce_speedup=enforce_speedup or th.enforce_speedup,
                                   min_identical=th.min_identical if min_identical is None else float(min_identical))

    @classmethod
    def coerce(cls, t: Any) -> "Thresholds":
        """``t`` as thresholds: a Thresholds, its dict, a recipe's ``VerifyThresholds``, or None."""
        if t is None:
            return cls()
        if isinstance(t, Thresholds):
            return t
        if isinstance(t, dict):
            return cls(**{k: v for k, v in t.items() if k in {f.name for f in dataclasses.fields(cls)}})
        return cls.from_recipe(t)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def evaluate_verdict(per_mode: Mapping[str, Comparison], thresholds: Thresholds, offloaded: bool,
                     others: Sequence[Comparison] = ()) -> tuple[Verdict, list[str], list[str]]:
    """``(verdict, reasons, notes)`` from each mode's main numbers and every other comparison's
    identity.

    ``per_mode[mode]`` is the :class:`~ggufmtp.measure.verify_summary.Comparison` of the chat arm at
    k = draft_n_max (its ``acceptance``, ``speedup`` and ``identical_output_fraction`` are judged);
    ``others``: every other comparison of the run (``--raw``, other sweep windows), whose replies
    must equal vanilla's too. ``reasons`` are the failures (verdict FAIL iff non-empty); ``notes``
    explain what was not checked and why.
    """
    t = thresholds
    speed_applies = offloaded or t.enforce_speedup
    reasons: list[str] = []
    for mode, m in per_mode.items():
        reasons += _mode_failures("" if len(per_mode) == 1 else f" [{mode}]", m, t, speed_applies)
    for c in others:
        if not any(c is m for m in per_mode.values()):
            reasons += _identity_failure(f" [{_where(c)}]", c, t)
    notes = _unchecked_notes(t, speed_applies, offloaded)
    if t.min_identical < 1.0:
        notes.append(f"identical output required in only {pct(t.min_identical)} of the pairs (--min-identical): "
                     "replies that differ from vanilla are tolerated up to that share")
    return (Verdict.FAIL if reasons else Verdict.PASS), reasons, notes


def _where(c: Comparison) -> str:
    """A comparison's name in a reason: ``k=2, raw /completion, thinking``."""
    return ", ".join([f"k={c.k}"] + (["raw /completion"] if c.endpoint == "raw" else [])
                     + ([c.mode] if c.mode != "default" else []))


def _identity_failure(tag: str, m: Comparison, t: Thresholds) -> list[str]:
    """The reason a comparison fails the identity requirement (none when it meets it)."""
    ident = m.identical_output_fraction
    if ident is not None and ident >= t.min_identical:
        return []
    first = m.mismatches[0] if m.mismatches else None
    where = (f"; first: prompt {first.prompt_id!r} seed {first.seed} differs at character {first.first_difference_at}"
             if first else "")
    return [f"identical output{tag}: {m.identical}/{m.n_pairs} MTP replies ({pct(ident)}) equal the vanilla replies "
            f"(required {pct(t.min_identical)}); speculative decoding at temperature 0 must be lossless{where}"]


def _mode_failures(tag: str, m: Comparison, t: Thresholds, speed_applies: bool) -> list[str]:
    out = []
    acc = m.acceptance
    if t.min_acceptance is not None and (acc is None or acc < t.min_acceptance):
        out.append(f"acceptance{tag} {pct(acc)} is below the minimum {pct(t.min_acceptance)}")
    out += _identity_failure(tag, m, t)
    sp = m.speedup
    if t.min_speedup is not None and speed_applies and (sp is None or sp < t.min_speedup):
        out.append(f"speedup{tag} {times(sp)} is below the minimum {times(t.min_speedup)}")
    return out


def _unchecked_notes(t: Thresholds, speed_applies: bool, offloaded: bool) -> list[str]:
    notes = []
    if t.min_acceptance is None:
        notes.append("no acceptance threshold set (use --recipe or --min-acceptance): acceptance not checked")
    if t.min_speedup is None:
        notes.append("no speedup threshold set (use --recipe or --min-speedup): speedup not checked")
    elif not speed_applies:
        notes.append(f"speedup threshold {times(t.min_speedup)} not applied: the model ran on CPU without GPU offload, "
                     "where a small model is compute-bound and MTP is expected to be slower; the speedup is "
                     "reported for information (--enforce-speedup checks it anyway)")
    elif not offloaded:
        notes.append("speedup threshold enforced on a CPU run (--enforce-speedup)")
    return notes
