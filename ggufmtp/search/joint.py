"""``ggufmtp tune-joint``: one search of the fastest verified configuration of an MTP artifact (#52):
the MTP head's tensor type x the draft window and limits x the server options that matter on a GPU.

Two stages, because the head's type changes the cost of a draft, not which tokens it proposes, when
the head decides by wide margins (a synthetic head does by design): acceptance stays put while the
type changes, so the type is judged once at a fixed window and only the types that keep the head
go on into the joint search.

1. **Heads** (:mod:`ggufmtp.search.joint_heads`): each candidate type is the *source's* head re-typed: the source's
   MTP block cut as an MTP-only sidecar (:func:`~ggufmtp.measure.verify.reference.reference_head`,
   cached), quantized by the project's one quantization path with the artifact's recipe whose
   ``[mtp]`` roles all say that type (:func:`~ggufmtp.quality.head_sweep.head_recipe`), cached by
   content. Each head, and the artifact's own, drafts on the artifact's trunk
   (``-md``) in one :func:`~ggufmtp.measure.verify.run.verify` against the source (``reference``):
   verify's head finding and its lossless finding decide whether the head stays (``preserved`` and
   lossless), and its fair speedup at the fixed window is the head type's speed
   (``benchmarks/head_type_speed.py`` writes these rows as a table; ``--heads-from`` reads them back).
2. **Joint** (:func:`joint_search`): :func:`~ggufmtp.measure.tune.run.tune`'s successive halving over
   the kept heads x tune's own space (window, n-min, p-min, ``-bs``, drafter sampling, CUDA graph
   optimisation: :func:`~ggufmtp.measure.tune.search.candidate_space`) x the server options
   (:class:`OptionSpace`: flash attention, KV types, batch sizes, threads, option sets). Every
   option is non-speculative, so each candidate's fair vanilla gets it too; a candidate whose
   vanilla then writes other text than the default vanilla (an option that changes the output
   itself, e.g. a lossy KV type) is dropped, as is one whose MTP output differs from its vanilla.

The result is tune's JSON, its ``kind`` ``ggufmtp tune-joint`` (so ``verify --tuned-from``,
``profiles --tuned-from``, a receipt's ``verification.tuned`` and the card read it as they read
tune's) with a ``joint`` section: the
heads' rows and the recipe (the artifact's recipe with the chosen head type as its ``[mtp]``
roles: quantize the source with it, then verify with ``--tuned-from``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TuneError
from ..jsontypes import JsonObject
from ..measure.core.options import ServerOptions, TuneConfig
from ..measure.core.suite import as_suite
from ..measure.tune.bench import prepare
from ..measure.tune.options import TuneOptions
from ..measure.tune.run import TuneResult, tune
from ..measure.tune.search import (
    candidate_space,
    final_rung_units,
    fit_schedule,
    order_candidates,
    rank_value,
    schedule_cost,
    search_anchors,
)
from ..measure.verify.kvdepth import allowed_cache_types, check_cache_type
from ..provenance.tuned import TUNE_JOINT_KIND
from ..quality.head_sweep import head_recipe
from ..quant.recipe import Recipe, normalize_type
from ..runtime.hardware import probe_hardware
from ..runtime.server import binary_flags
from . import joint_heads
from .joint_heads import OWN_HEAD, OWN_SIDECAR, HeadSettings, HeadStage

__all__ = ["HEAD_TYPES", "OWN_HEAD", "OptionSpace", "JointOptions", "JointPlan", "JointResult", "joint_plan",
           "joint_search", "all_heads"]

#: the head types searched by default (#52): the float types and the 8/6/4-bit ones the recipes use
HEAD_TYPES = ("F16", "BF16", "Q8_0", "Q6_K", "Q4_K")


@dataclass(frozen=True)
class OptionSpace:
    """The server options searched, every value given to both arms (None: llama-server's default).
    ``batches``: (``-b``, ``-ub``) pairs; ``option_sets``: more flag sets, each one more value of a
    dimension of its own (e.g. ``("-ctk", "q4_0", "-ctv", "q4_0")``). A quantized KV type is paired
    only with flash attention not off (llama.cpp refuses a quantized V cache without it)."""

    flash_attn: Sequence[bool | None] = (None,)
    cache_types: Sequence[str | None] = (None,)
    batches: Sequence[tuple[int, int] | None] = (None,)
    threads: Sequence[int | None] = (None,)
    option_sets: Sequence[tuple[str, ...]] = ()

    @classmethod
    def gpu(cls) -> OptionSpace:
        """What matters on a GPU by default: flash attention auto/off, KV f16/q8_0, batch default or 2048/2048."""
        return cls(flash_attn=(None, False), cache_types=(None, "q8_0"), batches=(None, (2048, 2048)))

    def configs(self, base: TuneConfig) -> list[TuneConfig]:
        """``base`` under every combination of the options (the valid ones)."""
        sets: list[tuple[str, ...]] = [(), *self.option_sets]
        out = []
        for fa, kv, b, t, args in itertools.product(self.flash_attn, self.cache_types, self.batches, self.threads, sets):
            if kv not in (None, "f16", "bf16", "f32") and fa is False:
                continue
            out.append(dataclasses.replace(base, flash_attn=fa, cache_type=kv, batch=b[0] if b else None,
                                           ubatch=b[1] if b else None, threads=t if t is not None else base.threads,
                                           server_args=args))
        return out

    def to_dict(self) -> JsonObject:
        return {"flash_attn": list(self.flash_attn), "cache_types": list(self.cache_types),
                "batches": [list(b) if b else None for b in self.batches], "threads": list(self.threads),
                "option_sets": [list(s) for s in self.option_sets]}


@dataclass(frozen=True)
class JointOptions:
    """What the joint search measures. ``head_types``: the candidate types (plus the artifact's own
    head unless ``own_head`` is False); ``head_k``: the window of the heads stage (default: the
    recipe's ``[verify] draft_n_max``, else 4); ``head_limit``/``head_seeds``: its prompts and
    seeds; ``joint_heads``: how many kept heads (the fastest at the heads stage's window) go on into
    the joint stage; ``options``: the server options (:class:`OptionSpace`); ``tune``: the joint stage's
    budget, requests, schedule and servers (its ``search.candidates``/``heads`` are this module's)."""

    head_types: Sequence[str] = HEAD_TYPES
    own_head: bool = True
    head_k: int | None = None
    head_limit: int | None = 16
    head_seeds: Sequence[int] = (42,)
    joint_heads: int = 2
    options: OptionSpace = field(default_factory=OptionSpace)
    tune: TuneOptions = field(default_factory=TuneOptions)

    def __post_init__(self) -> None:
        object.__setattr__(self, "head_types",
                           tuple(dict.fromkeys(normalize_type(t, "--head-types") for t in self.head_types)))
        if self.joint_heads < 1:
            raise TuneError(f"joint_heads {self.joint_heads}: at least 1")
        if not self.head_types and not self.own_head:
            raise TuneError("head_types: none, and the artifact's own head left out: no head to search")

    @property
    def server(self) -> ServerOptions:
        return self.tune.server

    @property
    def heads(self) -> HeadSettings:
        """The heads stage's settings: the joint stage's requests, but its own prompts, seeds and window."""
        t = self.tune
        return HeadSettings(self.head_types, self.own_head, self.head_k, self.head_limit, self.head_seeds, t.suite,
                            t.max_tokens, t.server)


@dataclass(frozen=True)
class JointPlan:
    """The candidates of the joint stage in search order and what the search will spend."""

    heads: list[str]
    candidates: list[TuneConfig]
    head_requests: int  # MTP requests of the heads stage, per thinking mode of the template
    searched: int  # candidates the budget reaches (successive halving's first rung)
    rungs: list[tuple[int, int]]  # (configurations, cumulative units) per rung
    evaluations: int  # MTP requests of the joint stage, at most

    def to_dict(self) -> JsonObject:
        return {"heads": self.heads, "n_candidates": len(self.candidates), "searched": self.searched,
                "head_requests_per_mode": self.head_requests, "rungs": [list(r) for r in self.rungs],
                "evaluations": self.evaluations, "candidates": [c.key for c in self.candidates]}

    def text(self) -> str:
        L = [f"heads stage: {len(self.heads)} heads ({', '.join(self.heads)}), {self.head_requests} MTP requests "
             f"per thinking mode (each with its vanilla and, once, the source head's)",
             f"joint stage (the {len({c.head for c in self.candidates})} fastest kept heads x the rest; here the "
             f"first heads stand for them): {len(self.candidates)} candidates, the budget reaches the first {self.searched}; rungs "
             + ", ".join(f"{n} x {u} units" for n, u in self.rungs) + f"; at most {self.evaluations} evaluations"]
        return "\n".join(L + [f"  {c.key}" for c in self.candidates[:self.searched]])


def _space(model: Path, o: JointOptions, heads: Sequence[str], k0: int) -> list[TuneConfig]:
    """The joint candidates in search order: tune's space x the server options x ``heads`` (the
    fastest first). Anchors first: tune's (window ``k0`` as the default) up to the pivot (its best
    guess at ``k0``: on a GPU the defaults with ``-bs``) with the fastest head, and the windows next to
    ``k0``; the pivot with every other head, then with every option value; tune's other anchors (the
    rest of the window sweep); then tune's seeded round-robin over the windows. So even a small budget
    measures k0 +- 1, each head and each option once before it samples the rest: the window moved the
    speedup most (2026-11-29, H200:
    k=6 1.21x against k=4 1.40x on the 35B-A3B shape, every option within ~0.03x), and a budget of 48
    on the dense shape reached only k=4 when the windows came last."""
    setup = prepare(model, o.tune.suite, o.tune.limit, o.server.llama_cpp_bin)
    hw = probe_hardware(setup.binary, o.server.gpu_layers)
    cuda = any(d.upper().startswith("CUDA") for d in hw.server_devices)
    s = o.tune.search
    base, _ = candidate_space(o.tune.concurrency, hw.offloaded, binary_flags(setup.binary), s.n_max_values,
                              s.n_min_values, s.p_min_values, cuda)
    head_of = (lambda h: None if h == OWN_HEAD else h)  # noqa: E731 (a local one-liner)
    tuned = search_anchors(base, k0 if k0 in s.n_max_values else 3)
    pivot = next((a for a in tuned if a.backend_sampling), tuned[0] if tuned else base[0])
    first = head_of(heads[0])
    cut = tuned.index(pivot) + 1 if pivot in tuned else len(tuned)
    windows = [a for a in tuned[cut:] if abs(a.draft_n_max - pivot.draft_n_max) == 1]
    anchors = [dataclasses.replace(a, head=first) for a in tuned[:cut] + windows]
    anchors += [dataclasses.replace(pivot, head=head_of(h)) for h in heads[1:]]
    anchors += [dataclasses.replace(c, head=first) for c in o.options.configs(pivot)]
    anchors += [dataclasses.replace(a, head=first) for a in tuned[cut:]]
    every = [dataclasses.replace(c, head=head_of(h)) for b in base for c in o.options.configs(b) for h in heads]
    return order_candidates(every, s.order_seed, list(dict.fromkeys(anchors)))


def joint_plan(model: str | os.PathLike, options: JointOptions | None = None) -> JointPlan:
    """What the search will run (``--dry-run``): no model is served, no head is made. The joint
    stage's heads are not known before the heads stage: the first ``joint_heads`` stand for them."""
    o = options if options is not None else JointOptions()
    heads = all_heads(o)
    cands = _space(Path(model), o, [h for h in heads if h != OWN_SIDECAR][:o.joint_heads], o.head_k or 4)
    setup = prepare(Path(model), o.tune.suite, o.tune.limit, o.server.llama_cpp_bin)
    s, unit_cost, n_prompts = o.tune.search, len(o.tune.seeds) * o.tune.concurrency, len(setup.suite.prompts)
    final = final_rung_units(s.final_on_suite, len(cands), o.tune.budget, s.units0, s.eta, s.final_size, n_prompts,
                             unit_cost, math.ceil(n_prompts / o.tune.concurrency), [])  # as tune() sizes it
    n0, _, rungs = fit_schedule(len(cands), o.tune.budget, s.units0, s.eta, s.final_size, n_prompts, unit_cost, final)
    n_head = min(o.head_limit or len(setup.suite.prompts), len(setup.suite.prompts)) * len(o.head_seeds)
    return JointPlan(list(heads), cands, n_head * len(heads), n0, rungs, schedule_cost(rungs, unit_cost))


def all_heads(o: JointOptions) -> list[str]:
    return ([OWN_HEAD, OWN_SIDECAR] if o.own_head else []) + list(o.head_types)


@dataclass
class JointResult:
    """The heads stage, the joint stage's tune result, the recipe of the chosen head and notes."""

    heads: HeadStage
    tuned: TuneResult
    base_recipe: Recipe
    options: OptionSpace
    notes: list[str] = field(default_factory=list)

    @property
    def config(self) -> TuneConfig | None:
        """The configuration found: tune's recommendation, else its best measured one."""
        rec = self.tuned.recommendation
        return rec.best_config

    @property
    def recipe(self) -> Recipe:
        """The artifact's recipe with the chosen head's type as its ``[mtp]`` roles (unchanged for its own head)."""
        cfg = self.config
        return self.base_recipe if cfg is None or cfg.head is None else head_recipe(self.base_recipe, cfg.head)

    def to_dict(self) -> JsonObject:
        """tune's JSON (what ``--tuned-from`` reads) with the ``joint`` section."""
        d = self.tuned.to_dict()
        d["joint"] = {"heads_stage": self.heads.to_dict(), "options": self.options.to_dict(),
                      "head": self.config.head if self.config else None, "recipe": self.recipe.to_dict(),
                      "recipe_toml": self.recipe.to_toml(), "notes": list(self.notes)}
        return d

    def text(self) -> str:
        L = [f"{'head':<6} {'kept':<5} {'finding':<13} {'acceptance':>10} {'speedup':>9}  why",]
        for h in self.heads.rows:
            acc = f"{h.acceptance:.3f}" if h.acceptance is not None else "-"
            sp = f"{h.speedup:.3f}x" if h.speedup is not None else "-"
            L.append(f"{h.head:<6} {'yes' if h.kept else 'no':<5} {h.decision:<13} {acc:>10} {sp:>9}  {h.why or ''}")
        cfg = self.config
        head = (cfg.head or OWN_HEAD) if cfg else None
        L += ["", self.tuned.table(head), "", f"head: {head or '-'}; recipe {self.recipe.name}"]
        return "\n".join(L + [f"note: {n}" for n in self.notes])


def joint_search(model: str | os.PathLike, source: str | os.PathLike, recipe: Recipe | str,
                 options: JointOptions | None = None, heads: HeadStage | None = None, *,
                 progress: bool = False) -> JointResult:
    """Both stages (see the module docstring); ``heads``: the heads stage measured before (checked to
    be this model's, source's and recipe's) instead of measuring it; ``progress``: a line per head and
    tune's rung lines on stderr. TuneError when no head is kept."""
    o = options if options is not None else JointOptions()
    rec = recipe if isinstance(recipe, Recipe) else Recipe.load(recipe)
    model, source = Path(model), Path(source)
    if not source.is_file():
        raise TuneError(f"--source {source}: no such file (the BF16 {model.name} was quantized from)")
    _check_before_heads(o)
    if heads is None:
        heads = joint_heads.head_stage(model, source, rec, o.heads,
                                       (lambda m: print(m, file=sys.stderr, flush=True)) if progress else None)
    else:
        heads.check_for(model, source, rec, "--heads-from")
    kept, notes = _kept_heads(heads, o.joint_heads)
    cands = _space(model, o, kept, heads.k)
    files = {t: str(joint_heads.make_head(source, rec, t)) for t in kept if t != OWN_HEAD}  # cached by content
    res = tune(model, dataclasses.replace(o.tune, heads=files, search=dataclasses.replace(o.tune.search,
                                                                                          candidates=cands)),
               progress=progress)
    res.kind = TUNE_JOINT_KIND  # tune's search, but its result is the joint search's (its JSON, its receipt kind)
    best = res.recommendation.best_config
    if best is not None and best.head is not None:
        notes.append(f"the {best.head} head was measured as a sidecar (-md) cut from {source.name}: quantize "
                     f"{source.name} with the joint recipe (every [mtp] role at {best.head}) and serve that "
                     "artifact alone with the command's other flags (verify --tuned-from this JSON checks it)")
    return JointResult(heads, res, rec, o.options, notes)


def _check_before_heads(o: JointOptions) -> None:
    """The values every head's verify would refuse, refused once before the heads stage, in verify's
    words: the suite (not one "verify failed" per head, then "no head kept"), and a ``--kv-values``
    type this llama-server does not take (not dropped as a failed configuration after the search)."""
    as_suite(o.tune.suite)
    types = [t for t in o.options.cache_types if t is not None]
    if types:
        allowed = allowed_cache_types(o.server.llama_cpp_bin)
        for t in types:
            check_cache_type("--kv-values", t, allowed)


def _kept_heads(heads: HeadStage, n: int) -> tuple[list[str], list[str]]:
    """The ``n`` fastest kept heads at the heads stage's window (ties: the smaller head), and notes on the rest."""
    rows = heads.rows
    kept = [r.head for r in sorted((r for r in rows if r.kept), key=lambda r: (-rank_value(r.speedup), r.head_bytes))]
    if not kept:
        raise TuneError("no head kept: " + "; ".join(f"{r.head}: {r.why}" for r in rows))
    notes = [f"head {r.head} left out: {r.why}" for r in rows if not r.kept]
    if len(kept) > n:
        notes.append(f"heads {', '.join(kept[n:])} kept but slower at k={heads.k} than {', '.join(kept[:n])}: not "
                     f"searched jointly (joint_heads {n})")
    return kept[:n], notes
