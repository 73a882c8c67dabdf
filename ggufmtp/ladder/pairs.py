"""A ladder's sidecar layout (``layout = "sidecar"``, ``ladder --layout sidecar``): N trunk-only
variants and one or more MTP sidecars instead of N variants each with its own head.

The folder, stable (the Hub end-to-end test and docs/how-to/ladder.md rely on it)::

    DIR/README.md                              the ladder's card (the pair explained)
    DIR/mtp-<Model>-<TYPE>.gguf                each sidecar (``sidecars``: a recipe or llama-quantize type
    DIR/mtp-<Model>-<TYPE>.gguf.receipt.json     each), made once from the source by ``ggufmtp sidecar -r TYPE``
    DIR/<TAG>/<Model>-<TAG>.gguf               each variant's trunk (no MTP block): the name -hf REPO:TAG picks
    DIR/<TAG>/<Model>-<TAG>.gguf.receipt.json    its receipt: a pair section naming its sidecar, the pair's verification
    DIR/<TAG>/README.md                        its own card
    DIR/.full/<TAG>/                           the full variant the trunk is cut from (``ggufmtp run``'s folder,
                                                 its stage cache and receipt; never published)

Every name is :mod:`ggufmtp.quant.naming`'s, so ``llama-server -hf REPO:TAG --spec-type draft-mtp``
takes ``<Model>-<TAG>.gguf`` as the model and an ``mtp-`` file as its draft; each trunk is paired
with the sidecar that resolver picks for its tag (:func:`~ggufmtp.quant.naming.best_sidecar`) and
verified so (``-m TRUNK -md SIDECAR``), against the source's own head as the reference arm. A
trunk's KLD is measured on the trunk itself (the head plays no part in the logits).

Each variant's *build* task is ``ggufmtp run ... until audit`` into ``.full/<TAG>/``; its
*measure* task cuts the trunk (:func:`ggufmtp.quant.sidecar.make_trunk`, its receipt by
:func:`ggufmtp.provenance.pair.write_trunk_receipt`), verifies the pair into that receipt, evaluates
it and writes its card. A rerun reuses a trunk whose receipt still binds the same full variant and
sidecar and holds a verification of the pair, failing ones too (and the eval, when asked for), and a sidecar
made from the same source, imatrix, recipe, signing key and toolchain.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from .._version import __version__
from ..constants import LLAMA_CPP_COMMIT
from ..errors import GgufmtpError
from ..files.fsutil import atomic_write_json
from ..files.hashing import sha256_file
from ..jsontypes import JsonObject
from ..provenance.pair import PairSources, pair_receipt_writer, write_trunk_receipt
from ..provenance.receipt import Receipt, default_receipt_path, read_receipt
from ..quant.naming import best_sidecar
from ..quant.recipe import Recipe
from ..quant.sidecar import SidecarOptions, make_sidecar, make_trunk
from .spec import LadderSpec, VariantJob

if TYPE_CHECKING:
    from ..measure.verify.reference import ReferencePhaseRecord
    from ..pipeline import RunResult, StageStatus

__all__ = ["make_sidecars", "pair_jobs", "trunk_variant"]

_RECORDS = ".ggufmtp"  # DIR/.ggufmtp/sidecar-<name>.json: what each sidecar was made from


def _sidecar_key(source: Path, recipe: str, imatrix: str | None, signing_key: Path | None) -> JsonObject:
    return {"source_sha256": sha256_file(source), "recipe_sha256": Recipe.load(recipe).sha256,
            "imatrix_sha256": sha256_file(imatrix) if imatrix else None,
            "signing_key": str(signing_key) if signing_key else None, "ggufmtp": __version__,
            "llama_cpp": LLAMA_CPP_COMMIT}


def _sidecar_current(out: Path, record: Path, key: JsonObject) -> bool:
    """The sidecar at ``out`` was made from ``key``'s inputs and is still those bytes, with its receipt."""
    if _recorded(record) != key:
        return False
    try:
        rc = read_receipt(default_receipt_path(out))
    except (OSError, GgufmtpError):
        return False
    sha = sha256_file(out) if out.is_file() else None
    return json.loads(record.read_text()).get("sha256") == sha and rc.intact and rc.artifact.sha256 == sha


