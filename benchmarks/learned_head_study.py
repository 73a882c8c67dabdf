#!/usr/bin/env python3
"""The study of issue #29 on a trained model: what head precision, the MTP-head imatrix, trunk
precision, KV-cache types, the chat template and the draft window do to a head that learned its job.

    python3 benchmarks/learned_head_study.py MODEL-bf16.gguf --initial-head INITIAL-bf16.gguf \\
        --corpus corpus.jsonl --out study/ [--parts head,imatrix,trunk,window,template,kv] \\
        [--limit N] [--seeds 42,1337] [--max-tokens 128] [-ngl 999] [--budget SECONDS] [--dry-run]

MODEL is the trained model's BF16 GGUF (`ggufmtp train`, or `builtin:tiny-qwen35moe-trained`),
INITIAL the same trunk with the head at its initial weights (`...-initial-head`): the untrained-head
row. Every step is a `python3 -m ggufmtp ...` subprocess (`--json` where the command has it); the
script imports nothing of ggufmtp. The calibration text (imatrix), the KLD text (`ggufmtp eval`) and
optionally the prompts come from the model's own training corpus (`--corpus`: the JSONL `ggufmtp train
--write-corpus` writes; calibration = its train split, KLD = its held-out split, `--suite heldout:N` =
N held-out questions), or from `--calib` / `--eval-corpus` / `--suite` directly.

Parts (everything else fixed; each row's verification uses the same suite, seeds, max tokens, k and
server settings, so rows that share prompts are compared paired by prompt):

- ``head``: trunk fixed at Q4_K_M (MTP imatrix), the whole MTP block at BF16, Q8_0, Q6_K, Q5_K,
  Q4_K, IQ4_XS, IQ3_XXS, IQ2_XXS; plus the unquantized model and the untrained head (INITIAL, same
  recipe as the BF16-head row). Paired against the BF16-head row.
- ``imatrix``: the head at Q4_K, IQ4_XS, IQ3_XXS, IQ2_XXS with the MTP imatrix (`imatrix compute
  --mtp`) against a trunk-only imatrix (`imatrix compute`, what llama-imatrix makes). At 0c1e570
  `tensor_requires_imatrix` (src/llama-quant.cpp) makes IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S and
  IQ3_XXS (and Q2_K in a Q2_K_S file) refuse a tensor without statistics ("Missing importance matrix
  for tensor ... in a very low-bit quantization"; ggufmtp's plan refuses it before any work); Q4_K /
  Q5_K / Q6_K without statistics fall back to their reference rounding (`quantize_row_q*_K_ref`),
  IQ4_XS weighs each value by its own square, Q8_0 never reads an imatrix. So the trunk-only
  IQ3_XXS / IQ2_XXS rows are the refusal, measured, and the fallbacks publishers use instead: the MTP
  block kept off the IQ types (the shipped `iq2_xxs-mtp` recipe's table: Q4_K with eh_proj at Q8_0)
  and static Q4_0 (llama.cpp PR #23575's proposal, bartowski's suggestion; not merged). Paired
  against the same head type with the MTP imatrix.
- ``trunk``: trunk Q8_0, Q6_K, Q4_K_M, IQ4_XS, Q3_K_M (MTP imatrix), the MTP block at Q8_0. Paired
  against the Q8_0 trunk; KLD against BF16 is what changes here.
- ``window``: k = 1..6 (`verify --draft-n-max k`, one verification per window as `verify --sweep`
  runs them, split so that a budget stop keeps the windows already measured). Paired against --draft-n-max.
- ``template``: `verify --raw` (the chat template's /v1/chat/completions against raw /completion,
  same prompts), on each of --template-suites (a model trained on chat turns only may end a bare
  prompt at once: then there is nothing to draft, and the table says so); thinking on/off where the
  template reads enable_thinking (verify then runs both modes; when it does not, the table says so).
- ``kv``: `verify --matrix "kv=K draft-kv=D depth=N"`, one cell per verification: the target's KV
  cache and the MTP draft context's own (`-ctkd/-ctvd`) over --kv-types x --draft-kv-types x
  --kv-depths. Paired against f16/f16 at the same depth.

kv, template and window run on the reference artifact (trunk Q4_K_M, head Q8_0, MTP imatrix: the
shipped q4_k_m-mtp-q8 policy), `--settings-model bf16` runs them on the unquantized model instead.

Outputs in --out: `arms/<part>--<arm>.json` (one per row: what was run, sizes, head types, KLD,
acceptance and fair speedup with verify's 95% CIs, the paired comparison, per-prompt counts),
`raw/` (every command's JSON: quantize, eval, verify with all requests), `study.json`, `study.md`
(the tables) and `study.log` (progress lines with timestamps). Models and imatrices go to --work
(default OUT/work). Resumable: an arm whose JSON exists is not run again (nor is an artifact,
imatrix, eval or verification whose output exists); --budget stops cleanly (no arm is started
that the time left cannot hold by the costs measured so far, a running one is stopped at the
deadline) and the tables are written either way. --tables-only rewrites the tables from the arms.

GPU budget (one H100, about 25 minutes in all; the `study` stage of benchmarks/gpu/run_h200.sh).
Measured here (2 shared EPYC cores, builtin:tiny-qwen35moe-trained, `--limit 2 --seeds 42 --max-tokens
32 -t 1`, every part, kv depths 0 and 128): 52 arms = 42 verifications (2.4 s mean, 2.9 s max), 19
quantizations or refusals (2.1 s mean), 4 imatrix runs (1.6 s), 4 KLD evals (1.6 s), 168 s in all;
the fixed cost of a ggufmtp process (interpreter, imports, inspect) is ~1-1.5 s of each. Scaled to
the GPU model with the H100 facts in benchmarks/README.md:

- machine start ~2 min;
- CUDA build of 0c1e570 ~3.5 min, niced, in the background, while `ggufmtp train --preset gpu-small
  --steps 800` runs: 800 x 16 x 1024 = 13.1 M tokens at the measured 52 k tokens/s = 252 s, + 14 s
  corpus and tokenizer + 5 s held-out losses = ~4.6 min (the preset's 1200 steps would take 6.3 min,
  2 minutes of the study's verifications);
- the two conversions, side by side: ~0.5 min (13 s each here for the tiny model, the imports dominate);
- the study (`--budget` = what is left of 21 min after training started, ~15.5 min): 2 imatrix runs
  (64 chunks; the 35B shape's 16 chunks took 37 / 51 s, this model is ~250x smaller) ~0.3 min; 17
  quantizations of 270 MB (the 72 GB shape quantizes at ~330 MB/s on 16 cores; plan, audit and
  receipt add ~2 s) ~1 min; 5 KLD evals (one per distinct trunk: the head and imatrix rows share
  one) + the base pass ~0.5 min; 43 verifications (45 units: template = chat + raw, on the held-out
  questions and on chat-v1) of 12 held-out
  prompts x 2 seeds x 128 tokens = 3,072 tokens per arm, decoded at ~1-1.5 ms a token (the
  40-layer shape decodes at 4.5 ms: ~0.1 ms a layer plus overhead; this model has 8 + 1 layers)
  = ~8 s for both arms + ~8 s of server and process start = ~16 s each, ~12 min;
- so ~13.8 min of study in a ~15.5 min window: the margin is ~1.5 min, and when verifications cost
  more than estimated --budget drops the last kv cells (the order is head, imatrix, trunk, window,
  template, kv; within kv depth 0 first, off-diagonal cache pairs last).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PARTS = ("head", "imatrix", "trunk", "window", "template", "kv")
HEAD_TYPES = ("BF16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "IQ4_XS", "IQ3_XXS", "IQ2_XXS")
IMATRIX_TYPES = ("Q4_K", "IQ4_XS", "IQ3_XXS", "IQ2_XXS")
TRUNK_TYPES = ("Q8_0", "Q6_K", "Q4_K_M", "IQ4_XS", "Q3_K_M")
FIXED_TRUNK = "Q4_K_M"
FIXED_HEAD = "Q8_0"
MTP_ROLES = ("eh_proj", "attention", "routed_experts", "shared_expert", "rest")
# src/llama-quant.cpp at 0c1e570, tensor_requires_imatrix (Q2_K too, in a Q2_K_S file)
NEEDS_IMATRIX = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS"})
# the fallbacks for an IQ head that has no statistics: name -> (MTP roles, what it is)
FALLBACKS: dict[str, tuple[dict[str, str], str]] = {
    "q4_k-eh_q8_0": ({"eh_proj": "Q8_0", "attention": "Q4_K", "routed_experts": "Q4_K", "shared_expert": "Q4_K",
                      "rest": "Q4_K"},
                     "MTP block kept off IQ types: Q4_K, eh_proj Q8_0 (the shipped iq2_xxs-mtp recipe's [mtp] table)"),
    "q4_0": ({r: "Q4_0" for r in MTP_ROLES},
             "static Q4_0 for the tensors without statistics (llama.cpp PR #23575's proposal; not merged)"),
}
GGUFMTP = [sys.executable, "-m", "ggufmtp"]
BOOT_RESAMPLES = 2000


def now() -> float:
    return time.monotonic()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", name)


# ----------------------------------------------------------------------------- what is run


@dataclasses.dataclass(frozen=True)
class Artifact:
    """A model file: the trained (or initial-head) BF16 GGUF, or a quantization of it."""

    source: str  # "trained" | "initial"
    ftype: str | None  # None: the BF16 file itself
    head: tuple[tuple[str, str], ...] = ()  # MTP role -> type
    imatrix: str | None = None  # "mtp" | "trunk" | None

    @property
    def quantized(self) -> bool:
        return self.ftype is not None

    def head_label(self) -> str:
        types = dict(self.head)
        vals = set(types.values())
        if not vals:
            return "BF16"
        if len(vals) == 1:
            return next(iter(vals))
        rest = {t for r, t in types.items() if r != "eh_proj"}
        return f"{'/'.join(sorted(rest))} (eh_proj {types.get('eh_proj')})"

    @property
    def name(self) -> str:
        if not self.quantized:
            return f"{self.source}-bf16"
        types = dict(self.head)
        head = "-".join(f"{r}_{types[r]}" for r in MTP_ROLES) if len(set(types.values())) > 1 \
            else next(iter(types.values()))
        return safe(f"{self.source}-{self.ftype}-head-{head}-im-{self.imatrix or 'none'}").lower()

    def recipe(self) -> str:
        lines = [f'name = "study-{self.name}"',
                 f'description = "learned-head study: trunk {self.ftype}, MTP block {self.head_label()}"',
                 f'ftype = "{self.ftype}"', f'imatrix = "{"recommended" if self.imatrix else "none"}"', "",
                 "[mtp]", "required = true"]
        lines += [f'{r} = "{t}"' for r, t in self.head]
        return "\n".join(lines) + "\n"


def head_all(t: str) -> tuple[tuple[str, str], ...]:
    return tuple((r, t) for r in MTP_ROLES)


@dataclasses.dataclass
class Arm:
    """One row of one table: an artifact and the verification it gets."""

    part: str
    key: str
    label: dict[str, Any]
    artifact: Artifact
    verify: tuple[str, ...] = ()  # extra verify arguments
    ref: str | None = None  # the arm (same part) it is paired with
    view: dict[str, Any] = dataclasses.field(default_factory=dict)  # which slice of the verification
    expect_refusal: bool = False
    note: str = ""
    cost_units: float = 1.0  # verifications' worth of time

    @property
    def id(self) -> str:
        return f"{self.part}--{self.key}"


def build_arms(a: argparse.Namespace) -> list[Arm]:
    arms: list[Arm] = []
    ref_art = Artifact("trained", FIXED_TRUNK, head_all(FIXED_HEAD), "mtp")
    settings_art = Artifact("trained", None) if a.settings_model == "bf16" else ref_art
    for part in a.parts:
        if part == "head":
            arms.append(Arm("head", "bf16", {"head": "BF16", "trunk": FIXED_TRUNK, "imatrix": "MTP"},
                            Artifact("trained", FIXED_TRUNK, head_all("BF16"), "mtp"), note="reference row"))
            for t in a.head_types:
                if t == "BF16":
                    continue
                arms.append(Arm("head", t.lower(), {"head": t, "trunk": FIXED_TRUNK, "imatrix": "MTP"},
                                Artifact("trained", FIXED_TRUNK, head_all(t), "mtp"), ref="bf16"))
            arms.append(Arm("head", "untrained", {"head": "BF16, untrained (initial weights)", "trunk": FIXED_TRUNK,
                                                  "imatrix": "MTP"},
                            Artifact("initial", FIXED_TRUNK, head_all("BF16"), "mtp"), ref="bf16"))
            arms.append(Arm("head", "model-bf16", {"head": "BF16", "trunk": "BF16 (unquantized model)",
                                                   "imatrix": "-"}, Artifact("trained", None), ref="bf16"))
        elif part == "imatrix":
            for t in a.imatrix_types:
                arms.append(Arm("imatrix", f"{t.lower()}-mtp", {"head": t, "imatrix": "MTP (compute --mtp)",
                                                                "what": "head quantized with its statistics"},
                                Artifact("trained", FIXED_TRUNK, head_all(t), "mtp")))
                if t in NEEDS_IMATRIX:
                    arms.append(Arm("imatrix", f"{t.lower()}-trunk", {"head": t, "imatrix": "trunk-only",
                                                                      "what": "refused"},
                                    Artifact("trained", FIXED_TRUNK, head_all(t), "trunk"), expect_refusal=True))
                    for fb in a.fallbacks:
                        roles, what = FALLBACKS[fb]
                        arms.append(Arm("imatrix", f"{t.lower()}-trunk-fallback-{fb}",
                                        {"head": f"{t} -> fallback", "imatrix": "trunk-only",
                                         "what": "fallback: " + what},
                                        Artifact("trained", FIXED_TRUNK, tuple((r, roles[r]) for r in MTP_ROLES),
                                                 "trunk"), ref=f"{t.lower()}-mtp"))
                else:
                    what = ("no statistics: IQ4_XS weighs each value by its own square" if t.startswith("IQ")
                            else "no statistics: reference rounding (quantize_row_*_ref)")
                    arms.append(Arm("imatrix", f"{t.lower()}-trunk", {"head": t, "imatrix": "trunk-only",
                                                                      "what": what},
                                    Artifact("trained", FIXED_TRUNK, head_all(t), "trunk"), ref=f"{t.lower()}-mtp"))
        elif part == "trunk":
            for t in a.trunk_types:
                arms.append(Arm("trunk", t.lower(), {"trunk": t, "head": FIXED_HEAD, "imatrix": "MTP"},
                                Artifact("trained", t, head_all(FIXED_HEAD), "mtp"),
                                ref=None if t == a.trunk_types[0] else a.trunk_types[0].lower()))
        elif part == "window":
            for k in a.windows:
                arms.append(Arm("window", f"k{k}", {"k": k}, settings_art, verify=("--draft-n-max", str(k)),
                                ref=None if k == a.draft_n_max else f"k{a.draft_n_max}"))
        elif part == "template":
            for spec in a.template_suites:
                main = spec == "main"
                arms.append(Arm("template", "chat-raw" if main else f"chat-raw-{safe(spec)}",
                                {"endpoints": "chat + raw", "suite": "the study's suite" if main else spec},
                                settings_art, verify=("--raw",) if main else ("--raw", "--suite", spec), cost_units=2.0))
        elif part == "kv":
            ctx = max(4096, max(a.kv_depths) + a.max_tokens + 1024)
            for depth in a.kv_depths:
                for kv, dkv in kv_cells(a.kv_types, a.draft_kv_types):
                    ref = None if (kv, dkv) == ("f16", "f16") else f"d{depth}-f16-f16"
                    arms.append(Arm("kv", f"d{depth}-{kv}-{dkv}", {"kv": kv, "draft_kv": dkv, "depth": depth},
                                    settings_art,
                                    verify=("-c", str(ctx), "--matrix", f"kv={kv} draft-kv={dkv} depth={depth}"),
                                    ref=ref, cost_units=1.0 + depth / 4096))
    return arms


def kv_cells(kv_types: list[str], draft_kv_types: list[str]) -> list[tuple[str, str]]:
    """Every (target, draft) pair, the most informative first: the reference, the target's types with
    the draft at f16, the draft's types with the target at f16, then the rest."""
    cells = [(k, d) for k in kv_types for d in draft_kv_types]

    def rank(c: tuple[str, str]) -> tuple[int, int]:
        k, d = c
        if (k, d) == ("f16", "f16"):
            return (0, 0)
        if d == "f16":
            return (1, kv_types.index(k))
        if k == "f16":
            return (2, draft_kv_types.index(d))
        if k == d:
            return (3, kv_types.index(k))
        return (4, cells.index(c))

    return sorted(cells, key=rank)


