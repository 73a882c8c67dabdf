#!/usr/bin/env python3
"""Wall time and peak RSS of `ggufmtp quantize` (with its receipt) against the `llama-quantize` CLI.

    .venv/bin/python benchmarks/quantize_vs_cli.py [--layers 1] [--runs 3] [--recipe hifi-q4_k_m-mtp]
        [--model PATH] [--threads N] [--dir DIR] [--no-receipt-arm] [--warm-digests] [--order alternate|fixed]
        [--json OUT.json]

Synthesizes (once, cached in --dir) a BF16 model with Qwen3.6-35B-A3B's real per-layer shapes
(`ggufmtp synth --shape qwen3.6-35b-a3b --layers N`, >= 1 GB), then runs the arms interleaved,
their order turned every run (CLI, ggufmtp; ggufmtp, CLI; ...; `--order fixed`: ggufmtp first
every run), each a separate process whose wall time and peak RSS
(ru_maxrss of that child alone) are measured: `ggufmtp quantize` end to end WITH its receipt
(plan, quantize, audit, sha256 of input and output, receipt), `llama-quantize` with the flags
`ggufmtp plan --emit llama-quantize` prints, and with --no-receipt-arm also `ggufmtp quantize
--no-receipt`. Checks that the outputs are byte-identical, prints medians and the median
wall-time ratio ggufmtp/CLI (issue #22: <= 1.08 with the receipt), each run's own ratio and
ggufmtp's seconds outside libllama's quantization call, and with --json writes every
run, ggufmtp's stage breakdown (`quantize --json`'s `stages`) and the summary.

Each output is removed right after its run (at real scale three 22 GB outputs beside a 72 GB
input do not fit in RAM-backed /dev/shm): byte identity is checked by sha256, the benchmark's own
hashlib pass for the CLI's and the --no-receipt outputs (outside the timing), `quantize --json`'s
`sha256` (read off the bytes on disk, the receipt's subject digest) for ggufmtp's.

By default the input's digest is dropped from the local digest cache before each ggufmtp run,
so every run hashes the 72 GB input (a synthesized model's case); --warm-digests keeps it (a
model that `ggufmtp pull` verified, or one quantized before: the input is not read again).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ggufmtp.files.digest_cache import DigestCache
from ggufmtp.quant.plan import make_plan
from ggufmtp.runtime import build as runtime
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.writer import synthesize

_WRAPPER = ("import json,resource,subprocess,sys,time;t=time.perf_counter();"
            "r=subprocess.run(sys.argv[2:],stdout=open(sys.argv[1],'w'),stderr=subprocess.DEVNULL).returncode;"
            "w=time.perf_counter()-t;"
            "print(json.dumps([w,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024,r]))")


def measured(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one child: ru_maxrss of RUSAGE_CHILDREN is a running
    max over all children, so each run gets its own wrapper process."""
    with tempfile.NamedTemporaryFile("r", suffix=".out") as f:
        res = subprocess.run([sys.executable, "-c", _WRAPPER, f.name, *argv], capture_output=True, text=True,
                             check=True)
        wall, rss, rc = json.loads(res.stdout)
        if rc != 0:
            sys.exit(f"failed ({rc}): {' '.join(argv)}")
        return wall, rss, f.read()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--recipe", default="hifi-q4_k_m-mtp")
    ap.add_argument("--model", default=None, help="use this BF16 GGUF instead of synthesizing one")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dir", default=str(runtime.cache_root() / "bench"), help="model cache and outputs")
    ap.add_argument("--no-receipt-arm", action="store_true", help="also time `ggufmtp quantize --no-receipt`")
    ap.add_argument("--warm-digests", action="store_true", help="keep the input's cached digest between runs")
    ap.add_argument("--json", dest="json_out", default=None, help="write runs, stages and summary here")
    ap.add_argument("--no-cat", action="store_true", help="skip warming the page cache (model in /dev/shm)")
    ap.add_argument("--order", choices=("alternate", "fixed"), default="alternate",
                    help="alternate (default): the arms' order turns every run, the CLI first in run 1, so a "
                         "first-run cost does not always land on one arm; fixed: ggufmtp first in every run")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else d / f"qwen36-shape-L{args.layers}-bf16.gguf"
    if not model.exists():
        print(f"synthesizing {model} ...", file=sys.stderr)
        synthesize(model, SynthSpec(shape="qwen3.6-35b-a3b", layers=args.layers), progress=True)
    plan = make_plan(model, args.recipe)
    threads = args.threads or os.cpu_count()
    outs = {"ggufmtp": d / "bench-ours.gguf", "llama-quantize": d / "bench-cli.gguf",
            "ggufmtp --no-receipt": d / "bench-ours-norec.gguf"}
    ours = [sys.executable, "-m", "ggufmtp", "quantize", str(model), "--recipe", args.recipe,
            "--threads", str(threads), "--no-progress", "--json"]
    arms = {"ggufmtp": ours + ["-o", str(outs["ggufmtp"])],
            "llama-quantize": plan.llama_quantize_argv(str(outs["llama-quantize"]),
                                                       binary=str(runtime.find_binary("llama-quantize")),
                                                       threads=threads)}
    if args.no_receipt_arm:
        arms["ggufmtp --no-receipt"] = ours + ["-o", str(outs["ggufmtp --no-receipt"]), "--no-receipt"]
    digests = DigestCache.under(runtime.cache_root())
    if not args.no_cat:
        subprocess.run(["cat", str(model)], stdout=subprocess.DEVNULL, check=True)  # page cache warm for all
    runs: list[dict] = []
    for i in range(args.runs):
        for arm in run_order(list(arms), i, args.order):
            argv = arms[arm]
            if arm.startswith("ggufmtp") and not args.warm_digests:
                digests.forget(model)
            wall, rss, stdout = measured(argv)
            rec = {"run": i + 1, "arm": arm, "wall_s": round(wall, 3), "peak_rss_mib": round(rss, 1)}
            if arm.startswith("ggufmtp"):
                out = json.loads(stdout)
                rec["stages"], rec["sha256"] = out.get("stages"), out.get("sha256")
                # interpreter start, imports, argument parsing, JSON output: outside every stage
                rec["outside_stages_s"] = round(wall - rec["stages"]["critical_path_seconds"], 3)
            rec["sha256"] = rec.get("sha256") or sha256_of(outs[arm])
            outs[arm].unlink()
            outs[arm].with_name(outs[arm].name + ".receipt.json").unlink(missing_ok=True)
            runs.append(rec)
            print(f"run {i + 1}: {arm:<20} {wall:8.2f}s  {rss:7.0f} MiB", file=sys.stderr)
            if args.json_out:  # after every run: a machine taken back mid-way still leaves its figures
                Path(args.json_out).write_text(json.dumps({"model": model.name, "runs": runs}, indent=2) + "\n")
    summary = summarize(runs, arms)
    report = {"model": model.name, "model_bytes": model.stat().st_size, "recipe": args.recipe, "threads": threads,
              "runs_per_arm": args.runs, "order": args.order, "warm_digests": args.warm_digests, "cpu": cpu_model(),
              "nproc": os.cpu_count(), "runs": runs, **summary}
    print(f"model {model.name}: {model.stat().st_size / 1e9:.2f} GB BF16, recipe {args.recipe}, {threads} threads, "
          f"{args.runs} interleaved runs per arm, {cpu_model()}")
    for arm, m in summary["arms"].items():
        print(f"{arm:<22}: median {m['median_wall_s']:.2f}s (min {m['min_wall_s']:.2f}), "
              f"peak RSS {m['peak_rss_mib']:.0f} MiB")
    print("median stages of ggufmtp, seconds of work/waited for: " + ", ".join(
        f"{k} {v.get('seconds', v['waited']):.2f}/{v['waited']:.2f}" for k, v in summary["ggufmtp_median_stages"].items()))
    print(f"outputs byte-identical: {summary['byte_identical']}")
    print(f"median wall-time ratio ggufmtp (with receipt)/llama-quantize: {summary['ratio']:.3f}")
    print("each run's ratio: " + ", ".join(f"{r:.3f}" for r in summary["run_ratios"])
          + f" (median {summary['median_run_ratio']:.3f}); ggufmtp's seconds beyond libllama's quantization: "
          + ", ".join(f"{b:.2f}" for b in summary["ggufmtp_beyond_quantize_s"]))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")


