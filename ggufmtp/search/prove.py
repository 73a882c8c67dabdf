"""Prove a searched recipe (issue #43): quantize it and the shipped recipe of the nearest size, and
measure both the same way.

Each arm (:class:`Arm`) is the quantized file's size, its KLD against the source on the held-out
corpus (:func:`ggufmtp.quality.eval.evaluate`, with each chunk's mean so the two arms pair by
chunk) and same-top-p. With ``acceptance``, the two heads are judged against each other in one
interleaved run: ``verify FOUND --reference SHIPPED``, the found file's MTP arm and the shipped
file's served in the same rotation with the same settings, paired by prompt and seed
(:mod:`ggufmtp.provenance.head`); the found file's speed where a GPU judges it. "Non-inferior" is
against the file it has to beat, not the BF16 source: a trunk of either recipe costs acceptance
against BF16 (benchmarks/README.md: 9-12 points for the 4-bit class on the trained model), and the
question the proof answers is whether the search's bytes drafted worse than the shipped recipe's.

The verdict (:func:`judge`), on the paired per-chunk KLD difference (found minus shipped) with a
percentile-bootstrap 95 % CI over chunks (:func:`ggufmtp.stats.bootstrap_sums`):

- ``beats``: the found file is no larger (within :data:`SIZE_SLACK`), its KLD is lower with the CI clear of zero, and its head
  is non-inferior to the shipped file's (the paired CI's lower bound above ``-margin``), or not measured
  (the reason says so);
- ``matches smaller``: the found file is smaller and its KLD no worse than the shipped one's plus
  ``kld_tolerance`` of it (the CI's upper bound), the head as above;
- ``does not beat``: anything else, with the reason.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..errors import SearchError
from ..measure.core.options import VerifyOptions
from ..measure.verify.run import verify
from ..quality.eval import evaluate
from ..quality.options import EvalOptions
from ..quant.plan import make_plan
from ..quant.quantize import quantize
from ..quant.recipe import Recipe, shipped_recipes
from ..stats import bootstrap_sums
from .allocate import DEFAULT_ACCEPTANCE_MARGIN

DEFAULT_KLD_TOLERANCE = 0.05  # "matches": the found KLD's CI reaches at most 5 % above the shipped one's
SIZE_SLACK = 0.001  # "no larger": within 0.1 % (the header's metadata differs by a few bytes between recipes)


class ProofVerdict(enum.Enum):
    BEATS = "beats"
    MATCHES_SMALLER = "matches smaller"
    DOES_NOT_BEAT = "does not beat"


@dataclasses.dataclass(frozen=True)
class Arm:
    """One recipe quantized and measured."""

    recipe: str
    n_bytes: int
    kld: float
    chunk_kld: tuple[float, ...]
    same_top_p: float | None = None
    acceptance: float | None = None  # its MTP head's, in the proof's one interleaved run
    tokens_per_second: float | None = None  # the MTP arm's, where speed was judged (a GPU)
    speedup: float | None = None


@dataclasses.dataclass(frozen=True)
class HeadTrial:
    """The found head's acceptance minus the shipped head's, paired (found = artifact, shipped =
    reference of one ``verify`` run), with its bootstrap 95 % CI (None: too few pairs)."""

    difference: float | None
    ci: tuple[float, float] | None
    n_prompts: int


@dataclasses.dataclass(frozen=True)
class ProofResult:
    """The found recipe against the shipped one: both arms, the paired KLD difference, the verdict."""

    found: Arm
    shipped: Arm
    kld_diff: float
    kld_diff_ci: tuple[float | None, float | None]
    verdict: ProofVerdict
    reason: str
    margin: float
    head: HeadTrial | None = None  # the found head against the shipped one; None: not measured

    def to_dict(self) -> dict[str, object]:
        return {"verdict": self.verdict.value, "reason": self.reason, "kld_diff": self.kld_diff,
                "kld_diff_ci95": list(self.kld_diff_ci), "margin": self.margin, **self.head_fields(),
                "found": dataclasses.asdict(self.found), "shipped": dataclasses.asdict(self.shipped)}

    def toml_table(self) -> dict[str, str | int | float | list[float] | None]:
        """What the recipe's ``[search.proof]`` table records (no path, no per-chunk lists)."""
        lo, hi = self.kld_diff_ci
        return {"verdict": self.verdict.value, "against": self.shipped.recipe, "reason": self.reason,
                "kld": self.found.kld, "shipped_kld": self.shipped.kld, "kld_diff": self.kld_diff,
                "kld_diff_ci95": [lo, hi] if lo is not None and hi is not None else None,
                "n_bytes": self.found.n_bytes, "shipped_n_bytes": self.shipped.n_bytes,
                "acceptance": self.found.acceptance, "shipped_acceptance": self.shipped.acceptance,
                **self.head_fields()}

    def head_fields(self) -> dict[str, float | list[float] | None]:
        """The head trial as both the JSON and the recipe's ``[search.proof]`` table record it."""
        h = self.head
        return {"acceptance_diff": h.difference if h else None,
                "acceptance_diff_ci95": list(h.ci) if h and h.ci else None}