def make_sidecars(spec: LadderSpec, source: Path, model: str, imatrix: str | None,
                  progress: bool = False) -> list[Path]:
    """Each sidecar of ``spec`` (``DIR/mtp-<model>-<TYPE>.gguf`` with its receipt), from the local
    ``source`` quantized at that recipe's types with the ladder's imatrix; one made before from the
    same inputs is kept."""
    paths = spec.sidecar_paths(model)
    for recipe, out in zip(spec.sidecar_recipes, paths, strict=True):
        record = spec.out_dir / _RECORDS / f"sidecar-{out.name}.json"
        key = _sidecar_key(source, recipe, imatrix, spec.signing_key)
        if _sidecar_current(out, record, key):
            continue
        make_sidecar(source, out, SidecarOptions(recipe=recipe, imatrix=imatrix, threads=spec.threads,
                                                 progress=progress),
                     model_arg=spec.model, before_publish=pair_receipt_writer(spec.signing_key))
        atomic_write_json(record, {"key": key, "sha256": sha256_file(out)})
    return paths


def pair_jobs(spec: LadderSpec, imatrix: str | None, sidecars: Sequence[Path], source: Path) -> list[VariantJob]:
    """One job per recipe, each trunk paired with the sidecar ``-hf REPO:TAG`` would pick for its tag."""
    jobs = []
    for recipe in spec.recipes:
        tag = Recipe.load(recipe).release_tag
        picked = best_sidecar(tag, [p.name for p in sidecars])
        jobs.append(VariantJob.of(spec, recipe, imatrix, sidecar=next(p for p in sidecars if p.name == picked),
                                  source=source))
    return jobs


def _trunk_key(job: VariantJob, full_sha: str, side_sha: str) -> JsonObject:
    """What a trunk's measurement depends on besides its receipt: the full variant, the sidecar and
    the options (as ``ggufmtp run``'s verify and eval stage keys take them)."""
    return {"full_sha256": full_sha, "sidecar_sha256": side_sha, "verify": job.verify,
            "verify_options": {k: str(v) for k, v in job.verify_options.to_dict().items()},
            "reference_base": job.reference_base, "signing_key": job.signing_key,
            "eval_options": {k: str(v) for k, v in job.eval_options.to_dict().items()} if job.eval_options else None,
            "split_max_size": str(job.split), "ggufmtp": __version__}


def _recorded(record: Path) -> object:
    try:
        return json.loads(record.read_text()).get("key")
    except (OSError, ValueError, AttributeError):
        return None


def _trunk_current(rc_path: Path, trunk: Path, full_sha: str, side_sha: str, job: VariantJob) -> bool:
    """The trunk's receipt binds these bytes, cut from this full variant, served with this sidecar,
    and holds what the job asks for (a verification of the pair, whatever its verdict: the same bytes
    measured with the same settings again tell nothing new; the eval)."""
    try:
        rc = read_receipt(rc_path)
    except (OSError, GgufmtpError):
        return False
    pair, v = rc.predicate.get("pair"), rc.predicate.get("verification") or {}
    named = pair.get("sidecar") if pair is not None else None
    if pair is None or named is None or not (rc.intact and _same_bytes(rc, trunk.parent)
                                             and pair["made_from"]["sha256"] == full_sha and named["sha256"] == side_sha):
        return False
    served = (v.get("model") or {}).get("sidecar")
    verified = v.get("verdict") is not None and served is not None and served["sha256"] == side_sha
    return (verified or not job.verify) and (job.eval_options is None or rc.predicate.get("quality") is not None)


def _same_bytes(rc: Receipt, folder: Path) -> bool:
    """Every file the receipt names (a split trunk's every shard) is in ``folder`` with its bytes."""
    return all((folder / f.name).is_file() and sha256_file(folder / f.name) == f.sha256 for f in rc.subjects)


def _published_trunk(folder: Path, name: str) -> Path:
    """The trunk published as ``name`` in ``folder``, or its split set's first shard (the file with
    a receipt); ``folder/name`` when there is none yet."""
    stem = glob.escape(name.removesuffix(".gguf"))
    for p in (folder / name, *sorted(folder.glob(f"{stem}-00001-of-*.gguf"))):
        if default_receipt_path(p).is_file():
            return p
    return folder / name


def _measure_pair(job: VariantJob, trunk: Path, rc: Path, timed: Callable[[str, Callable[[], object]], None]) -> None:
    """The pair's verification (the recipe's thresholds and window, the source's head as reference)
    into the trunk's receipt, then the eval of the trunk against the source."""
    from ..measure.verify import run as verify_mod
    from ..provenance.receipt import set_verification
    from ..quality.sections import eval_into_receipt

    recipe = Recipe.load(job.recipe)
    if job.verify:
        o = job.verify_options
        if job.reference_base and o.reference is None and job.source is not None:
            o = dataclasses.replace(o, reference=job.source)
        o = dataclasses.replace(o, sidecar=job.sidecar).with_defaults(
            draft_n_max=recipe.verify.draft_n_max,
            thresholds=verify_mod.Thresholds.from_recipe(recipe.verify, recipe.name))

        def verify() -> None:
            res = verify_mod.verify(trunk, o, progress=False, receipt=rc)
            set_verification(rc, res.to_receipt(), signing_key=job.signing_key)

        timed("verify", verify)
    source, ev = job.source, job.eval_options
    if ev is not None and source is not None:
        timed("eval", lambda: eval_into_receipt(source, trunk, rc, ev, job.signing_key, False))


