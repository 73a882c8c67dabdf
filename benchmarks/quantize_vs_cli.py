#!/usr/bin/env python3
"""Wall time and peak RSS of `ggufmtp quantize` against the `llama-quantize` CLI, same flags.

    .venv/bin/python benchmarks/quantize_vs_cli.py [--layers 1] [--runs 3] [--recipe hifi-q4_k_m-mtp]
        [--model PATH] [--threads N] [--dir DIR]

Synthesizes (once, cached in --dir) a BF16 model with Qwen3.6-35B-A3B's real per-layer shapes
(`ggufmtp synth --shape qwen3.6-35b-a3b --layers N`, >= 1 GB), then runs both quantizers
interleaved (ours, CLI, ours, CLI, ...) each as a separate process measured with
`/usr/bin/time`-style rusage, checks that both outputs are byte-identical, and prints the
median wall-time ratio ggufmtp/CLI last (goal: <= 1.02).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from ggufmtp.quant.plan import make_plan
from ggufmtp.runtime import build as runtime
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.writer import synthesize



def child_rss(argv: list[str]) -> tuple[float, float]:
    """Peak RSS measured per child (ru_maxrss of RUSAGE_CHILDREN is a running max, so wrap)."""
    wrapper = [sys.executable, "-c",
               "import resource,subprocess,sys,time;t=time.perf_counter();"
               "r=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL).returncode;"
               "w=time.perf_counter()-t;"
               "print(w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024, r)", *argv]
    out = subprocess.run(wrapper, capture_output=True, text=True, check=True).stdout.split()
    if out[2] != "0":
        sys.exit(f"failed: {' '.join(argv)}")
    return float(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--recipe", default="hifi-q4_k_m-mtp")
    ap.add_argument("--model", default=None, help="use this BF16 GGUF instead of synthesizing one")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dir", default=str(runtime.cache_root() / "bench"))
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else d / f"qwen36-shape-L{args.layers}-bf16.gguf"
    if not model.exists():
        print(f"synthesizing {model} ...", file=sys.stderr)
        synthesize(model, SynthSpec(shape="qwen3.6-35b-a3b", layers=args.layers), progress=True)
    size_gb = model.stat().st_size / 1e9
    plan = make_plan(model, args.recipe)
    threads = args.threads or os.cpu_count()
    ours_out, cli_out = d / "bench-ours.gguf", d / "bench-cli.gguf"
    ours_cmd = [str(Path(sys.executable).parent / "ggufmtp"), "quantize", str(model), "--recipe", args.recipe,
                "-o", str(ours_out), "--threads", str(threads), "--no-receipt", "--no-progress"]
    cli_cmd = plan.llama_quantize_argv(str(cli_out), binary=str(runtime.find_binary("llama-quantize")),
                                       threads=threads)
    subprocess.run(["cat", str(model)], stdout=subprocess.DEVNULL, check=True)  # page cache warm for both
    ours, cli = [], []
    for i in range(args.runs):
        ours.append(child_rss(ours_cmd))
        cli.append(child_rss(cli_cmd))
        print(f"run {i + 1}: ggufmtp {ours[-1][0]:.2f}s ({ours[-1][1]:.0f} MiB)  "
              f"llama-quantize {cli[-1][0]:.2f}s ({cli[-1][1]:.0f} MiB)", file=sys.stderr)
    same = subprocess.run(["cmp", "-s", str(ours_out), str(cli_out)]).returncode == 0
    mo, mc = statistics.median(w for w, _ in ours), statistics.median(w for w, _ in cli)
    print(f"model {model.name}: {size_gb:.2f} GB BF16, recipe {args.recipe}, {threads} threads, {args.runs} runs each")
    print(f"ggufmtp quantize : median {mo:.2f}s, peak RSS {max(r for _, r in ours):.0f} MiB")
    print(f"llama-quantize   : median {mc:.2f}s, peak RSS {max(r for _, r in cli):.0f} MiB")
    print(f"outputs byte-identical: {same}")
    print(f"median wall-time ratio ggufmtp/llama-quantize: {mo / mc:.3f}")
    for p in (ours_out, cli_out):
        p.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
