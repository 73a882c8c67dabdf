#!/usr/bin/env python3
"""The speed of an MTP head's tensor type at equal acceptance (issue #52 item 2).

    .venv/bin/python benchmarks/head_type_speed.py MODEL --source SOURCE [--recipe hifi-q4_k_m-mtp]
        [--types F16,BF16,Q8_0,Q6_K,Q4_K] [--no-own-head] [--k 4] [--limit 8] [--seeds 42]
        [--max-tokens 128] [--gpu-layers 999] [--threads N] [--json OUT.json] [--md OUT.md]

The heads stage of ``ggufmtp tune-joint`` (:mod:`ggufmtp.search.joint_heads`), alone: SOURCE's MTP
head re-typed to each type (cut once, quantized with the recipe whose [mtp] roles all say the type),
each drafting on MODEL's own trunk (``-md``) in one ``verify`` against SOURCE at window k: the head
finding (preserved / degraded / inconclusive against the source's head), lossless output, acceptance
and the fair speedup (vanilla given the same non-speculative settings, ABBA-interleaved, 95%
bootstrap CI over prompts). MODEL's own head is the first row unless --no-own-head.

A synthetic head decides by wide margins, so every type drafts the same tokens and acceptance
stays put while the type changes: the speed differences between the rows are then the types'
per-draft cost. The table says the acceptance spread across the kept heads; a spread of more than
a point or two means the differences include acceptance too.

--json writes the heads stage (``tune-joint --heads-from`` reads it back), --md the table for
benchmarks/README.md. On CPU the speedups say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ggufmtp.cli.measure_common import server_options
from ggufmtp.cli.options import GpuLayers
from ggufmtp.measure.core.options import DEFAULT_MAX_TOKENS
from ggufmtp.quant.recipe import Recipe
from ggufmtp.refs import local_model_arg
from ggufmtp.search.joint import HEAD_TYPES
from ggufmtp.search.joint_heads import HeadSettings, head_stage


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--source", required=True, help="the BF16 MODEL was quantized from (its receipt names it)")
    ap.add_argument("--recipe", default="hifi-q4_k_m-mtp", help="MODEL's recipe (the head types are its [mtp] roles)")
    ap.add_argument("--types", default=",".join(HEAD_TYPES))
    ap.add_argument("--no-own-head", action="store_true")
    ap.add_argument("--k", type=int, default=None, help="window (default: the recipe's draft_n_max, else 4)")
    ap.add_argument("--limit", type=int, default=8, help="prompts of the suite")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--suite", default="chat-v1")
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    ap.add_argument("--gpu-layers", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--md", dest="md_out", default=None)
    a = ap.parse_args(argv)
    gpu_layers = GpuLayers().convert(a.gpu_layers, None, None) if a.gpu_layers else None  # -ngl: N, auto or all
    settings = HeadSettings(head_types=tuple(t for t in a.types.split(",") if t), own_head=not a.no_own_head, k=a.k,
                            limit=a.limit, seeds=tuple(int(s) for s in a.seeds.split(",")), suite=a.suite,
                            max_tokens=a.max_tokens, server=server_options(gpu_layers, a.threads, None))
    stage = head_stage(local_model_arg(a.model), local_model_arg(a.source), Recipe.load(a.recipe), settings,
                       lambda m: print(m, file=sys.stderr, flush=True))
    md = (f"Head types of {stage.model} (recipe {stage.recipe}) on {stage.hardware}: {a.limit} prompts x seeds "
          f"{a.seeds} x {a.max_tokens} tokens, k={stage.k}, each head against {stage.source}'s.\n\n" + stage.markdown())
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(stage.to_dict(), indent=1))
    if a.md_out:
        Path(a.md_out).write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
