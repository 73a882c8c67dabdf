"""Thresholds that judge nothing, and what a card shows a reader.

A minimum of 0 passes whatever was measured: ``min_identical`` 0 (any reply counts as lossless),
``min_acceptance`` 0 where it judges the head (no reference comparison, or ``--absolute-acceptance``),
``min_speedup`` 0 where the speed was judged (GPU offload, or ``enforce_speedup``). Such a verdict
"pass" claims nothing there, so the publish gate (:mod:`ggufmtp.hub.gate`) refuses it unless the
card says so in its :data:`VACUOUS_HEADING` section, naming each threshold; ``ggufmtp card`` writes
that section (:func:`vacuous_notice`).

A card "says" something only in the text a reader sees: :func:`visible_text` drops HTML comments
(``<!-- Not verified -->`` is invisible on the Hub).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ..fmt import pct, times

__all__ = ["VACUOUS_HEADING", "vacuous_notice", "vacuous_thresholds", "visible_text"]

VACUOUS_HEADING = "## Thresholds that judge nothing"

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)  # an unclosed comment hides the rest


def visible_text(markdown: str) -> str:
    """``markdown`` without its HTML comments: what a reader of the rendered card sees."""
    return _COMMENT.sub("", markdown)


def _zero(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x <= 0


def vacuous_thresholds(verification: Any) -> dict[str, str]:
    """Each threshold of a recorded verification that judges nothing, by its key, with why
    (empty when none does)."""
    from .verdict import speed_judged_record

    v = verification if isinstance(verification, Mapping) else {}
    th = v.get("thresholds")
    if not isinstance(th, Mapping):
        return {}
    out = {}
    if _zero(th.get("min_identical")):
        out["min_identical"] = f"min_identical {pct(th['min_identical'])}: any reply counts as identical to vanilla"
    head_vs_reference = isinstance(v.get("head"), Mapping) and not th.get("absolute_acceptance")
    if _zero(th.get("min_acceptance")) and not head_vs_reference:
        out["min_acceptance"] = f"min_acceptance {pct(th['min_acceptance'])}: any head passes"
    if _zero(th.get("min_speedup")) and speed_judged_record(v):
        out["min_speedup"] = f"min_speedup {times(th['min_speedup'])}: any speed passes, slower than vanilla included"
    return out


def vacuous_notice(verification: Any) -> list[str]:
    """The card's section naming each threshold that judges nothing (none: no section)."""
    found = vacuous_thresholds(verification)
    if not found:
        return []
    return [f"{VACUOUS_HEADING}\n", "The verdict below passes whatever was measured against these thresholds, "
            "so it claims nothing there: " + "; ".join(found.values()) + ".\n"]
