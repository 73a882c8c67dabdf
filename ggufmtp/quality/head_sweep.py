"""``ggufmtp head-sweep``: how low can the MTP head's precision go before acceptance drops?

The same model is quantized once per head type with one recipe whose ``[mtp]`` roles all say that
type (so only the MTP block's tensors differ; its 1-D norms stay F32 as always), the trunk of every
variant is checked byte-identical to the first one's (sha256 of each trunk tensor's bytes, read with
the one GGUF reader), and each variant is verified with the same suite, seeds and server settings
(:func:`ggufmtp.measure.verify.run.verify`, fair baseline). The unquantized head (BF16) is always part
of the sweep: the recommendation is the smallest head whose acceptance 95% CI overlaps the BF16
head's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import HeadSweepError
from ..files.fsutil import atomic_write_text
from ..gguf.model import GGUFModel
from ..gguf.trunk import is_mtp_tensor, trunk_digests
from ..jsontypes import JsonObject
from ..measure.core.options import VerifyOptions
from ..measure.verify import run as verify_mod
from ..quant.ggml_types import writable_type
from ..quant.quantize import quantize
from ..quant.recipe import MTP_ROLES, Recipe, normalize_type

REFERENCE_TYPE = "BF16"
DEFAULT_TYPES = ("Q8_0", "Q6_K", "Q5_K", "Q4_K", "IQ4_XS")


def head_recipe(recipe: Recipe, head_type: str) -> Recipe:
    """``recipe`` with every MTP role at ``head_type`` (the trunk's rules untouched)."""
    t = normalize_type(head_type, "head-sweep --types")
    return dataclasses.replace(recipe, name=f"{recipe.name}-head-{t.lower()}",
                               description=f"{recipe.description or recipe.name}; MTP block at {t}",
                               mtp_roles=tuple((role, t) for role in MTP_ROLES), path=None, sha256=None)


def head_bytes(path: str | Path) -> int:
    model = GGUFModel(path)
    return sum(t.n_bytes for name, t in model.tensors.items() if is_mtp_tensor(name, model.mtp_blocks))


def refuse_different_trunks(reference: Path, ref_digests: dict[str, str], other: Path,
                            other_digests: dict[str, str]) -> None:
    """HeadSweepError naming the first trunk tensor whose bytes (or presence) differ."""
    if ref_digests == other_digests:
        return
    names = sorted(set(ref_digests) | set(other_digests))
    bad = [n for n in names if ref_digests.get(n) != other_digests.get(n)]
    raise HeadSweepError(f"{other}: its trunk differs from {reference}'s ({len(bad)} tensor(s), first {bad[0]}): "
                         "the variants would not compare the head alone")


@dataclasses.dataclass(frozen=True)
class HeadVariant:
    """One head type: its artifact, and what verification measured."""

    head_type: str
    path: Path
    head_bytes: int
    size_bytes: int
    acceptance: float | None
    acceptance_ci95: list[float | None]
    speedup: float | None
    speedup_ci95: list[float | None]
    mean_acceptance_length: float | None
    verdict: str

    def to_dict(self, *, names: bool = False) -> JsonObject:
        """The variant as JSON; ``names``: its file by name alone, as a receipt holds it."""
        d = dataclasses.asdict(self)
        d["path"] = self.path.name if names else str(self.path)
        return d


@dataclasses.dataclass(frozen=True)
class HeadSweepResult:
    """The sweep: variants in the order run (BF16 first), the recommendation, the settings shared."""

    model: Path
    recipe: Recipe
    variants: list[HeadVariant]
    recommended: str | None
    trunk_tensors: int
    settings: JsonObject  # the verify options shared (their JSON)

    def recommended_recipe(self) -> Recipe | None:
        return head_recipe(self.recipe, self.recommended) if self.recommended else None

    def to_dict(self, *, names: bool = False) -> JsonObject:
        """The sweep as JSON; ``names``: every file by name alone (the receipt's ``head_sweep``)."""
        return {"model": self.model.name if names else str(self.model), "recipe": self.recipe.name,
                "reference": REFERENCE_TYPE, "variants": [v.to_dict(names=names) for v in self.variants], "recommended": self.recommended,
                "trunk_identical": True, "trunk_tensors": self.trunk_tensors, "settings": self.settings}


def _overlaps(a: Sequence[float | None], b: Sequence[float | None]) -> bool:
    if None in a or None in b:
        return False
    return a[0] <= b[1] and b[0] <= a[1]


def recommend(variants: Sequence[HeadVariant]) -> str | None:
    """The smallest head whose acceptance CI overlaps the BF16 head's (None without a BF16 result)."""
    ref = next((v for v in variants if v.head_type == REFERENCE_TYPE), None)
    if ref is None or ref.acceptance is None:
        return None
    ok = [v for v in variants if _overlaps(v.acceptance_ci95, ref.acceptance_ci95)]
    return min(ok, key=lambda v: v.head_bytes).head_type if ok else None


def sweep_types(types: Sequence[str]) -> list[str]:
    """The head types to run: BF16 first (the reference), then ``types`` in order, no repeats."""
    out = [REFERENCE_TYPE]
    for t in types:
        t = writable_type(t, "head-sweep --types")  # before any head is made
        if t not in out:
            out.append(t)
    return out


def _variant(head_type: str, path: Path, verify_options: VerifyOptions, progress: bool) -> HeadVariant:
    res = verify_mod.verify(path, verify_options, progress=progress)
    c = res.main
    return HeadVariant(head_type=head_type, path=path, head_bytes=head_bytes(path), size_bytes=path.stat().st_size,
                       acceptance=c.acceptance, acceptance_ci95=list(c.acceptance_ci95), speedup=c.speedup,
                       speedup_ci95=list(c.speedup_ci95), mean_acceptance_length=c.mean_acceptance_length,
                       verdict=str(getattr(res.verdict, "value", res.verdict)))


def head_sweep(model: str | Path, recipe: Recipe | str | Path, types: Sequence[str] = DEFAULT_TYPES,
               out_dir: str | Path = "head-sweep", imatrix: str | Path | None = None, threads: int = 0,
               verify_options: VerifyOptions | None = None, progress: bool = True,
               log: Callable[[str], None] = lambda m: None) -> HeadSweepResult:
    """Quantize ``model`` once per head type (BF16 + ``types``), check the trunks are identical,
    verify each with ``verify_options`` (the same for all) and recommend a head type.

    Raises HeadSweepError when the model has no MTP block or the trunks differ; the plan's
    pre-flight errors (e.g. an IQ type without an imatrix covering the head) come through as they are."""
    model = Path(model)
    base = recipe if isinstance(recipe, Recipe) else Recipe.load(recipe)
    if not GGUFModel(model).mtp_blocks:
        raise HeadSweepError(f"{model}: no MTP block (nextn_predict_layers is 0): there is no head to sweep")
    out = Path(out_dir)
    # each variant's verdict is judged by the recipe's [verify] table, as `run` judges an artifact
    opts = (verify_options or VerifyOptions()).with_defaults(draft_n_max=base.verify.draft_n_max,
                                                             thresholds=base.verify)
    ref_path: Path | None = None
    ref_digests: dict[str, str] = {}
    variants: list[HeadVariant] = []
    for t in sweep_types(types):
        path = out / f"{model.stem}-{base.name}-head-{t.lower()}.gguf"
        log(f"head {t}: quantizing -> {path}")
        quantize(model, head_recipe(base, t), path, imatrix=imatrix, threads=threads, progress=progress)
        digests = trunk_digests(path)
        if ref_path is None:
            ref_path, ref_digests = path, digests
        refuse_different_trunks(ref_path, ref_digests, path, digests)
        log(f"head {t}: verifying")
        variants.append(_variant(t, path, opts, progress))
    return HeadSweepResult(model=model, recipe=base, variants=variants, recommended=recommend(variants),
                           trunk_tensors=len(ref_digests),
                           settings={"seeds": list(opts.seeds),
                                     **{k: v for k, v in opts.to_dict().items() if k != "thresholds"}})


def write_recommended_recipe(result: HeadSweepResult, path: str | Path) -> Path:
    """Write the recommended head's recipe as TOML; HeadSweepError when nothing was recommended."""
    rec = result.recommended_recipe()
    if rec is None:
        raise HeadSweepError(f"{path}: no head type's acceptance CI overlaps the BF16 head's; no recipe written")
    return atomic_write_text(path, rec.to_toml())


def format_sweep(r: HeadSweepResult) -> str:
    """The sweep as one table for people."""
    from ..fmt import ci_text, num, pct, times

    head = f"{'head':<8} {'head bytes':>12} {'artifact':>12} {'acceptance (95% CI)':<28} {'speedup (95% CI)':<24} mean acc. len"
    lines = [head, "-" * len(head)]
    for v in r.variants:
        lines.append(f"{v.head_type:<8} {v.head_bytes:>12,} {v.size_bytes:>12,} "
                     f"{pct(v.acceptance) + ' ' + ci_text(v.acceptance_ci95, 100, 1):<28} "
                     f"{times(v.speedup) + ' ' + ci_text(v.speedup_ci95):<24} {num(v.mean_acceptance_length)}")
    lines.append(f"\ntrunk: {r.trunk_tensors} tensors byte-identical across the {len(r.variants)} variants")
    lines.append(f"recommended head: {r.recommended or 'none (no CI overlaps the BF16 head)'}")
    return "\n".join(lines)
