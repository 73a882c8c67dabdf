"""Bootstrap confidence intervals for ``ggufmtp verify``.

Every statistic verify reports is a function of per-prompt SUMS (drafted and accepted tokens,
generated tokens and decode milliseconds of each arm), so one routine covers them all:
:func:`bootstrap_sums` resamples the *units* (prompts) with replacement, sums the columns of the
resampled units and applies the statistic to the sums.

Choices (documented in the README's verify section):

- Unit = prompt. A prompt's requests under every seed (and, for per-category rows, only the
  prompts of that category) are added into one unit before resampling. At temperature 0 the seed
  does not change the text, so treating seeds as independent observations would shrink the CI
  without adding information; prompts are what vary.
- Acceptance = sum(accepted) / sum(drafted) over the resampled prompts (a ratio of sums, the same
  estimator as the point value, so long replies weigh more, as they do in the point value).
- Speedup = (sum MTP tokens / sum MTP decode time) / (sum vanilla tokens / sum vanilla decode time),
  resampling prompt PAIRS (the vanilla and MTP requests of a prompt stay together), i.e. the ratio
  of aggregate decode throughputs. Per-prompt ratios are not averaged: a few very short replies
  would dominate such a mean. A request of at most one token decoded nothing (:func:`decoded`) and
  adds nothing to its arm's sums; an arm where no request decoded has no throughput (None), and
  then there is no speedup.
- Percentile interval at 95%, 2000 resamples by default, generator ``numpy.random.PCG64(seed)``
  with a fixed seed (0): the same data always gives the same interval.
- Fewer than 2 units: no interval (``(None, None)``).

Why not ``scipy.stats.bootstrap`` (#42; measured with ``benchmarks/bootstrap_choice.py``, figures in
``benchmarks/README.md``): the paired bootstrap over prompts maps onto it (``paired=True``, the
columns as samples, a vectorized ratio of sums), and its percentile method gives this routine's
interval to the last digit (the same PCG64 stream). Its BCa method did not cover better at the
sizes verify sees: on designed acceptance data (true value known) BCa covered 0.835 / 0.900 /
0.932 / 0.932 at 5 / 10 / 20 / 40 prompts against 0.823 / 0.892 / 0.935 / 0.927 here (400
simulated runs each, a standard error of about 0.015), and it needs scipy: 113 MB installed and
1.1 s to import ``scipy.stats`` against numpy's 0.16 s, for a routine of twenty lines that
also drops the resamples whose statistic is not finite (no drafted tokens), where scipy's interval
is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
DEFAULT_LEVEL = 0.95
MAX_MARGIN = 0.10  # a non-inferiority margin (the head's, a recipe's) is never more than 10 points


@dataclass(frozen=True)
class Estimate:
    value: float | None
    lo: float | None
    hi: float | None
    n_units: int
    resamples: int
    sd: float | None = None  # the resampled statistics' standard deviation (the bootstrap standard error)

    @property
    def ci(self) -> list[float | None]:
        return [self.lo, self.hi]

    def contains(self, x: float) -> bool:
        return self.lo is not None and self.hi is not None and self.lo <= x <= self.hi


def _finite_or_none(x: float) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def decoded(predicted_n: float, predicted_ms: float) -> tuple[float, float]:
    """A request's share of its arm's decode throughput: ``(tokens, ms)`` from llama-server's
    ``timings.predicted_n`` / ``predicted_ms``, and ``(0, 0)`` for a request of at most one token.
    The first token comes from the prompt pass: ``predicted_ms`` times what follows it (and is at
    least 0.001 ms), so a reply that ended at once decoded nothing, and counted it would be a token
    without time (1,000,000 tok/s on its own)."""
    return (float(predicted_n), float(predicted_ms)) if predicted_n > 1 else (0.0, 0.0)


class Timed(Protocol):
    """A reply with llama-server's decode timings (``Reply``, a verify ``Record``)."""

    @property
    def predicted_n(self) -> float: ...

    @property
    def predicted_ms(self) -> float: ...