# ----------------------------------------------------------------------------- statistics


def per_prompt(requests: list[dict[str, Any]], endpoint: str = "chat", mode: str | None = None,
               k: int | None = None) -> dict[str, list[float]]:
    """prompt id -> [drafted, accepted, mtp tokens, mtp ms, vanilla tokens, vanilla ms, mtp requests],
    seeds pooled."""
    out: dict[str, list[float]] = {}
    for r in requests:
        if r.get("endpoint", "chat") != endpoint or (mode is not None and r.get("mode") != mode):
            continue
        if k is not None and r.get("k") not in (None, k):
            continue
        row = out.setdefault(str(r.get("prompt_id")), [0.0] * 7)
        if r.get("arm") == "mtp":
            row[6] += 1
            row[0] += r.get("draft_n") or 0
            row[1] += r.get("draft_n_accepted") or 0
            row[2] += r.get("predicted_n") or 0
            row[3] += r.get("predicted_ms") or 0.0
        elif r.get("arm") == "vanilla":
            row[4] += r.get("predicted_n") or 0
            row[5] += r.get("predicted_ms") or 0.0
    return out


def _acc(rows: list[list[float]]) -> float | None:
    d = sum(r[0] for r in rows)
    return sum(r[1] for r in rows) / d if d else None


def _speed(rows: list[list[float]]) -> float | None:
    mn, mms, vn, vms = (sum(r[i] for r in rows) for i in (2, 3, 4, 5))
    if not (mn and mms and vn and vms):
        return None
    return (mn / mms) / (vn / vms)