@dataclasses.dataclass(frozen=True)
class ProveOptions:
    """How both arms are made and measured: the imatrix, the KLD corpus (``eval``), whether the head
    is judged against the reference (``acceptance``, with ``verify``'s settings) and the margins."""

    imatrix: str | Path | None = None
    eval: EvalOptions = dataclasses.field(default_factory=EvalOptions)
    acceptance: bool = True
    verify: VerifyOptions = dataclasses.field(default_factory=VerifyOptions)
    margin: float = DEFAULT_ACCEPTANCE_MARGIN
    kld_tolerance: float = DEFAULT_KLD_TOLERANCE
    workdir: str | os.PathLike | None = None  # where the two files are made (default: a temporary folder, removed)


def paired_kld_diff(found: Sequence[float], shipped: Sequence[float]) -> tuple[float, float | None, float | None]:
    """Mean of the per-chunk differences (found - shipped) and its bootstrap 95 % CI over chunks."""
    if not found or len(found) != len(shipped):
        raise SearchError(f"proof: the two arms' per-chunk KLDs do not pair ({len(found)} and {len(shipped)} chunks)")
    d = np.asarray(found, float) - np.asarray(shipped, float)
    est = bootstrap_sums(np.column_stack([d, np.ones_like(d)]), lambda s: s[..., 0] / s[..., 1])
    return float(d.mean()), est.lo, est.hi


def _head_problem(head: HeadTrial | None, margin: float) -> str | None:
    if head is None or head.ci is None or head.ci[0] > -margin:
        return None
    return (f"its head is not shown non-inferior to the shipped file's (paired acceptance difference CI lower "
            f"bound {head.ci[0] * 100:+.1f} pt, margin {margin * 100:.1f} pt)")


def judge(found: Arm, shipped: Arm, margin: float = DEFAULT_ACCEPTANCE_MARGIN,
          kld_tolerance: float = DEFAULT_KLD_TOLERANCE, head: HeadTrial | None = None) -> ProofResult:
    """The verdict on two measured arms and, when measured, their heads' paired trial (module doc)."""
    diff, lo, hi = paired_kld_diff(found.chunk_kld, shipped.chunk_kld)
    verdict, reason = ProofVerdict.DOES_NOT_BEAT, ""
    head_problem = _head_problem(head, margin)
    if head_problem:
        reason = head_problem
    elif found.n_bytes <= shipped.n_bytes * (1 + SIZE_SLACK) and hi is not None and hi < 0:
        verdict = ProofVerdict.BEATS
        reason = f"KLD lower by {-diff:.6f} (paired CI clear of zero), file no larger"
    elif found.n_bytes < shipped.n_bytes and hi is not None and hi <= kld_tolerance * shipped.kld:
        verdict = ProofVerdict.MATCHES_SMALLER
        reason = (f"{shipped.n_bytes - found.n_bytes} bytes smaller, KLD at most {kld_tolerance:.0%} of the "
                  f"shipped one's above it (paired CI)")
    elif hi is None:
        reason = "fewer than 2 chunks: the KLD difference has no confidence interval"
    elif found.n_bytes > shipped.n_bytes * (1 + SIZE_SLACK):
        reason = f"the found file is {found.n_bytes - shipped.n_bytes} bytes larger"
    else:
        reason = f"KLD difference {diff:+.6f}, CI [{lo:+.6f}, {hi:+.6f}] not clear of zero"
    if verdict is not ProofVerdict.DOES_NOT_BEAT:
        reason += ("; acceptance not measured" if head is None else "; head not shown non-inferior: too few pairs"
                   if head.ci is None else f"; head non-inferior to the shipped file's ({head_text(head)})")
    return ProofResult(found, shipped, diff, (lo, hi), verdict, reason, margin, head)