def trunk_variant(job: VariantJob, built: RunResult) -> JsonObject:
    """The measure task of a trunk-only variant (module docstring): ``built`` is the full variant's
    run (until audit); returns its summary as ``ggufmtp run --json`` gives one, of the trunk."""
    from ..pipeline import StageStatus
    from ..provenance.card import make_card

    sidecar = job.sidecar
    assert sidecar is not None
    full = built.artifact
    trunk = _published_trunk(job.out_dir, built.artifact.name)  # a split trunk: its first shard
    seconds: dict[str, float] = {}

    def timed(stage: str, fn: Callable[[], object]) -> None:
        t0 = time.monotonic()
        fn()
        seconds[stage] = round(time.monotonic() - t0, 3)

    full_sha, side_sha = sha256_file(full), sha256_file(sidecar)
    record = job.base_dir / _RECORDS / f"trunk-{job.out_dir.name}.json"
    key = _trunk_key(job, full_sha, side_sha)
    rc = default_receipt_path(trunk)
    why = _why_remade(_recorded(record), key) or (None if _trunk_current(rc, trunk, full_sha, side_sha, job)
                                                  else "its receipt or files changed since")
    cached = why is None
    if not cached:
        job.out_dir.mkdir(parents=True, exist_ok=True)
        src = PairSources(full, job.model, full)
        made: list[Path] = []
        timed("trunk", lambda: made.extend(make_trunk(
            full, job.out_dir / built.artifact.name, lambda staged, final: write_trunk_receipt(
                src, (staged, final), sidecar, job.signing_key, str(job.split)), split=job.split)))
        trunk = made[0]
        rc = default_receipt_path(trunk)
        _measure_pair(job, trunk, rc, timed)
        timed("card", lambda: make_card(trunk, rc, job.out_dir / "README.md", quantized_by=job.quantized_by,
                                        base_model=job.base_model))
        atomic_write_json(record, {"key": key})
    names = ["trunk", *(["verify"] if job.verify else []), *(["eval"] if job.eval_options else []), "card"]
    stages = {k: StageStatus.CACHED if cached else StageStatus.RAN for k in names}
    summary = _summary(built, read_receipt(rc), job.out_dir / "README.md", stages, seconds, sidecar)
    return {**summary, "ran_because": {**built.summary_record().ran_because, **{k: str(why) for k in names if why}}}


def _why_remade(recorded: object, key: Mapping[str, object]) -> str | None:
    """Why a trunk's record does not hold for ``key`` (None: it does): no record, or which inputs changed."""
    if not isinstance(recorded, dict):
        return "no record"
    changed = [k.replace("_", " ") for k in key if recorded.get(k) != key[k]]
    return f"{' and '.join(changed)} changed" if changed else None


def _summary(built: RunResult, rc: Receipt, card: Path, stages: Mapping[str, StageStatus],
             seconds: Mapping[str, float], sidecar: Path) -> JsonObject:
    """``built``'s summary (the full variant's stages) with the trunk's file, receipt, verification
    and card, its stages added after the full variant's, and the sidecar it is served with."""
    v = rc.verification
    trunk = rc.path.with_name(rc.artifact.name)
    judged = cast(Mapping[str, Mapping[str, JsonObject]], v or {}).get("head") or {}
    findings = judged.get("findings") or {}
    head = next(iter(findings.values()), None)
    base = built.summary_record()
    summary = dataclasses.replace(
        base, artifact=str(trunk), receipt=str(rc.path), card=str(card) if card.is_file() else None,
        size_bytes=sum(f.size for f in rc.subjects), bpw=rc.predicate["result"].get("bpw"), mtp_status="absent", mtp_block=None,
        acceptance=v["mtp"]["acceptance"] if v else None, acceptance_ci95=v["mtp"]["acceptance_ci95"] if v else None,
        speedup=v["speedup"] if v else None, speedup_ci95=v["speedup_ci95"] if v else None,
        verdict=v["verdict"] if v else None, speed_checked=v.get("speed_checked") if v else None,
        reasons=[str(r) for r in v.get("reasons") or []] if v else [],  # why it is not pass: the console says it
        findings=cast(JsonObject | None, v.get("findings")) if v else None, head=head, stages={**base.stages, **stages},
        stage_seconds={**base.stage_seconds, **seconds},
        reference=cast("ReferencePhaseRecord | None", (v.get("settings") or {}).get("reference_phase") if v else None))
    return {**summary.to_dict(), "sidecar": str(sidecar)}
