#!/usr/bin/env python3
"""Where does in-process quantization lose time against `llama-quantize`? (issue #34, part 2)

    .venv/bin/python benchmarks/quantize_gap.py [--layers 1 | --model PATH] [--runs 3]
        [--recipe hifi-q4_k_m-mtp] [--threads N] [--dir DIR] [--arms cli,bare,...] [--json OUT.json]

The same `llama_model_quantize` call on the same input with the same parameters (the plan's, the
flags `ggufmtp plan --emit llama-quantize` prints), one process per run, the arms interleaved with
their order turned every run (:func:`quantize_vs_cli.run_order`), each adding one thing of what
`ggufmtp quantize` does around the call:

- ``cli``      the `llama-quantize` binary;
- ``bare``     Python: the ctypes call alone (libllama's own logger, no callback, no thread);
- ``logcb``    + the Python log callback ggufmtp installs (one GIL round trip per log line);
- ``worker``   + the call in a worker thread joined in 0.2 s steps (what makes Ctrl-C work);
- ``inhash``   bare + the input's sha256 in a nice-19 thread at the same time (the receipt's);
- ``outhash``  bare + the output's sha256 streamed while libllama writes it (the receipt's);
- ``ggufmtp``  `ggufmtp quantize` end to end with its receipt (the input's digest forgotten first).

Each Python arm prints the seconds of the call itself (``call_s``), so process start and imports
are apart; the report gives each arm's median wall and call time and, per run, each arm's ratio
to that run's CLI time (arms of one run ran back to back), then their medians. Outputs are checked
byte-identical by sha256. One run of each arm = one quantization: at real scale (72 GB) budget
about 7 x runs x 45 s on 16 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantize_vs_cli import cpu_model, measured, run_order, sha256_of  # noqa: E402

ARMS = ("cli", "bare", "logcb", "worker", "inhash", "outhash", "ggufmtp")


def _params(model: Path, recipe: str, threads: int):
    import dataclasses

    from ggufmtp.quant.plan import make_plan

    plan = make_plan(model, recipe)
    return plan, dataclasses.replace(plan.params, nthread=threads, dry_run=False)


def arm_main(arm: str, model: Path, out: Path, recipe: str, threads: int) -> None:
    """One Python arm in this process: prints {"call_s": ...} (the quantization call's own seconds)."""
    from ggufmtp.files.digest_cache import DigestCache
    from ggufmtp.quant.output_header import predict_output_header
    from ggufmtp.quant.stream_hash import OutputDigest
    from ggufmtp.quant.worker import BackgroundHash, run_quantize_interruptible
    from ggufmtp.runtime import build as runtime
    from ggufmtp.runtime.libllama import _Built, llama_cpp_module, run_quantize

    plan, params = _params(model, recipe, threads)
    lc = llama_cpp_module()
    lc.llama_backend_init()
    side = None
    if arm == "inhash":
        side = BackgroundHash([model], cache=None, background=True)
    elif arm == "outhash":
        side = OutputDigest(out, predict_output_header(model, plan, params), DigestCache.under(runtime.cache_root()))
    t0 = time.perf_counter()
    if arm == "logcb":
        rc, _ = run_quantize(str(model), str(out), params, on_line=None)
    elif arm == "worker":
        rc = run_quantize_interruptible(str(model), str(out), params, None).rc or 0
    else:
        built = _Built(params)
        rc = lc.llama_model_quantize(str(model).encode(), str(out).encode(), built.params)
    call = time.perf_counter() - t0
    if arm == "outhash":
        side.writer_finished()  # type: ignore[union-attr]
    if side is not None:
        side.result()
    print(json.dumps({"call_s": round(call, 3), "rc": int(rc), "side_s": round(time.perf_counter() - t0 - call, 3)}))
    sys.exit(1 if rc else 0)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # internal: run one Python arm
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--model", default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--recipe", default="hifi-q4_k_m-mtp")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--json", dest="json_out", default=None)
    return ap.parse_args()


