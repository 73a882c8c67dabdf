#!/usr/bin/env python3
"""What `ggufmtp imatrix compute --mtp` costs over `ggufmtp imatrix compute` (issue #34: <= 1.10).

    .venv/bin/python benchmarks/imatrix_mtp_cost.py [--model builtin:tiny-qwen35moe] [--corpus builtin:calib-v1]
        [--chunks N] [--ctx-size 512] [--runs 3] [--threads N] [--gpu-layers N] [--omp-passive]
        [--baseline-cache DIR] [--no-profile] [--json OUT.json]

The two arms run interleaved, their order turned every run, each a separate `ggufmtp imatrix
compute` process timed end to end (wall seconds, as a user waits for it) and by the CPU time of
its process tree (user + system). Prints every run, each pair's ratio (--mtp over plain) and the
ratios of the medians and of the minima; --json writes them with the machine. On a machine that
others load, wall times of 2-thread runs vary several-fold (ggml's OpenMP threads spin while they
wait for a descheduled peer): the per-pair ratios and the ratio of the minima (noise only adds
time) say more than one median. --omp-passive (OMP_WAIT_POLICY=passive for both arms) takes the
spinning out, so that the CPU times count work. --baseline-cache DIR adds a third arm, `--mtp` with
GGUFMTP_CACHE=DIR (a runtime holding another build of the collector, e.g. the one before a
change), in the same rotation: before and after measured under the same load.

Unless --no-profile, one more run of the collector itself (`ggufmtp-mtp-imatrix --with-trunk
--profile`, what `--mtp` runs) records where the --mtp time goes: model load, the trunk's and the
MTP head's decode time and the collector's share of each (`tool_profile` in the JSON).
Since #34, `--mtp` is one pass of ggufmtp's collector (one model load, the trunk run once, the head
fed from the same forward passes) where it used to be llama-imatrix plus a second load and a
second run of the trunk for the head.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GGUFMTP = [sys.executable, "-m", "ggufmtp"]


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the process and everything it waited for)."""
    c, t = children_cpu(), time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t, children_cpu() - c


