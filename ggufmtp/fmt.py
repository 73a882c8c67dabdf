"""Small text formatters shared by the reports (verify, tune, curve)."""
from __future__ import annotations

import math
from typing import Sequence

__all__ = ["ci_text", "finite_or_none"]


def ci_text(ci: Sequence[float | None] | None, scale: float = 1.0, digits: int = 3, sep: str = "–") -> str:
    """``[lo<sep>hi]`` of a confidence interval (times ``scale``), ``[n/a]`` when either end is missing.
    The tables keep their own separators: verify's en dash, tune's ASCII hyphen."""
    if not ci or ci[0] is None or ci[1] is None:
        return "[n/a]"
    return f"[{ci[0] * scale:.{digits}f}{sep}{ci[1] * scale:.{digits}f}]"


def finite_or_none(x: float | None, nd: int | None = None) -> float | None:
    """``x`` as a float rounded to ``nd`` places, or None when missing or not finite (JSON has no NaN)."""
    if x is None:
        return None
    x = float(x)
    if not math.isfinite(x):
        return None
    return round(x, nd) if nd is not None else x