def _pct_ci(values: list[float]) -> list[float | None]:
    v = sorted(x for x in values if x is not None and math.isfinite(x))
    if len(v) < 10:
        return [None, None]
    return [v[int(0.025 * (len(v) - 1))], v[int(math.ceil(0.975 * (len(v) - 1)))]]


def paired(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, Any]:
    """B against A on the prompts both have: acceptance difference (points) and speedup ratio, with
    95% percentile-bootstrap CIs over prompts (seeds pooled within a prompt, arms paired)."""
    ids = sorted(set(a) & set(b))
    if not ids:
        return {"n_prompts": 0}
    ra, rb = [a[i] for i in ids], [b[i] for i in ids]
    acc_a, acc_b, sp_a, sp_b = _acc(ra), _acc(rb), _speed(ra), _speed(rb)
    rng = random.Random(0)
    d_acc, r_sp = [], []
    for _ in range(BOOT_RESAMPLES):
        idx = [rng.randrange(len(ids)) for _ in ids]
        xa, xb = _acc([ra[i] for i in idx]), _acc([rb[i] for i in idx])
        if xa is not None and xb is not None:
            d_acc.append(xb - xa)
        ya, yb = _speed([ra[i] for i in idx]), _speed([rb[i] for i in idx])
        if ya and yb:
            r_sp.append(yb / ya)
    return {"n_prompts": len(ids),
            "acceptance_diff": None if acc_a is None or acc_b is None else acc_b - acc_a,
            "acceptance_diff_ci95": _pct_ci(d_acc),
            "speedup_ratio": None if not (sp_a and sp_b) else sp_b / sp_a,
            "speedup_ratio_ci95": _pct_ci(r_sp)}


# ----------------------------------------------------------------------------- reading verify's JSON


def verification_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The single verification in a `verify` or 1-cell `verify --matrix` JSON."""
    if "cells" in doc and doc.get("verifications"):
        return doc["verifications"][0]
    return doc


def views_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every comparison one verification holds: (endpoint, mode) -> its headline numbers."""
    v = verification_of(doc)
    modes = list((v.get("modes") or {}).keys()) or [v.get("mode") or "default"]
    out = []
    for endpoint, source in (("chat", v.get("modes") or {}), ("raw", v.get("raw") or {})):
        for m in modes:
            c = source.get(m)
            if c is None and endpoint == "chat" and len(modes) == 1:
                c = v
            if not c:
                continue
            mtp = c.get("mtp") or {}
            out.append({
                "endpoint": endpoint, "mode": m,
                "acceptance": mtp.get("acceptance"), "acceptance_ci95": mtp.get("acceptance_ci95"),
                "draft_n": mtp.get("draft_n"), "draft_n_accepted": mtp.get("draft_n_accepted"),
                "mean_acceptance_length": mtp.get("mean_acceptance_length"),
                "acceptance_by_position": mtp.get("acceptance_by_position"),
                "mtp_tokens_per_second": mtp.get("tokens_per_second"),
                "vanilla_tokens_per_second": (c.get("vanilla") or {}).get("tokens_per_second"),
                "speedup": c.get("speedup"), "speedup_ci95": c.get("speedup_ci95"),
                "identical_output_fraction": c.get("identical_output_fraction"),
            })
    return out


# ----------------------------------------------------------------------------- the study


class BudgetExceeded(Exception):
    pass