def decoded_sums(replies: Iterable[Timed]) -> tuple[float, float]:
    """Tokens and ms decoded by ``replies`` (anything with ``predicted_n`` / ``predicted_ms``), each
    counted through :func:`decoded`."""
    n = ms = 0.0
    for r in replies:
        dn, dms = decoded(r.predicted_n, r.predicted_ms)
        n, ms = n + dn, ms + dms
    return n, ms


def bootstrap_sums(units: np.ndarray | Sequence[Sequence[float]],
                   statistic: Callable[[np.ndarray], np.ndarray],
                   resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
                   level: float = DEFAULT_LEVEL) -> Estimate:
    """Percentile bootstrap of ``statistic(column sums)`` over the rows (units) of ``units``.

    ``statistic`` receives an array whose last axis holds the column sums (shape ``(c,)`` for the
    point value, ``(B, c)`` for the resamples) and returns the statistic along the other axes.
    Resamples where the statistic is not finite (e.g. no drafted tokens) are dropped.
    """
    x = np.asarray(units, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError("units must be a 2-D array: one row per unit, one column per summed quantity")
    if resamples < 1:
        raise ValueError("resamples must be >= 1")
    if not 0 < level < 1:
        raise ValueError("level must be in (0, 1)")
    n = x.shape[0]
    if n == 0:
        return Estimate(None, None, None, 0, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        point = _finite_or_none(statistic(x.sum(axis=0)))
    if n < 2:
        return Estimate(point, None, None, n, 0)
    stats = _resampled(x, statistic, resamples, seed)
    if stats.size == 0:
        return Estimate(point, None, None, n, 0)
    a = (1 - level) / 2
    lo, hi = np.quantile(stats, [a, 1 - a])
    return Estimate(point, float(lo), float(hi), n, int(stats.size), float(np.std(stats, ddof=1)) if stats.size > 1 else None)


_CHUNK_CELLS = 1 << 21  # resample indices drawn at once: about 16 MB, whatever the number of units


def _resampled(x: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], resamples: int,
               seed: int) -> np.ndarray:
    """The finite statistics of ``resamples`` resamples of the rows of ``x``, drawn in chunks so memory
    stays bounded (PCG64 draws the same stream in chunks as at once: the figures do not change)."""
    n = x.shape[0]
    rng = np.random.Generator(np.random.PCG64(seed))
    step = max(1, _CHUNK_CELLS // n)
    out = []
    for start in range(0, resamples, step):
        idx = rng.integers(0, n, size=(min(step, resamples - start), n))
        sums = x[idx].sum(axis=1)  # (B, c)
        with np.errstate(divide="ignore", invalid="ignore"):
            out.append(np.asarray(statistic(sums), dtype=np.float64))
    stats = np.concatenate(out)
    return stats[np.isfinite(stats)]


def ratio_of_sums(num: Sequence[float], den: Sequence[float], **kw) -> Estimate:
    """``sum(num) / sum(den)`` with a bootstrap CI over units (e.g. acceptance per prompt)."""
    units = np.column_stack([np.asarray(num, float), np.asarray(den, float)])
    return bootstrap_sums(units, lambda s: s[..., 0] / s[..., 1], **kw)


def throughput_ratio(n_a: Sequence[float], ms_a: Sequence[float], n_b: Sequence[float], ms_b: Sequence[float],
                     **kw) -> Estimate:
    """Paired speedup of arm A over arm B: ``(sum n_a / sum ms_a) / (sum n_b / sum ms_b)``, units
    resampled as pairs."""
    units = np.column_stack([np.asarray(v, float) for v in (n_a, ms_a, n_b, ms_b)])
    return bootstrap_sums(units, lambda s: (s[..., 0] / s[..., 1]) / (s[..., 2] / s[..., 3]), **kw)


def check_margin(margin: Any, where: str = "head margin") -> float:
    """``margin`` as a fraction in (0, :data:`MAX_MARGIN`]; ValueError naming ``where`` otherwise."""
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not math.isfinite(margin) \
            or not 0 < margin <= MAX_MARGIN:
        raise ValueError(f"{where} {margin!r}: the non-inferiority margin is a fraction in (0, {MAX_MARGIN}] "
                         f"(0.03 = 3 acceptance points; at most {MAX_MARGIN * 100:.0f} points)")
    return float(margin)