def _argv(arm: str, model: Path, out: Path, args: argparse.Namespace, threads: int, plan) -> list[str]:
    from ggufmtp.runtime import build as runtime

    if arm == "cli":
        return plan.llama_quantize_argv(str(out), binary=str(runtime.find_binary("llama-quantize")), threads=threads)
    if arm == "ggufmtp":
        return [sys.executable, "-m", "ggufmtp", "quantize", str(model), "--recipe", args.recipe, "--threads",
                str(threads), "--no-progress", "--json", "-o", str(out)]
    return [sys.executable, __file__, "--arm", arm, "--model", str(model), "--out", str(out), "--recipe",
            args.recipe, "--threads", str(threads)]


def _summary(runs: list[dict], arms: list[str]) -> dict:
    per = {a: [r for r in runs if r["arm"] == a] for a in arms}
    cli = {r["run"]: r["wall_s"] for r in per.get("cli", [])}
    out: dict = {}
    for a, rs in per.items():
        ratios = [r["wall_s"] / cli[r["run"]] for r in rs if r["run"] in cli]
        calls = [r["call_s"] for r in rs if "call_s" in r]
        out[a] = {"median_wall_s": round(statistics.median(r["wall_s"] for r in rs), 3),
                  "median_call_s": round(statistics.median(calls), 3) if calls else None,
                  "run_ratios_vs_cli": [round(x, 4) for x in ratios],
                  "median_run_ratio_vs_cli": round(statistics.median(ratios), 4) if ratios else None,
                  "median_call_ratio_vs_cli": round(statistics.median(
                      r["call_s"] / cli[r["run"]] for r in rs if "call_s" in r and r["run"] in cli), 4) if calls else None}
    return out


def main() -> None:
    args = parse_args()
    if args.arm:
        return arm_main(args.arm, Path(args.model), Path(args.out), args.recipe, args.threads)
    from ggufmtp.runtime import build as runtime
    from ggufmtp.synth.spec import SynthSpec
    from ggufmtp.synth.writer import synthesize

    d = Path(args.dir) if args.dir else runtime.cache_root() / "bench"
    d.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else d / f"qwen36-shape-L{args.layers}-bf16.gguf"
    if not model.exists():
        synthesize(model, SynthSpec(shape="qwen3.6-35b-a3b", layers=args.layers), progress=True)
    threads = args.threads or os.cpu_count() or 1
    plan, _ = _params(model, args.recipe, threads)
    arms = [a for a in args.arms.split(",") if a]
    from ggufmtp.files.digest_cache import DigestCache

    digests = DigestCache.under(runtime.cache_root())
    runs: list[dict] = []
    for i in range(args.runs):
        for arm in run_order(arms, i, "alternate"):
            out = d / f"gap-{arm}.gguf"
            digests.forget(model)
            wall, rss, stdout = measured(_argv(arm, model, out, args, threads, plan))
            rec = {"run": i + 1, "arm": arm, "wall_s": round(wall, 3), "peak_rss_mib": round(rss, 1)}
            if arm == "ggufmtp":
                st = json.loads(stdout)["stages"]
                rec["call_s"] = st["quantize"]["seconds"]
            elif arm != "cli":
                rec.update(json.loads(stdout.strip().splitlines()[-1]))
            rec["sha256"] = sha256_of(out)
            out.unlink()
            out.with_name(out.name + ".receipt.json").unlink(missing_ok=True)
            runs.append(rec)
            print(f"run {i + 1}: {arm:<8} wall {wall:8.2f}s  call {rec.get('call_s', float('nan')):8.2f}s", file=sys.stderr)
            if args.json_out:
                Path(args.json_out).write_text(json.dumps({"model": model.name, "runs": runs}, indent=2) + "\n")
    summary = _summary(runs, arms)
    report = {"model": model.name, "model_bytes": model.stat().st_size, "recipe": args.recipe, "threads": threads,
              "runs_per_arm": args.runs, "cpu": cpu_model(), "nproc": os.cpu_count(),
              "byte_identical": len({r["sha256"] for r in runs}) == 1, "runs": runs, "arms": summary}
    print(f"model {model.name}: {model.stat().st_size / 1e9:.2f} GB, {args.recipe}, {threads} threads, "
          f"{args.runs} interleaved runs per arm, {cpu_model()}; outputs byte-identical: {report['byte_identical']}")
    for a, m in summary.items():
        print(f"{a:<8} wall {m['median_wall_s']:8.2f}s  call {m['median_call_s'] or float('nan'):8.2f}s  "
              f"per-run wall/cli {m['median_run_ratio_vs_cli']}  call/cli {m['median_call_ratio_vs_cli']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