class StepFailed(Exception):
    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class Study:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.out: Path = a.out
        self.work: Path = a.work or (a.out / "work")
        self.t0 = now()
        self.deadline = self.t0 + a.budget if a.budget else None
        self.costs: dict[str, list[float]] = {}  # kind -> measured seconds (per unit)
        self.status: dict[str, dict[str, Any]] = {}
        self.failed: dict[str, str] = {}  # command tag -> its error
        self.inputs: dict[str, Any] = {}
        self.model_info: dict[str, Any] = {}
        self.log_f = None
        self.gguf = None
        if not a.dry_run:
            self.out.mkdir(parents=True, exist_ok=True)
            self.work.mkdir(parents=True, exist_ok=True)
            self.log_f = open(self.out / "study.log", "a", buffering=1)
            try:
                import gguf  # the gguf-py reader, for the trunk digests (optional)
                self.gguf = gguf
            except ImportError:
                self.log("gguf-py not importable: trunks are not hashed, KLD is measured for every artifact")

    # -- logging and commands

    def log(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} [{now() - self.t0:7.1f}s] {msg}"
        print(line, file=sys.stderr, flush=True)
        if self.log_f:
            self.log_f.write(line + "\n")

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - now()

    def estimate(self, kind: str, units: float = 1.0) -> float:
        c = self.costs.get(kind)
        return (max(c) * units) if c else 0.0

    def check_budget(self, kind: str, units: float = 1.0) -> None:
        est = self.estimate(kind, units)
        if self.left() < max(est, 5.0):
            raise BudgetExceeded(f"{kind}: {self.left():.0f} s left, {est:.0f} s expected")

    def cli(self, args: list[str], tag: str, kind: str, units: float = 1.0,
            ok_codes: tuple[int, ...] = (0,)) -> tuple[int, str]:
        """Run `python3 -m ggufmtp ARGS`; stdout/stderr kept in raw/logs/TAG.*. Returns (rc, stdout).
        A command that failed is not run again in this study (an imatrix or a quantization many arms share)."""
        if tag in self.failed:
            raise StepFailed(self.failed[tag])
        self.check_budget(kind, units)
        logs = self.out / "raw" / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        argv = [*GGUFMTP, *args]
        self.log(f"  $ ggufmtp {shlex.join(args)}")
        t = now()
        with open(logs / f"{tag}.out", "w") as fo, open(logs / f"{tag}.err", "w") as fe:
            p = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, start_new_session=True)
            timeout = None if self.deadline is None else max(1.0, self.left() + self.a.grace)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.log(f"  budget reached: stopping {tag} (SIGTERM)")
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                raise BudgetExceeded(f"{tag}: stopped at the deadline") from None
        dt = now() - t
        self.costs.setdefault(kind, []).append(dt / units)
        self.log(f"  {tag}: rc {rc} in {dt:.1f} s")
        stdout = (logs / f"{tag}.out").read_text(errors="replace")
        if rc not in ok_codes:
            err = (logs / f"{tag}.err").read_text(errors="replace").strip().splitlines()
            self.failed[tag] = f"`ggufmtp {shlex.join(args)}` exit {rc}: " + " | ".join(err[-6:])
            raise StepFailed(self.failed[tag])
        return rc, stdout

    def common_threads(self) -> list[str]:
        return ["-t", str(self.a.threads)] if self.a.threads else []

    # -- inputs

    def resolve(self, model: str) -> Path:
        if not model.startswith("builtin:"):
            return Path(model).resolve()
        _, out = self.cli(["inspect", model, "--json"], safe(f"inspect-{model}"), "inspect")
        return Path(json.loads(out)["path"])

    def prepare_inputs(self) -> None:
        a = self.a
        self.model = self.resolve(a.model)
        self.initial = self.resolve(a.initial_head) if a.initial_head else None
        _, out = self.cli(["inspect", str(self.model), "--json"], "inspect-model", "inspect")
        info = json.loads(out)
        self.mtp_blocks = info.get("mtp_blocks") or []
        self.model_info = {"path": str(self.model), "sha256": sha256_file(self.model), "size_bytes":
                           self.model.stat().st_size, "architecture": info.get("architecture"),
                           "n_params": info.get("n_params"), "trunk_layers": info.get("trunk_layers"),
                           "mtp_blocks": self.mtp_blocks, "mtp_status": info.get("mtp_status"),
                           "initial_head": str(self.initial) if self.initial else None,
                           "initial_head_sha256": sha256_file(self.initial) if self.initial else None}
        inp = self.out / "inputs"
        inp.mkdir(parents=True, exist_ok=True)
        conv: dict[str, list[list[str]]] = {}
        if a.corpus:
            for line in open(a.corpus):
                d = json.loads(line)
                if d.get("split") in ("train", "heldout"):
                    conv.setdefault(d["split"], []).append(d)
        self.calib = a.calib
        if not self.calib:
            if not conv.get("train"):
                self.calib = "builtin:calib-v1"
            else:
                self.calib = str(inp / "calib.txt")
                write_text_sample(Path(self.calib), conv["train"], a.calib_chars)
        self.eval_corpus = a.eval_corpus
        if not self.eval_corpus:
            if not conv.get("heldout"):
                self.eval_corpus = "builtin:calib-v1"
            else:
                self.eval_corpus = str(inp / "eval-heldout.txt")
                write_text_sample(Path(self.eval_corpus), conv["heldout"], a.eval_chars)
        self.suite = a.suite
        if a.suite.startswith("heldout:"):
            if not conv.get("heldout"):
                raise SystemExit("--suite heldout:N needs --corpus with a held-out split")
            self.suite = str(inp / "suite-heldout.jsonl")
            write_suite(Path(self.suite), conv["heldout"], int(a.suite.split(":", 1)[1]))
        self.inputs = {"corpus": str(a.corpus) if a.corpus else None,
                       "corpus_sha256": sha256_file(Path(a.corpus)) if a.corpus else None,
                       "calib": self.calib, "eval_corpus": self.eval_corpus, "suite": self.suite}
        for k in ("calib", "eval_corpus", "suite"):
            p = Path(self.inputs[k])
            if p.is_file():
                self.inputs[k + "_sha256"] = sha256_file(p)
        self.log(f"model {self.model} ({self.model_info['size_bytes']:,} bytes), MTP blocks {self.mtp_blocks}")
        self.log(f"calibration {self.calib}; KLD text {self.eval_corpus}; suite {self.suite}")

    # -- imatrices, artifacts, evals, verifications

    def imatrix(self, kind: str) -> Path:
        path = self.work / f"imatrix-{kind}.gguf"
        raw = self.out / "raw" / f"imatrix-{kind}.json"
        if path.is_file() and raw.is_file():
            return path
        a = self.a
        args = ["imatrix", "compute", str(self.model), "--corpus", self.calib, "-o", str(path), "--no-progress",
                "--json", "--chunks", str(a.imatrix_chunks), *self.common_threads()]
        if a.gpu_layers:
            args += ["-ngl", str(a.gpu_layers)]
        if kind == "mtp":
            args.append("--mtp")
        _, out = self.cli(args, f"imatrix-{kind}", "imatrix")
        doc = json.loads(out)
        _, info = self.cli(["imatrix", "info", str(path), "--model", str(self.model), "--json"],
                           f"imatrix-{kind}-info", "inspect")
        doc["info"] = json.loads(info)
        write_json(raw, doc)
        return path

    def source_path(self, art: Artifact) -> Path:
        if art.source == "initial":
            if not self.initial:
                raise StepFailed("no --initial-head given")
            return self.initial
        return self.model

    def artifact(self, art: Artifact) -> dict[str, Any]:
        """Quantize ``art`` (once); its path, sizes, head types and trunk digest."""
        if not art.quantized:
            src = self.source_path(art)
            t = self.tensor_summary(src)
            return {"name": art.name, "path": str(src), "size_bytes": src.stat().st_size, "ftype": "BF16",
                    "bpw": 16.0, "head_bytes": t.get("head_bytes"), "head_types": t.get("head_types") or {"BF16": None},
                    "trunk_digest": t.get("trunk_digest"), "trunk_types": t.get("trunk_types"), "recipe": None,
                    "imatrix": None}
        raw = self.out / "raw" / f"quantize-{art.name}.json"
        path = self.work / f"{art.name}.gguf"
        doc = read_json(raw)
        if not (doc and path.is_file()):
            refused = read_json(self.out / "raw" / f"refused-{art.name}.json")
            if refused:
                raise StepFailed(refused["error"], refused=True)
            recipe = self.out / "recipes" / f"{art.name}.toml"
            recipe.parent.mkdir(parents=True, exist_ok=True)
            recipe.write_text(art.recipe())
            args = ["quantize", str(self.source_path(art)), "-r", str(recipe), "-o", str(path), "--no-progress",
                    "--json", "-t", str(self.a.quant_threads)]
            if art.imatrix:
                args += ["--imatrix", str(self.imatrix(art.imatrix))]
            try:
                _, out = self.cli(args, f"quantize-{art.name}", "quantize")
            except StepFailed as e:
                if any(m in str(e) for m in ("needs an imatrix", "Missing importance matrix", "requires an imatrix")):
                    write_json(self.out / "raw" / f"refused-{art.name}.json", {"command": args, "error": str(e)})
                    raise StepFailed(str(e), refused=True) from None
                raise
            doc = json.loads(out)
            doc.update(self.tensor_summary(path))
            doc["recipe_toml"] = art.recipe()
            doc["command"] = args
            write_json(raw, doc)
        mtp = doc.get("mtp") or {}
        return {"name": art.name, "path": str(path), "size_bytes": doc.get("size_bytes"), "bpw": doc.get("bpw"),
                "head_bytes": mtp.get("bytes"), "head_types": mtp.get("types"), "eh_proj": mtp.get("eh_proj"),
                "ftype": art.ftype, "trunk_digest": doc.get("trunk_digest"), "trunk_types": doc.get("trunk_types"),
                "sha256": doc.get("sha256"), "recipe": doc.get("recipe_toml"), "imatrix": art.imatrix,
                "quantize_seconds": doc.get("seconds")}

    def tensor_summary(self, path: Path) -> dict[str, Any]:
        """With gguf-py: sha256 over every tensor outside the MTP block(s) (equal digests, equal trunk
        logits), the trunk's bytes by type, and the head's bytes and tensor types."""
        if self.gguf is None:
            return {}
        reader = self.gguf.GGUFReader(str(path))
        prefixes = tuple(f"blk.{b}." for b in self.mtp_blocks)
        h = hashlib.sha256()
        trunk: dict[str, int] = {}
        head: dict[str, int] = {}
        head_bytes = 0
        for t in sorted(reader.tensors, key=lambda t: t.name):
            ty = str(t.tensor_type.name)
            if t.name.startswith(prefixes):
                head_bytes += int(t.n_bytes)
                head[ty] = head.get(ty, 0) + 1
                continue
            trunk[ty] = trunk.get(ty, 0) + int(t.n_bytes)
            h.update(t.name.encode() + b"\0" + ty.encode() + b"\0")
            h.update(t.data.tobytes())
        return {"trunk_digest": h.hexdigest(), "trunk_types": dict(sorted(trunk.items(), key=lambda kv: -kv[1])),
                "head_bytes": head_bytes, "head_types": head}

    def kld(self, info: dict[str, Any]) -> dict[str, Any] | None:
        if info["path"] == str(self.model):
            return {"kld_mean": 0.0, "same_top_p": 1.0, "ln_ppl_ratio": 0.0, "note": "the BF16 model itself"}
        key = (info.get("trunk_digest") or info.get("sha256") or info["name"])[:16]
        raw = self.out / "raw" / f"eval-{key}.json"
        doc = read_json(raw)
        if doc is None:
            a = self.a
            args = ["eval", str(self.model), info["path"], "--corpus", self.eval_corpus, "--chunks",
                    str(a.eval_chunks), "--json", *self.common_threads()]
            if a.gpu_layers:
                args += ["-ngl", str(a.gpu_layers)]
            _, out = self.cli(args, f"eval-{key}", "eval")
            doc = json.loads(out)
            doc["artifact"] = info["name"]
            write_json(raw, doc)
        keep = ("kld_mean", "kld_mean_err", "kld_p99", "same_top_p", "same_top_p_err", "ppl", "ppl_base",
                "ln_ppl_ratio", "ln_ppl_ratio_err", "chunks", "ctx_size")
        out = {k: doc.get(k) for k in keep}
        out["measured_on"] = doc.get("artifact")
        return out

    def verify(self, info: dict[str, Any], extra: tuple[str, ...], units: float
               ) -> tuple[dict[str, Any], str, list[str]]:
        a = self.a
        extra = list(extra)
        k = a.draft_n_max
        if "--draft-n-max" in extra:  # one place in the command line, so equal verifications are one
            i = extra.index("--draft-n-max")
            k = int(extra[i + 1])
            del extra[i:i + 2]
        suite = self.suite
        if "--suite" in extra:  # the template part's second suite
            i = extra.index("--suite")
            suite = extra[i + 1]
            del extra[i:i + 2]
        args = ["verify", info["path"], "--suite", suite, "--seeds", a.seeds, "--max-tokens", str(a.max_tokens),
                "--draft-n-max", str(k)]
        if a.limit:
            args += ["--limit", str(a.limit)]
        if a.gpu_layers:
            args += ["-ngl", str(a.gpu_layers)]
        args += self.common_threads()
        for s in a.server_arg:
            args.append(f"--server-arg={s}")
        args += list(extra)
        key = hashlib.sha256(json.dumps([info["name"], args[2:]]).encode()).hexdigest()[:12]
        raw = self.out / "raw" / f"verify-{safe(info['name'])}-{key}.json"
        doc = read_json(raw)
        if doc is None:
            tmp = raw.with_name(raw.name + ".part")
            tmp.unlink(missing_ok=True)
            # exit 1 = a failed verdict (the JSON is complete); the figures are what the study wants
            self.cli([*args, "--out", str(tmp), "--json"], f"verify-{safe(info['name'])}-{key}", "verify", units,
                     ok_codes=(0, 1))
            doc = read_json(tmp)
            if doc is None:
                raise StepFailed(f"verify wrote no JSON ({tmp})")
            os.replace(tmp, raw)
        return doc, str(raw.relative_to(self.out)), args

    # -- arms

    def arm_path(self, arm: Arm) -> Path:
        return self.out / "arms" / f"{arm.id}.json"

    def run_arm(self, arm: Arm) -> None:
        path = self.arm_path(arm)
        if path.is_file():
            self.status[arm.id] = {"status": "done earlier"}
            self.log(f"{arm.id}: done earlier ({path.name})")
            return
        self.log(f"{arm.id}: {arm.label}")
        t = now()
        rec: dict[str, Any] = {"part": arm.part, "arm": arm.key, "label": arm.label, "ref": arm.ref,
                               "note": arm.note, "artifact_spec": dataclasses.asdict(arm.artifact)}
        try:
            try:
                info = self.artifact(arm.artifact)
            except StepFailed as e:
                if not e.refused:
                    raise
                rec.update(status="refused", error=str(e), expected=arm.expect_refusal,
                           seconds=round(now() - t, 2))
                write_json(path, rec)
                self.status[arm.id] = {"status": "refused"}
                self.log(f"{arm.id}: refused ({'as expected' if arm.expect_refusal else 'UNEXPECTED'})")
                return
            if arm.expect_refusal:
                rec["note"] = "expected a refusal, but it quantized"
            rec["artifact"] = info
            try:
                rec["kld"] = self.kld(info)
            except StepFailed as e:  # the verification does not need it
                rec["kld"] = {"error": str(e)[-1000:]}
                self.log(f"{arm.id}: KLD failed: {e}")
            doc, raw, args = self.verify(info, arm.verify, arm.cost_units)
            v = verification_of(doc)
            rec["verify_json"] = raw
            rec["verify_command"] = ["ggufmtp", *args]
            rec["verdict"] = v.get("verdict")
            rec["views"] = views_of(doc)
            rec["thinking_modes"] = (v.get("server") or {}).get("thinking_modes")
            rec["chat_template_sha256"] = (v.get("server") or {}).get("chat_template_sha256")
            rec["hardware"] = v.get("hardware")
            rec["server_args"] = {"vanilla": (v.get("vanilla") or {}).get("server_args"),
                                  "mtp": (v.get("mtp") or {}).get("server_args")}
            rec["settings"] = v.get("settings")
            reqs = v.get("requests") or []
            rec["per_prompt"] = {f"{vw['endpoint']}/{vw['mode']}": per_prompt(reqs, vw["endpoint"], vw["mode"])
                                 for vw in rec["views"]}
            rec["status"] = "ok"
            rec["seconds"] = round(now() - t, 2)
            write_json(path, rec)
            self.status[arm.id] = {"status": "ok", "seconds": rec["seconds"]}
            main = rec["views"][0] if rec["views"] else {}
            self.log(f"{arm.id}: acceptance {fmt_pct(main.get('acceptance'))}, speedup {fmt_x(main.get('speedup'))}"
                     f" ({rec['seconds']:.1f} s)")
        except BudgetExceeded as e:
            self.status[arm.id] = {"status": "not run (budget)", "detail": str(e)}
            self.log(f"{arm.id}: not run: {e}")
        except (StepFailed, OSError, ValueError, KeyError) as e:
            self.status[arm.id] = {"status": "failed", "error": str(e)[-2000:]}
            self.log(f"{arm.id}: FAILED: {e}")

    def run(self, arms: list[Arm]) -> None:
        self.prepare_inputs()
        for arm in arms:
            if self.left() < 5:
                self.status[arm.id] = {"status": "not run (budget)"}
                continue
            self.run_arm(arm)