def tool_profile(a: argparse.Namespace, env: dict[str, str], out: str) -> dict:
    """One run of the collector as `compute --mtp` runs it, with --profile: where the time goes."""
    from ggufmtp.imatrix.corpus import resolve_corpus
    from ggufmtp.imatrix.mtp import MTP_IMATRIX_TOOL, mtp_imatrix_command
    from ggufmtp.imatrix.settings import CollectMode, ImatrixSettings
    from ggufmtp.runtime.build import find_binary
    from ggufmtp.synth.builtin import builtin_path

    model = builtin_path(a.model) if a.model.startswith("builtin:") else Path(a.model)
    settings = ImatrixSettings(chunks=a.chunks, ctx_size=a.ctx_size, gpu_layers=a.gpu_layers, threads=a.threads)
    cmd = mtp_imatrix_command(find_binary(MTP_IMATRIX_TOOL), model, resolve_corpus(a.corpus).path, Path(out), settings,
                              mode=CollectMode.BOTH) + ["--profile"]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    m = re.search(r"profile: (\{.*\})", r.stderr)
    return {"wall_s": time.perf_counter() - t, **(json.loads(m.group(1)) if m else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-qwen35moe")
    ap.add_argument("--corpus", default="builtin:calib-v1")
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gpu-layers", type=int, default=None)
    ap.add_argument("--omp-passive", action="store_true", help="OMP_WAIT_POLICY=passive for both arms")
    ap.add_argument("--baseline-cache", type=Path, default=None,
                    help="a third arm: --mtp with GGUFMTP_CACHE=DIR (another build of the collector)")
    ap.add_argument("--no-profile", action="store_true", help="skip the collector's --profile run")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    env = dict(os.environ) | ({"OMP_WAIT_POLICY": "passive"} if a.omp_passive else {})
    common = [a.model, "--corpus", a.corpus, "--ctx-size", str(a.ctx_size), "--no-progress"]
    common += ["--chunks", str(a.chunks)] if a.chunks else []
    common += ["--threads", str(a.threads)] if a.threads else []
    common += ["--gpu-layers", str(a.gpu_layers)] if a.gpu_layers is not None else []
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*GGUFMTP, "inspect", a.model], check=True, stdout=subprocess.DEVNULL)  # builtin made once
        arms = ["plain", "mtp"] + (["mtp_base"] if a.baseline_cache else [])
        for i in range(a.runs):
            order = arms[i % len(arms):] + arms[:i % len(arms)] if len(arms) > 2 else arms[::1 - 2 * (i % 2)]
            row: dict = {}
            for arm in order:
                out = os.path.join(tmp, f"{arm}.gguf")
                arm_env = env | ({"GGUFMTP_CACHE": str(a.baseline_cache)} if arm == "mtp_base" else {})
                row[arm], row[f"{arm}_cpu"] = timed([*GGUFMTP, "imatrix", "compute", *common, "-o", out]
                                                    + (["--mtp"] if arm != "plain" else []), arm_env)
            for arm in arms[1:]:
                row["ratio" + arm[3:]] = row[arm] / row["plain"]
                row["cpu_ratio" + arm[3:]] = row[f"{arm}_cpu"] / row["plain_cpu"]
            if a.baseline_cache:
                row["same_file_as_base"] = Path(tmp, "mtp.gguf").read_bytes() == Path(tmp, "mtp_base.gguf").read_bytes()
            runs.append(row)
            print(f"run {i + 1} ({' then '.join(order)}): "
                  + ", ".join(f"{arm} {row[arm]:.2f} s ({row[f'{arm}_cpu']:.2f} s CPU)" for arm in arms)
                  + f"; ratio {row['ratio']:.3f} (CPU {row['cpu_ratio']:.3f})"
                  + (f", baseline ratio {row['ratio_base']:.3f} (CPU {row['cpu_ratio_base']:.3f}), same file "
                     f"{row['same_file_as_base']}" if a.baseline_cache else ""), flush=True)
        profile = None if a.no_profile else tool_profile(a, env, os.path.join(tmp, "profile.gguf"))
    med = {k: statistics.median(r[k] for r in runs) for k in (*arms, *(f"{x}_cpu" for x in arms))}
    low = {k: min(r[k] for r in runs) for k in arms}
    summary = {"plain_median_s": med["plain"], "mtp_median_s": med["mtp"], "ratio_of_medians": med["mtp"] / med["plain"],
               "per_pair_ratios": [r["ratio"] for r in runs], "median_pair_ratio": statistics.median(r["ratio"] for r in runs),
               "ratio_of_minima": low["mtp"] / low["plain"],
               "plain_median_cpu_s": med["plain_cpu"], "mtp_median_cpu_s": med["mtp_cpu"],
               "cpu_ratio_of_medians": med["mtp_cpu"] / med["plain_cpu"],
               "per_pair_cpu_ratios": [r["cpu_ratio"] for r in runs],
               "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
               "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "loadavg_at_end": os.getloadavg()}}
    if a.baseline_cache:
        summary |= {"base_median_s": med["mtp_base"], "base_ratio_of_medians": med["mtp_base"] / med["plain"],
                    "base_per_pair_ratios": [r["ratio_base"] for r in runs],
                    "base_ratio_of_minima": low["mtp_base"] / low["plain"],
                    "base_cpu_ratio_of_medians": med["mtp_base_cpu"] / med["plain_cpu"],
                    "base_per_pair_cpu_ratios": [r["cpu_ratio_base"] for r in runs],
                    "same_file_as_base": all(r["same_file_as_base"] for r in runs)}
    print(f"median plain {med['plain']:.2f} s, --mtp {med['mtp']:.2f} s: ratio of medians "
          f"{summary['ratio_of_medians']:.3f} (#34: <= 1.10), median pair ratio {summary['median_pair_ratio']:.3f}, "
          f"ratio of minima {summary['ratio_of_minima']:.3f}; CPU: ratio of medians {summary['cpu_ratio_of_medians']:.3f}")
    if a.baseline_cache:
        print(f"baseline --mtp ({a.baseline_cache}): median {med['mtp_base']:.2f} s, ratio of medians "
              f"{summary['base_ratio_of_medians']:.3f}, ratio of minima {summary['base_ratio_of_minima']:.3f}; CPU: ratio "
              f"of medians {summary['base_cpu_ratio_of_medians']:.3f}; same file: {summary['same_file_as_base']}")
    if profile:
        print("collector --profile: " + ", ".join(f"{k} {v}" for k, v in profile.items()))
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "summary": summary, "tool_profile": profile}, indent=2))


if __name__ == "__main__":
    main()