def head_text(head: HeadTrial) -> str:
    d = "n/a" if head.difference is None else f"{head.difference * 100:+.1f} pt"
    ci = "" if head.ci is None else f", CI [{head.ci[0] * 100:+.1f}, {head.ci[1] * 100:+.1f}]"
    return f"paired acceptance difference {d}{ci}, {head.n_prompts} prompts"


def group_bytes(model: Path, recipe: Recipe | str, imatrix: str | Path | None) -> int | None:
    """The quantized size of ``recipe``'s planned tensors (a libllama dry run); None when it does not plan."""
    plan = make_plan(model, recipe, imatrix)
    return None if plan.errors else sum(t.bytes for t in plan.tensors)


def nearest_shipped(model: Path, n_bytes: int, imatrix: str | Path | None) -> str:
    """The shipped recipe whose planned size is nearest ``n_bytes`` (the recipes that plan on this model)."""
    sizes = {name: b for name in shipped_recipes() if (b := group_bytes(model, name, imatrix)) is not None}
    if not sizes:
        raise SearchError(f"{model.name}: no shipped recipe plans on this model to prove against")
    return min(sizes, key=lambda name: (abs(sizes[name] - n_bytes), name))


def measure_arm(model: Path, recipe: Recipe | str, out: Path, options: ProveOptions,
                log: Callable[[str], None] = lambda m: None) -> Arm:
    """Quantize ``model`` with ``recipe`` into ``out`` and measure its KLD."""
    name = recipe.name if isinstance(recipe, Recipe) else str(recipe)
    log(f"proof: quantizing {name}")
    q = quantize(model, recipe, out, options.imatrix, progress=False)
    log(f"proof: {name}: {q.size_bytes} bytes; measuring its KLD")
    ev = evaluate(model, out, options.eval, progress=False)
    return Arm(name, q.size_bytes, float(ev.stats.kld_mean or 0.0), tuple(ev.chunk_kld), ev.stats.same_top_p)


def head_trial(found: Arm, found_path: Path, shipped: Arm, shipped_path: Path, options: ProveOptions,
               log: Callable[[str], None] = lambda m: None) -> tuple[Arm, Arm, HeadTrial]:
    """One interleaved ``verify FOUND --reference SHIPPED``: both heads' acceptance, their paired
    difference and, where speed is judged, the found file's speed."""
    log(f"proof: {found.recipe}'s head against {shipped.recipe}'s, in one interleaved run")
    res = verify(found_path, dataclasses.replace(options.verify, reference=str(shipped_path)), progress=False)
    finding = res.head.findings()[res.modes[0]] if res.head is not None else None
    lo, hi = finding.difference_ci if finding else (None, None)
    trial = HeadTrial(finding.difference if finding else None, (lo, hi) if lo is not None and hi is not None else None,
                      finding.n_prompts if finding else 0)
    main = res.main
    found = dataclasses.replace(found, acceptance=main.acceptance,
                                tokens_per_second=main.mtp_tokens_per_second if res.speed_checked else None,
                                speedup=main.speedup if res.speed_checked else None)
    return found, dataclasses.replace(shipped, acceptance=finding.reference_acceptance if finding else None), trial


def prove(model: str | Path, found: Recipe, shipped: str | None = None, options: ProveOptions | None = None, *,
          log: Callable[[str], None] = lambda m: None) -> ProofResult:
    """Quantize ``found`` and ``shipped`` (default: the shipped recipe of the nearest planned size)
    from ``model`` (the source: BF16), measure both the same way and judge (module doc)."""
    o = options or ProveOptions()
    src = Path(model)
    if shipped is None:
        size = group_bytes(src, found, o.imatrix)
        if size is None:
            raise SearchError(f"{found.name}: the found recipe does not plan on {src.name}")
        shipped = nearest_shipped(src, size, o.imatrix)
    # the proof judges the heads' paired interval with its own margin (_head_problem); verify's head
    # margin (the recipe's, at most 10 points) only decides when its sequential design stops
    with tempfile.TemporaryDirectory(prefix="ggufmtp-prove-", dir=o.workdir) as tmp:
        paths = Path(tmp) / "found.gguf", Path(tmp) / "shipped.gguf"
        a = measure_arm(src, found, paths[0], o, log)
        b = measure_arm(src, shipped, paths[1], o, log)
        head = None
        if o.acceptance:
            a, b, head = head_trial(a, paths[0], b, paths[1], o, log)
    return judge(a, b, o.margin, o.kld_tolerance, head)
