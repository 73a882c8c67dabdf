"""The one home of number formatting for reports, tables and cards.

Every helper returns ``missing`` (default ``"n/a"``) for an unknown number, never ``0``. The
reports keep their historical styles through parameters (verify's ``×`` and en dash, tune's
ASCII ``x`` and hyphen, the card's ``-`` for a missing cell); the output of each call site is
unchanged by the move here.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ci_text", "finite_or_none", "pct", "times", "num", "signed_pct", "rel_change", "ci_phrase",
           "human_bytes", "decimal_bytes", "significant", "divergence",
           "points"]

NA = "n/a"


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


def pct(x: float | None, nd: int = 1, space: bool = True, missing: str = NA) -> str:
    """A fraction as a percentage: ``pct(0.5)`` -> ``"50.0 %"``; ``space=False`` -> ``"50.0%"``."""
    if x is None:
        return missing
    return f"{x * 100:.{nd}f}{' ' if space else ''}%"


def points(x: float | None, unit: str = " points", nd: int = 1, missing: str = NA) -> str:
    """A difference of two fractions in percentage points, with its sign: ``-1.0 points``."""
    return missing if x is None else f"{x * 100:+.{nd}f}{unit}"


def signed_pct(x: float | None, nd: int = 1, missing: str = NA) -> str:
    """A relative change with its sign: ``+3.1%``."""
    return missing if x is None else f"{x * 100:+.{nd}f}%"


def times(x: float | None, nd: int = 3, sign: str = "×", missing: str = NA) -> str:
    """A ratio: ``times(1.6)`` -> ``"1.600×"``; tune's tables use ``sign="x"``."""
    return missing if x is None else f"{x:.{nd}f}{sign}"


def num(x: float | None, nd: int = 2, missing: str = NA) -> str:
    """A plain number with ``nd`` decimals."""
    return missing if x is None else f"{x:.{nd}f}"


def rel_change(new: float | None, old: float | None) -> float | None:
    """``new / old - 1``, None when either is unknown or ``old`` is 0."""
    if new is None or old is None or old == 0:
        return None
    return new / old - 1.0


def ci_phrase(ci: Sequence[float | None] | None, scale: float = 1.0, digits: int = 1, unit: str = "",
              sep: str = "–") -> str:
    """`` (95% CI lo–hi<unit>)`` for prose (the card; ``run``'s summary uses ``sep="-"``); empty when
    either end is missing."""
    if not ci or None in ci:
        return ""
    return f" (95% CI {scale * ci[0]:.{digits}f}{sep}{scale * ci[1]:.{digits}f}{unit})"


def human_bytes(n: float) -> str:
    """Binary units: ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def decimal_bytes(n: float) -> str:
    """Decimal units, as the Hub shows sizes: ``1.5 GB``."""
    step = 1000.0
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < step or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= step
    return f"{n} B"


def significant(x: float | None, digits: int = 3, missing: str = NA) -> str:
    """A number for people, to ``digits`` significant digits: ``8.1234`` -> ``"8.12"``, ``123.45`` ->
    ``"123"``; past 1e5 or below 1e-3 in scientific form: ``23112138541.8518`` -> ``"2.31e10"``."""
    if x is None or not math.isfinite(float(x)):
        return missing
    x = float(x)
    if x == 0:
        return "0"
    if not 1e-3 <= abs(x) < 1e5:
        mantissa, exp = f"{x:.{digits - 1}e}".split("e")
        return f"{mantissa}e{int(exp)}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    out = f"{round(x, decimals):.{decimals}f}"
    return "0" if float(out) == 0 else out


def divergence(x: float | None, nd: int = 6, tolerance: float = 1e-4, missing: str = NA) -> str:
    """A KL divergence (never negative): a negative within ``tolerance`` of 0 is numerical error and
    reads ``0``; no negative zero (``-0.000000`` -> ``"0.000000"``)."""
    if x is None or not math.isfinite(float(x)):
        return missing
    x = float(x)
    if -tolerance < x < 0:
        x = 0.0
    out = f"{x:.{nd}f}"
    return out[1:] if out.startswith("-") and float(out) == 0 else out