def write_text_sample(path: Path, convs: list[dict[str, Any]], max_chars: int) -> None:
    """The conversations' text (turns separated by blank lines, no control tokens: llama-imatrix and
    llama-perplexity tokenize plain text), every n-th conversation so that all modules are sampled,
    up to ``max_chars``."""
    total = sum(sum(len(m[1]) for m in c["messages"]) for c in convs)
    step = max(1, round(total / max_chars)) if max_chars else 1
    parts, n = [], 0
    for c in convs[::step]:
        text = "\n\n".join(m[1] for m in c["messages"])
        parts.append(text)
        n += len(text) + 2
        if max_chars and n >= max_chars:
            break
    path.write_text("\n\n".join(parts) + "\n")


def write_suite(path: Path, convs: list[dict[str, Any]], n: int) -> None:
    """``n`` held-out questions (each conversation's first user turn, every k-th conversation) as a
    verify suite; category = the kind of question."""
    step = max(1, len(convs) // max(1, n))
    rows = []
    for c in convs[::step][:n]:
        q = next((m[1] for m in c["messages"] if m[0] == "user"), None)
        if not q:
            continue
        cat = "source" if q.startswith("Show me") else "module" if q.endswith("for?") else "doc"
        rows.append({"id": f"heldout-{len(rows):03d}", "category": cat,
                     "messages": [{"role": "user", "content": q}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# ----------------------------------------------------------------------------- tables


def fmt_pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def fmt_x(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}x"


def fmt_ci(ci: Any, scale: float = 1.0, digits: int = 1, suffix: str = "") -> str:
    if not ci or None in ci:
        return ""
    return f" [{ci[0] * scale:.{digits}f}, {ci[1] * scale:.{digits}f}{suffix}]"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, s in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= s:
            return f"{n / s:.2f} {unit}"
    return f"{n} B"


def fmt_kld(k: dict[str, Any] | None) -> str:
    if not k or k.get("kld_mean") is None:
        return "-"
    err = f" ± {k['kld_mean_err']:.4f}" if k.get("kld_mean_err") is not None else ""
    return f"{k['kld_mean']:.4f}{err}"


def fmt_paired(p: dict[str, Any] | None) -> tuple[str, str]:
    if not p or not p.get("n_prompts"):
        return "-", "-"
    d = p.get("acceptance_diff")
    acc = "-" if d is None else f"{100 * d:+.1f} pt{fmt_ci(p.get('acceptance_diff_ci95'), 100, 1)}"
    r = p.get("speedup_ratio")
    sp = "-" if r is None else f"{r:.3f}x{fmt_ci(p.get('speedup_ratio_ci95'), 1, 3)}"
    return acc, sp


def head_types_text(info: dict[str, Any] | None) -> str:
    t = (info or {}).get("head_types") or {}
    t = {k: v for k, v in t.items() if k != "F32"}
    if not t:
        return "-"
    return ", ".join(f"{k}" + (f" x{v}" if v else "") for k, v in sorted(t.items(), key=lambda kv: -(kv[1] or 0)))


def trunk_types_text(info: dict[str, Any] | None) -> str:
    t = (info or {}).get("trunk_types") or {}
    total = sum(t.values())
    if not total:
        return "-"
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in t.items() if v / total >= 0.01)


def load_arms(out: Path) -> dict[str, dict[str, Any]]:
    arms = {}
    for p in sorted((out / "arms").glob("*.json")):
        d = read_json(p)
        if d:
            arms[f"{d['part']}--{d['arm']}"] = d
    return arms


def add_pairs(arms: dict[str, dict[str, Any]]) -> None:
    for d in arms.values():
        if d.get("status") != "ok":
            continue
        d["paired"] = {}
        views = d.get("per_prompt") or {}
        if d["part"] == "template":  # raw (and other modes) against chat/default
            base = next(iter(views), None)
            for name, pp in views.items():
                if name != base and base:
                    d["paired"][name] = {"vs": base, **paired(views[base], pp)}
            continue
        ref = arms.get(f"{d['part']}--{d.get('ref')}") if d.get("ref") else None
        if not ref or ref.get("status") != "ok":
            continue
        for name, pp in views.items():
            rp = (ref.get("per_prompt") or {}).get(name)
            if rp is not None:
                d["paired"][name] = {"vs": d["ref"], **paired(rp, pp)}


def main_view(d: dict[str, Any]) -> dict[str, Any]:
    return (d.get("views") or [{}])[0]


def row_numbers(d: dict[str, Any], view: str | None = None) -> list[str]:
    """acceptance (CI) | paired Δ | fair speedup (CI) | paired ratio | mean acc. len | identical"""
    if d.get("status") == "refused":
        return ["refused", "-", "-", "-", "-", "-"]
    vw = main_view(d) if view is None else next((v for v in d.get("views") or []
                                                  if f"{v['endpoint']}/{v['mode']}" == view), {})
    name = view or (f"{vw.get('endpoint')}/{vw.get('mode')}" if vw else None)
    pa, ps = fmt_paired((d.get("paired") or {}).get(name))
    ident = vw.get("identical_output_fraction")
    return [fmt_pct(vw.get("acceptance")) + fmt_ci(vw.get("acceptance_ci95"), 100, 1, "%"), pa,
            fmt_x(vw.get("speedup")) + fmt_ci(vw.get("speedup_ci95"), 1, 3), ps,
            "-" if vw.get("mean_acceptance_length") is None else f"{vw['mean_acceptance_length']:.2f}",
            "-" if ident is None else f"{100 * ident:.0f}%"]


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


NUM_HEAD = ["acceptance (95% CI)", "Δ acceptance vs ref (paired, 95% CI)", "fair speedup (95% CI)",
            "speedup ratio vs ref (paired, 95% CI)", "mean acc. length", "identical"]


def tables(out: Path, arms_plan: list[Arm], status: dict[str, Any], meta: dict[str, Any]) -> str:
    arms = load_arms(out)
    add_pairs(arms)
    md = [f"# Learned-head study: {meta.get('title', '')}".rstrip(), ""]
    s = meta.get("settings") or {}
    m = meta.get("model") or {}
    md.append(f"Model `{m.get('path')}` (sha256 `{str(m.get('sha256'))[:16]}…`, {fmt_bytes(m.get('size_bytes'))}, "
              f"{m.get('n_params') or '?'} parameters, MTP block {m.get('mtp_blocks')}); untrained head "
              f"`{m.get('initial_head')}`.")
    hw = next((d.get("hardware") for d in arms.values() if d.get("hardware")), None) or {}
    md.append(f"Suite `{s.get('suite')}`, {s.get('limit') or 'all'} prompts x seeds {s.get('seeds')} x "
              f"{s.get('max_tokens')} tokens, k = {s.get('draft_n_max')}, -ngl {s.get('gpu_layers')}, "
              f"threads {s.get('threads')}; hardware: {hw.get('gpu') or hw.get('cpu')} ({hw.get('backend')}). "
              f"Calibration `{s.get('calib')}` ({s.get('imatrix_chunks')} chunks), KLD text "
              f"`{s.get('eval_corpus')}` ({s.get('eval_chunks')} chunks of 512).")
    md.append("Acceptance and fair speedup: verify's 95% bootstrap CIs by prompt (seeds pooled). Δ / ratio: "
              "this row against the reference row on the same prompts, 95% percentile bootstrap by prompt. "
              "KLD: `ggufmtp eval` against the BF16 model (trunk logits; rows with the same trunk share one "
              "measurement).")
    md.append("")

    plan = {a_.id: a_ for a_ in arms_plan}

    def arm(part: str, key: str) -> dict[str, Any]:
        d = arms.get(f"{part}--{key}")
        p = plan.get(f"{part}--{key}")
        if d:
            return {**d, "label": p.label} if p else d  # the plan's label: the same row text in every run
        return {"status": (status.get(f"{part}--{key}") or {}).get("status", "not run"),
                "label": p.label if p else {}}

    def missing(d: dict[str, Any]) -> bool:
        return d.get("status") not in ("ok", "refused")

    plan_keys = {}
    for a_ in arms_plan:
        plan_keys.setdefault(a_.part, []).append(a_.key)

    if "head" in plan_keys:
        md += ["## Head precision (trunk fixed at Q4_K_M with the MTP imatrix; ref = BF16 head)", ""]
        rows = []
        for key in plan_keys["head"]:
            d = arm("head", key)
            lab = d.get("label") or next(a_.label for a_ in arms_plan if a_.part == "head" and a_.key == key)
            info = d.get("artifact") or {}
            if missing(d):
                rows.append([lab.get("head"), lab.get("trunk"), "-", "-", "-", d["status"], "", "", "", "", "", "-"])
                continue
            rows.append([lab.get("head"), lab.get("trunk"), head_types_text(info), fmt_bytes(info.get("head_bytes")),
                         fmt_bytes(info.get("size_bytes")), *row_numbers(d), fmt_kld(d.get("kld"))])
        md += [md_table(["head", "trunk", "head tensor types", "head bytes", "file", *NUM_HEAD, "KLD vs BF16"], rows),
               ""]
        md.append("The head drafts through the trunk's `output.weight` (shared lm_head), which stays at the trunk "
                  "recipe's type in every row.")
        md.append("")

    if "imatrix" in plan_keys:
        md += ["## The MTP-head imatrix against a trunk-only imatrix (trunk Q4_K_M; ref = same head type with "
               "the MTP imatrix)", ""]
        rows = []
        for key in plan_keys["imatrix"]:
            d = arm("imatrix", key)
            lab = d.get("label") or next(a_.label for a_ in arms_plan if a_.part == "imatrix" and a_.key == key)
            info = d.get("artifact") or {}
            what = lab.get("what", "")
            if d.get("status") == "refused":
                what = "refused: " + short_error(d.get("error", ""))
            if missing(d):
                rows.append([lab.get("head"), lab.get("imatrix"), what, "-", "-", "-", d["status"], "", "", "", "", "",
                             "-"])
                continue
            rows.append([lab.get("head"), lab.get("imatrix"), what, head_types_text(info),
                         fmt_bytes(info.get("head_bytes")), fmt_bytes(info.get("size_bytes")), *row_numbers(d),
                         fmt_kld(d.get("kld"))])
        md += [md_table(["head type", "imatrix", "what llama.cpp / ggufmtp did", "head tensor types", "head bytes",
                         "file", *NUM_HEAD, "KLD vs BF16"], rows), ""]
        same = trunk_identity(arms, "imatrix")
        if same:
            md += [same, ""]

    if "trunk" in plan_keys:
        md += ["## Trunk precision (head fixed at Q8_0, MTP imatrix; ref = Q8_0 trunk)", ""]
        rows = []
        for key in plan_keys["trunk"]:
            d = arm("trunk", key)
            lab = d.get("label") or {"trunk": key}
            info = d.get("artifact") or {}
            if missing(d):
                rows.append([lab.get("trunk"), "-", "-", "-", "-", "-", "-", d["status"], "", "", "", "", ""])
                continue
            k = d.get("kld") or {}
            rows.append([lab.get("trunk"), trunk_types_text(info), fmt_bytes(info.get("size_bytes")),
                         "-" if info.get("bpw") is None else f"{info['bpw']:.2f}", fmt_kld(k),
                         "-" if k.get("same_top_p") is None else fmt_pct(k["same_top_p"], 2),
                         "-" if k.get("ln_ppl_ratio") is None else f"{k['ln_ppl_ratio']:+.4f}", *row_numbers(d)])
        md += [md_table(["trunk", "trunk tensor types (share of trunk bytes)", "size", "bpw", "KLD vs BF16",
                         "same top p", "ln PPL ratio", *NUM_HEAD], rows), ""]

    settings_note = None
    empty_raw: list[str] = []
    for part, title in (("window", "Draft window k (ref = the study's k)"),
                        ("template", "Chat template against raw /completion; thinking on and off"),
                        ("kv", "KV-cache types: the target's and the draft's own, across context depths "
                               "(ref = f16/f16 at the same depth)")):
        if part not in plan_keys:
            continue
        md += [f"## {title}", ""]
        rows = []
        for key in plan_keys[part]:
            d = arm(part, key)
            lab = d.get("label") or {}
            if settings_note is None and d.get("artifact"):
                info = d["artifact"]
                settings_note = (f"Model for the window, template and KV tables: `{info.get('name')}` "
                                 f"({fmt_bytes(info.get('size_bytes'))}), KLD vs BF16 {fmt_kld(d.get('kld'))}.")
            if part == "window":
                vw = main_view(d) if not missing(d) else {}
                pos = vw.get("acceptance_by_position") or []
                rows.append([str(lab.get("k", key)), *(row_numbers(d) if not missing(d) else [d["status"]] + [""] * 5),
                             " · ".join(f"{100 * p:.0f}%" for p in pos) if pos else "-",
                             fmt_tps(vw.get("vanilla_tokens_per_second")), fmt_tps(vw.get("mtp_tokens_per_second"))])
            elif part == "template":
                suite = lab.get("suite", "?")
                if missing(d):
                    rows.append([suite, "chat + raw", "-", "-", d["status"], "", "", "", "", ""])
                    continue
                for vw in d.get("views") or []:
                    name = f"{vw['endpoint']}/{vw['mode']}"
                    endpoint = "/v1/chat/completions (template)" if vw["endpoint"] == "chat" else "/completion (raw)"
                    n = mean_reply_tokens((d.get("per_prompt") or {}).get(name))
                    nums = row_numbers(d, name)
                    if n is not None and n <= 2:
                        nums[2:4] = ["no decoding to time", "-"]
                        empty_raw.append(f"{name} on {suite}")
                    rows.append([suite, endpoint, vw["mode"], "-" if n is None else f"{n:.1f}", *nums])
            else:
                vw = main_view(d) if not missing(d) else {}
                rows.append([lab.get("kv", "?"), lab.get("draft_kv", "?"), str(lab.get("depth", "?")),
                             *(row_numbers(d) if not missing(d) else [d["status"]] + [""] * 5),
                             fmt_tps(vw.get("vanilla_tokens_per_second")), fmt_tps(vw.get("mtp_tokens_per_second"))])
        if part == "window":
            md.append(md_table(["k", *NUM_HEAD, "acceptance by position", "vanilla tok/s", "MTP tok/s"], rows))
        elif part == "template":
            md.append(md_table(["suite", "endpoint", "mode", "mean reply tokens (MTP arm)", *NUM_HEAD], rows))
            if empty_raw:
                md += ["", f"{', '.join(empty_raw)}: the replies end at once (the model's first token is "
                           "end-of-turn): a model trained on ChatML turns only has no continuation for a bare "
                           "prompt, so there are no drafts and no decoding to time (verify's speedup for these "
                           "is 1 token / 1 token)."]
            d = arm("template", "chat-raw")
            modes = d.get("thinking_modes")
            if modes is not None and len(modes) <= 1:
                md += ["", "Thinking on/off: **not measurable on this model**: its chat template does not read "
                           "`enable_thinking` (verify found one mode, "
                           f"{modes}; template sha256 `{str(d.get('chat_template_sha256'))[:16]}…`), so llama-server "
                           "renders the same prompt either way."]
        else:
            md.append(md_table(["KV (target)", "KV (draft, -ctkd/-ctvd)", "depth", *NUM_HEAD, "vanilla tok/s",
                                "MTP tok/s"], rows))
        md.append("")
    if settings_note:
        md += [settings_note, ""]
    md += ["## Runs", ""]
    counts: dict[str, int] = {}
    for a_ in arms_plan:
        st = (arms.get(a_.id) or {}).get("status") or (status.get(a_.id) or {}).get("status", "not run")
        counts[st] = counts.get(st, 0) + 1
    md.append(", ".join(f"{v} {k}" for k, v in sorted(counts.items())) +
              f"; study time {meta.get('seconds', 0):.0f} s" + (f" of a {meta['budget']:.0f} s budget" if meta.get("budget") else ""))
    failed = [(k, v) for k, v in status.items() if v.get("status") == "failed"]
    for k, v in failed:
        md.append(f"- `{k}` failed: {short_error(v.get('error', ''), 400)}")
    return "\n".join(md) + "\n"


def mean_reply_tokens(pp: dict[str, list[float]] | None) -> float | None:
    if not pp:
        return None
    n = sum(r[6] for r in pp.values() if len(r) > 6)
    return sum(r[2] for r in pp.values()) / n if n else None


def fmt_tps(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def short_error(e: str, n: int = 160) -> str:
    e = e.replace("|", "/").replace("\n", " ")
    m = re.search(r"(\d+ tensor\(s\) planned as a type that needs an imatrix[^:]*)", e)
    if m:
        return m.group(1)[:n]
    return e[-n:]


def trunk_identity(arms: dict[str, dict[str, Any]], part: str) -> str | None:
    digests = {d["arm"]: (d.get("artifact") or {}).get("trunk_digest") for d in arms.values()
               if d["part"] == part and d.get("status") == "ok"}
    vals = {v for v in digests.values() if v}
    if not vals:
        return None
    if len(vals) == 1:
        return (f"Trunk tensors byte-identical in all {len(digests)} rows (sha256 of every non-MTP tensor): the "
                f"MTP imatrix's trunk statistics are llama-imatrix's, only the head differs.")
    return "Trunks differ between rows: " + ", ".join(f"{k} {str(v)[:12]}" for k, v in sorted(digests.items()))


def summary_json(out: Path, arms_plan: list[Arm], status: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    arms = load_arms(out)
    add_pairs(arms)
    parts: dict[str, list[dict[str, Any]]] = {}
    for a_ in arms_plan:
        d = arms.get(a_.id)
        row = {"arm": a_.key, "label": a_.label, "ref": a_.ref,
               "status": (d or {}).get("status") or (status.get(a_.id) or {}).get("status", "not run")}
        if d:
            for k in ("error", "kld", "verdict", "views", "paired", "thinking_modes", "verify_json", "seconds"):
                if d.get(k) is not None:
                    row[k] = d[k]
            info = d.get("artifact") or {}
            row["artifact"] = {k: info.get(k) for k in ("name", "size_bytes", "bpw", "head_bytes", "head_types",
                                                       "eh_proj", "trunk_digest", "sha256")}
        parts.setdefault(a_.part, []).append(row)
    return {**meta, "parts": parts, "status": status}


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="the trained model's BF16 GGUF (or builtin:NAME)")
    ap.add_argument("--initial-head", help="the same trunk with the untrained head (BF16 GGUF or builtin:NAME)")
    ap.add_argument("--out", type=Path, required=True, help="results folder")
    ap.add_argument("--work", type=Path, help="models and imatrices (default OUT/work)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, run in this order: {','.join(PARTS)}")
    ap.add_argument("--corpus", type=Path, help="the training corpus JSONL (calibration, KLD text, heldout suite)")
    ap.add_argument("--calib", help="calibration text for imatrix (default: --corpus's train split, else builtin:calib-v1)")
    ap.add_argument("--eval-corpus", help="KLD text (default: --corpus's held-out split, else builtin:calib-v1)")
    ap.add_argument("--calib-chars", type=int, default=400_000)
    ap.add_argument("--eval-chars", type=int, default=400_000)
    ap.add_argument("--suite", default="chat-v1", help="verify suite: a name, a JSONL file, or heldout:N")
    ap.add_argument("--template-suites", default="main",
                    help="the template part's suites (main = --suite), e.g. main,chat-v1: a model trained on chat "
                         "turns may have no raw continuation for one kind of prompt")
    ap.add_argument("--limit", type=int, help="verify on the first N prompts")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-n-max", type=int, default=3, help="k of every row outside the window part")
    ap.add_argument("-ngl", "--gpu-layers", default=None)
    ap.add_argument("-t", "--threads", type=int, help="llama-server / llama-imatrix / llama-perplexity threads")
    ap.add_argument("--quant-threads", type=int, default=0, help="quantization threads (0: all cores)")
    ap.add_argument("--server-arg", action="append", default=[], help="verify --server-arg (both arms), repeatable")
    ap.add_argument("--imatrix-chunks", type=int, default=64)
    ap.add_argument("--eval-chunks", type=int, default=32)
    ap.add_argument("--head-types", default=",".join(HEAD_TYPES))
    ap.add_argument("--imatrix-types", default=",".join(IMATRIX_TYPES))
    ap.add_argument("--trunk-types", default=",".join(TRUNK_TYPES))
    ap.add_argument("--fallbacks", default=",".join(FALLBACKS), help=f"for refused IQ heads: {','.join(FALLBACKS)}")
    ap.add_argument("--windows", default="1,2,3,4,5,6")
    ap.add_argument("--kv-types", default="f16,q8_0,q4_0")
    ap.add_argument("--draft-kv-types", default="f16,q8_0,q4_0")
    ap.add_argument("--kv-depths", default="0,768")
    ap.add_argument("--settings-model", choices=("ref", "bf16"), default="ref",
                    help="the model of the window/template/kv parts: the Q4_K_M + Q8_0-head artifact, or BF16")
    ap.add_argument("--budget", type=float, help="seconds: start nothing that cannot finish, stop at the deadline")
    ap.add_argument("--grace", type=float, default=15.0, help="seconds a running command may pass the deadline")
    ap.add_argument("--dry-run", action="store_true", help="print the arms and their recipes, run nothing")
    ap.add_argument("--tables-only", action="store_true", help="rewrite study.json/study.md from the arms")
    a = ap.parse_args(argv)
    a.parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    bad = [p for p in a.parts if p not in PARTS]
    if bad:
        ap.error(f"--parts: unknown {bad}; known {PARTS}")
    a.head_types = [t.strip().upper() for t in a.head_types.split(",") if t.strip()]
    a.imatrix_types = [t.strip().upper() for t in a.imatrix_types.split(",") if t.strip()]
    a.trunk_types = [t.strip().upper() for t in a.trunk_types.split(",") if t.strip()]
    a.fallbacks = [f.strip() for f in a.fallbacks.split(",") if f.strip()]
    if any(f not in FALLBACKS for f in a.fallbacks):
        ap.error(f"--fallbacks: known {list(FALLBACKS)}")
    a.template_suites = [t.strip() for t in a.template_suites.split(",") if t.strip()]
    a.windows = [int(k) for k in a.windows.split(",") if k.strip()]
    a.kv_types = [t.strip() for t in a.kv_types.split(",") if t.strip()]
    a.draft_kv_types = [t.strip() for t in a.draft_kv_types.split(",") if t.strip()]
    a.kv_depths = [int(d) for d in a.kv_depths.split(",") if d.strip()]
    if "f16" not in a.kv_types or "f16" not in a.draft_kv_types:
        ap.error("--kv-types and --draft-kv-types must include f16 (the reference cell)")
    if "window" in a.parts and a.draft_n_max not in a.windows:
        a.windows.append(a.draft_n_max)
    return a


def meta_of(study: Study | None, a: argparse.Namespace, seconds: float) -> dict[str, Any]:
    s = {k: getattr(a, k) for k in ("parts", "limit", "seeds", "max_tokens", "draft_n_max", "gpu_layers", "threads",
                                      "quant_threads", "server_arg", "imatrix_chunks", "eval_chunks", "head_types",
                                      "imatrix_types", "trunk_types", "fallbacks", "windows", "kv_types",
                                      "draft_kv_types", "kv_depths", "settings_model", "template_suites")}
    prev = read_json(a.out / "study.json") or {}
    if study is not None and study.inputs:
        s.update(suite=study.suite, calib=study.calib, eval_corpus=study.eval_corpus)
        inputs, model = study.inputs, study.model_info
    else:
        inputs, model = prev.get("inputs") or {}, prev.get("model") or {}
        s.update({k: (prev.get("settings") or {}).get(k) for k in ("suite", "calib", "eval_corpus")})
    return {"kind": "learned-head study (issue #29)", "title": Path(str(model.get("path") or a.model)).name,
            "model": model, "inputs": inputs, "settings": s, "seconds": round(seconds, 1), "budget": a.budget,
            "argv": sys.argv, "facts": {
                "needs_imatrix_types": sorted(NEEDS_IMATRIX),
                "without_statistics": "llama.cpp 0c1e570 src/llama-quant.cpp: tensor_requires_imatrix makes IQ1_S, "
                "IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS (and Q2_K in a Q2_K_S file) throw 'Missing importance "
                "matrix for tensor ... in a very low-bit quantization' when the imatrix has no entry for the "
                "tensor (and 'this quantization requires an imatrix!' up front without any imatrix); ggufmtp's "
                "plan refuses the same tensors before any work. Q4_K/Q5_K/Q6_K without statistics use the "
                "reference rounding (quantize_row_q*_K_ref), IQ4_XS weights each value by its square, Q8_0 and "
                "Q4_0 ignore the imatrix. A tensor whose row length is not a multiple of 256 falls back before "
                "this check (IQ* -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), and IQ4_NL needs no "
                "statistics.",
                "fallbacks": {k: v[1] for k, v in FALLBACKS.items()}}}


def write_outputs(study: Study | None, a: argparse.Namespace, arms: list[Arm], status: dict[str, Any],
                  seconds: float) -> None:
    meta = meta_of(study, a, seconds)
    write_json(a.out / "study.json", summary_json(a.out, arms, status, meta))
    (a.out / "study.md").write_text(tables(a.out, arms, status, meta))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    arms = build_arms(a)
    if a.dry_run:
        seen = set()
        for arm in arms:
            art = arm.artifact
            print(f"{arm.id:<40} {json.dumps(arm.label)}  verify {' '.join(arm.verify) or '-'}"
                  f"{'  (expects a refusal)' if arm.expect_refusal else ''}{'  ref ' + arm.ref if arm.ref else ''}")
            if art.quantized and art.name not in seen:
                seen.add(art.name)
                print(f"    quantize {art.source}: ftype {art.ftype}, [mtp] {dict(art.head)}, imatrix {art.imatrix}")
            elif not art.quantized:
                print(f"    {art.source} BF16 GGUF as it is")
        print(f"{len(arms)} arms, {len(seen)} distinct quantizations")
        return 0
    if a.tables_only:
        status = (read_json(a.out / "study.json") or {}).get("status") or {}
        prev = read_json(a.out / "study.json") or {}
        write_outputs(None, a, arms, status, prev.get("seconds") or 0.0)
        print((a.out / "study.md").read_text())
        return 0
    study = Study(a)
    study.log(f"study: {len(arms)} arms, parts {','.join(a.parts)}, budget {a.budget or 'none'} s")
    try:
        study.run(arms)
    except BudgetExceeded as e:
        study.log(f"stopped: {e}")
    except KeyboardInterrupt:
        study.log("interrupted")
    finally:
        write_outputs(study, a, arms, study.status, now() - study.t0)
        study.log(f"tables: {a.out / 'study.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
