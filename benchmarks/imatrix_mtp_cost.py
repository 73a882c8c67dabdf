#!/usr/bin/env python3
"""What `ggufmtp imatrix compute --mtp` costs over `ggufmtp imatrix compute` (issue #34: <= 1.10).

    .venv/bin/python benchmarks/imatrix_mtp_cost.py [--model builtin:tiny-qwen35moe] [--corpus builtin:calib-v1]
        [--chunks N] [--ctx-size 512] [--runs 3] [--threads N] [--gpu-layers N] [--json OUT.json]

The two arms run interleaved, their order turned every run, each a separate `ggufmtp imatrix
compute` process timed end to end (wall seconds, as a user waits for it). Prints every run, each
pair's ratio (--mtp over plain) and the ratio of the medians; --json writes them with the machine.
Since #34, `--mtp` is one pass of ggufmtp's collector (one model load, the trunk run once, the head
fed from the same forward passes) where it used to be llama-imatrix plus a second load and a
second run of the trunk for the head.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GGUFMTP = [sys.executable, "-m", "ggufmtp"]


def timed(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="builtin:tiny-qwen35moe")
    ap.add_argument("--corpus", default="builtin:calib-v1")
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gpu-layers", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    common = [a.model, "--corpus", a.corpus, "--ctx-size", str(a.ctx_size), "--no-progress"]
    common += ["--chunks", str(a.chunks)] if a.chunks else []
    common += ["--threads", str(a.threads)] if a.threads else []
    common += ["--gpu-layers", str(a.gpu_layers)] if a.gpu_layers is not None else []
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*GGUFMTP, "inspect", a.model], check=True, stdout=subprocess.DEVNULL)  # builtin made once
        for i in range(a.runs):
            order = ["plain", "mtp"] if i % 2 == 0 else ["mtp", "plain"]
            row = {}
            for arm in order:
                out = os.path.join(tmp, f"{arm}.gguf")
                row[arm] = timed([*GGUFMTP, "imatrix", "compute", *common, "-o", out]
                                 + (["--mtp"] if arm == "mtp" else []))
            row["ratio"] = row["mtp"] / row["plain"]
            runs.append(row)
            print(f"run {i + 1} ({' then '.join(order)}): plain {row['plain']:.2f} s, --mtp {row['mtp']:.2f} s, "
                  f"ratio {row['ratio']:.3f}")
    plain, mtp = (statistics.median(r[k] for r in runs) for k in ("plain", "mtp"))
    summary = {"plain_median_s": plain, "mtp_median_s": mtp, "ratio_of_medians": mtp / plain,
               "per_pair_ratios": [r["ratio"] for r in runs], "median_pair_ratio": statistics.median(r["ratio"] for r in runs),
               "args": vars(a) | {"json": str(a.json) if a.json else None},
               "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}}
    print(f"median plain {plain:.2f} s, --mtp {mtp:.2f} s: ratio of medians {mtp / plain:.3f} (#34: <= 1.10)")
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
