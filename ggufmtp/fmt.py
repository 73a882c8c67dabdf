"""Small text formatters shared by the reports (verify, tune, curve)."""
from __future__ import annotations

from typing import Sequence

__all__ = ["ci_text"]


def ci_text(ci: Sequence[float | None] | None, scale: float = 1.0, digits: int = 3, sep: str = "–") -> str:
    """``[lo<sep>hi]`` of a confidence interval (times ``scale``), ``[n/a]`` when either end is missing.
    The tables keep their own separators: verify's en dash, tune's ASCII hyphen."""
    if not ci or ci[0] is None or ci[1] is None:
        return "[n/a]"
    return f"[{ci[0] * scale:.{digits}f}{sep}{ci[1] * scale:.{digits}f}]"
