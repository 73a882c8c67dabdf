#!/usr/bin/env python3
"""ggufmtp's percentile bootstrap (ggufmtp/stats.py) against ``scipy.stats.bootstrap`` (#42 item 6).

    PYTHONPATH=/path/to/scipy-site .venv/bin/python benchmarks/bootstrap_choice.py [--reps 400]

scipy is not a dependency of ggufmtp: install it anywhere outside the project's environment
(``pip install --no-deps --target DIR scipy``) and put DIR on PYTHONPATH for this script only.

What it measures, on data designed like verify's acceptance (per prompt: drafted ~ Poisson(60),
the prompt's acceptance ~ Beta(7, 3), accepted ~ Binomial(drafted, acceptance); the true ratio of
sums is E[acceptance] = 0.7): for n prompts the share of ``--reps`` simulated runs whose 95%
interval holds the true value (coverage) and the mean interval width, for ggufmtp's percentile
interval (``stats.ratio_of_sums``) and scipy's paired BCa and percentile intervals on the same
statistic (sum(accepted) / sum(drafted), prompts resampled as pairs), 2000 resamples each; then
the time per interval and the import time of ``scipy.stats`` in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np

from ggufmtp.stats import ratio_of_sums

TRUE = 0.7


def _data(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    drafted = rng.poisson(60, n).astype(float)
    accepted = rng.binomial(drafted.astype(int), rng.beta(7, 3, n)).astype(float)
    return accepted, drafted


def _scipy(acc: np.ndarray, dra: np.ndarray, method: str) -> tuple[float, float]:
    from scipy.stats import bootstrap

    def stat(a, d, axis=-1):
        return a.sum(axis=axis) / d.sum(axis=axis)

    r = bootstrap((acc, dra), stat, paired=True, vectorized=True, n_resamples=2000, method=method,
                  random_state=np.random.default_rng(0))
    return float(r.confidence_interval.low), float(r.confidence_interval.high)


def _ours(acc: np.ndarray, dra: np.ndarray) -> tuple[float, float]:
    e = ratio_of_sums(acc, dra)
    assert e.lo is not None and e.hi is not None
    return e.lo, e.hi


METHODS = {"ggufmtp percentile": _ours, "scipy BCa": lambda a, d: _scipy(a, d, "BCa"),
           "scipy percentile": lambda a, d: _scipy(a, d, "percentile")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--n", default="5,10,20,40")
    args = ap.parse_args()
    print(f"coverage of the true 0.7 by the 95% interval, {args.reps} simulated runs per n; mean width; ms per interval")
    for n in (int(x) for x in args.n.split(",")):
        rng = np.random.default_rng(1000 + n)
        runs = [_data(rng, n) for _ in range(args.reps)]
        for name, fn in METHODS.items():
            t = time.perf_counter()
            cis = [fn(a, d) for a, d in runs]
            ms = (time.perf_counter() - t) * 1000 / len(runs)
            cover = sum(lo <= TRUE <= hi for lo, hi in cis) / len(cis)
            width = float(np.mean([hi - lo for lo, hi in cis]))
            print(f"n={n:3d}  {name:19s} coverage {cover:.3f}  width {width:.4f}  {ms:6.2f} ms")
    for mod in ("numpy", "scipy.stats"):
        t = [float(subprocess.run([sys.executable, "-c", f"import time; t=time.perf_counter(); import {mod}; "
                                   "print(time.perf_counter()-t)"], capture_output=True, text=True, check=True).stdout)
             for _ in range(3)]
        print(f"import {mod}: median {sorted(t)[1] * 1000:.0f} ms (fresh interpreter, 3 runs)")


if __name__ == "__main__":
    main()