def run_order(arms: list[str], i: int, order: str) -> list[str]:
    """The arms in run i's order. At real scale on the H200 (benchmarks/README.md, ninth and tenth
    runs) the first run on a fresh machine was the slowest of its arm (281, 270 s for ggufmtp when it
    went first; 231 against 217 s for the CLI when it did): with a fixed order that cost always
    falls on ggufmtp; turning the order every run spreads it over both arms."""
    if order == "fixed":
        return arms
    turn = (i + 1) % len(arms)  # run 1 (i=0) starts with the second arm, the CLI
    return arms[turn:] + arms[:turn]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def summarize(runs: list[dict], arms: dict) -> dict:
    """Medians per arm, the ratio, the median of each ggufmtp stage (seconds of work / waited for)
    and whether every output is byte-identical to the CLI's."""
    per = {arm: [r for r in runs if r["arm"] == arm] for arm in arms}
    med = {arm: {"median_wall_s": round(statistics.median(r["wall_s"] for r in rs), 3),
                 "min_wall_s": min(r["wall_s"] for r in rs), "peak_rss_mib": max(r["peak_rss_mib"] for r in rs)}
           for arm, rs in per.items()}
    stages: dict[str, dict[str, float]] = {}
    names = [k for k in (per["ggufmtp"][0].get("stages") or {}) if k != "critical_path_seconds"]
    for name in names:
        stages[name] = {f: round(statistics.median(r["stages"][name][f] for r in per["ggufmtp"]), 3)
                        for f in ("seconds", "waited", "read_mib", "mapped_mib")}
    same = len({r["sha256"] for r in runs}) == 1
    # each run's own ratio (the two arms ran back to back) and what ggufmtp spent outside libllama's
    # quantization: the receipt's cost without the run-to-run spread of the quantization itself
    pairs = [round(o["wall_s"] / c["wall_s"], 4) for o, c in zip(per["ggufmtp"], per["llama-quantize"])]
    beyond = [round(r["wall_s"] - r["stages"]["quantize"]["seconds"], 3) for r in per["ggufmtp"]]
    stages["outside_stages"] = {"waited": round(statistics.median(r["outside_stages_s"] for r in per["ggufmtp"]), 3)}
    return {"arms": med, "ggufmtp_median_stages": stages, "byte_identical": same,
            "ratio": round(med["ggufmtp"]["median_wall_s"] / med["llama-quantize"]["median_wall_s"], 4),
            "run_ratios": pairs, "median_run_ratio": round(statistics.median(pairs), 4),
            "ggufmtp_beyond_quantize_s": beyond,
            "rss_ratio": round(med["ggufmtp"]["peak_rss_mib"] / med["llama-quantize"]["peak_rss_mib"], 4)}


if __name__ == "__main__":
    main()
