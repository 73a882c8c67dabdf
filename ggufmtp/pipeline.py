"""``ggufmtp run``: checkpoint to verified, receipted (and optionally published) artifact.

Stages, in order: pull, inspect, plan, quantize, audit, verify, receipt, card, upload. Each
stage's result is recorded in ``OUT/.ggufmtp/stages/<stage>.json`` under a key computed from its
inputs (the keys of the stages it depends on plus its own parameters). The keys are on content:
the sha256 of the model's files (for a Hub pull, the digests the pull verified) and of the
imatrix, the resolved Hub commit (not the requested revision), the recipe's content, ggufmtp's
version and the llama.cpp runtime (commit, variant). A rerun reuses every stage whose key is
unchanged and whose outputs still hold the bytes recorded, so a run that failed in ``verify``
resumes there, and a changed recipe reruns plan and quantize but not pull. A failing verdict
is recorded but not reused (the next run verifies again) unless ``RunOptions.reuse_failed`` (a
ladder's variants: a rerun measures nothing again), and ``upload`` publishes only an
artifact with a passing verification of its bytes (:mod:`ggufmtp.hub.gate`). The model is made
local, checked to be a GGUF and hashed before anything is written into ``OUT``. A stage that runs
says why (:attr:`StageRecord.why`: no record, which of its named inputs changed, its files changed,
its last verdict failed), and the summary carries it (``ran_because``).

Each stage is a ``_stage_*`` function below; :func:`run` calls them in order on one ``_Run``
record, which carries the inputs and what the earlier stages found (paths, keys).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import cast

from ._version import __version__
from .constants import LLAMA_CPP_COMMIT
from .errors import GgufmtpError, HubRefusedError, PlanError, RecipeError
from .files.hashing import sha256_cached, sha256_file
from .gguf.model import inspect_model, shard_path, split_shards
from .gguf.reader import read_header
from .hub.manifest import PullResult
from .hub.upload import UploadOptions
from .hub.upload import upload as hub_upload
from .imatrix.compute import RunImatrix, imatrix_for_run
from .jsontypes import JsonObject
from .measure.core.options import VerifyOptions
from .measure.verify import run as verify_mod
from .measure.verify.reference import check_reference
from .provenance.audit import audit
from .provenance.card import make_card
from .provenance.receipt import read_receipt, receipt_for_quantize, set_verification
from .provenance.signing import resolve_public_key, resolve_signing_key, sign_artifact
from .quality.options import EvalOptions
from .quant.naming import model_name, variant_file_name
from .quant.plan import make_plan
from .quant.quantize import input_digest_cache, quantize
from .quant.recipe import Recipe
from .quant.split import SplitSize
from .refs import ModelRef, is_builtin, parse_model_ref, resolve
from .run_options import RunOptions
from .run_summary import RunSummary, StageStatus, format_summary
from .runtime.build import installed_runtime
from .stage_cache import StageCache, StageRecord
from .stage_cache import intact as _intact
from .stage_cache import named_key as _named_key
from .stage_cache import stage_key as _key
from .stage_records import (
    CardStage,
    EvalStage,
    FileRecord,
    InspectStage,
    MtpRecord,
    PlanStage,
    PullSource,
    PullStage,
    ReceiptStage,
    VerifyStage,
)

__all__ = ["RunResult", "RunSummary", "StageRecord", "StageStatus", "format_summary", "run"]

STAGES = ("pull", "inspect", "plan", "quantize", "audit", "verify", "receipt", "eval", "card", "upload")

# What the inspect stage keeps of the model report.
_INSPECT_FIELDS = ("architecture", "block_count", "nextn_predict_layers", "mtp_block", "mtp_blocks", "mtp_status",
                   "mtp_missing", "file_type", "n_params", "size_bytes", "bpw")


@dataclasses.dataclass
class RunResult:
    """The outcome of :func:`run`: artifact, receipt, card and the per-stage records."""

    out_dir: Path
    artifact: Path
    receipt: Path
    card: Path | None
    stages: list[StageRecord]

    def stage(self, name: str) -> StageRecord | None:
        return next((s for s in self.stages if s.stage == name), None)

    def _result(self, name: str) -> JsonObject:
        rec = self.stage(name)
        return (rec.result or {}) if rec else {}

    def summary_record(self) -> RunSummary:
        ins, q = cast(InspectStage, self._result("inspect")), self._result("quantize")
        v = self._result("verify").get("verification")
        return RunSummary(
            artifact=str(self.artifact),
            receipt=str(self.receipt),
            card=str(self.card) if self.card else None,
            size_bytes=q.get("size_bytes"),
            bpw=q.get("bpw"),
            mtp_status=q.get("mtp", {}).get("status", ins.get("mtp_status")),
            mtp_block=q.get("mtp", {}).get("block"),
            mtp_blocks=_mtp_blocks(cast(MtpRecord, q.get("mtp", {})), ins),
            acceptance=v["mtp"]["acceptance"] if v else None,
            acceptance_ci95=v["mtp"]["acceptance_ci95"] if v else None,
            speedup=v["speedup"] if v else None,
            speedup_ci95=v["speedup_ci95"] if v else None,
            verdict=v["verdict"] if v else None,
            speed_checked=v.get("speed_checked") if v else None,
            findings=v.get("findings") if v else None,
            head=next(iter(((v.get("head") or {}).get("findings") or {}).values()), None) if v else None,
            reasons=[str(r) for r in v.get("reasons") or []] if v else [],
            uploaded=self._result("upload").get("commit_url") if self.stage("upload") else None,
            stages={s.stage: s.status for s in self.stages},
            stage_seconds={s.stage: round(s.seconds, 3) for s in self.stages},
            ran_because={s.stage: s.why for s in self.stages if s.why is not None},
            reference=(v.get("settings") or {}).get("reference_phase") if v else None,
        )

    def summary(self) -> JsonObject:
        """The run in one JSON object (``ggufmtp run --json``)."""
        return self.summary_record().to_dict()


def _mtp_blocks(q_mtp: MtpRecord, ins: InspectStage) -> list[int]:
    """Every MTP block of the run: the quantize result's; one cached before chains were reported
    names only its first block, so then the inspect stage's list, else that block."""
    if "blocks" in q_mtp:
        return list(q_mtp["blocks"])
    if "mtp_blocks" in ins:
        return list(ins["mtp_blocks"])
    block = q_mtp.get("block")
    return [block] if block is not None else []


def _file_record(path: Path) -> FileRecord:
    """The identity of a file a stage produced: its path and the sha256 of its bytes."""
    return {"path": str(path), "sha256": sha256_file(path)}


def _secret_id(path: Path | None) -> str | None:
    """What a cache key holds of a signing key: a digest of its bytes (never the key itself), so that
    another key re-signs while the same key, moved, does not."""
    return hashlib.sha256(b"ggufmtp signing key\0" + path.read_bytes()).hexdigest() if path else None


def _toolchain_key() -> str:
    """What the stages' outputs depend on besides their inputs: ggufmtp's version and the llama.cpp
    runtime the stages will load (its commit and variant, from the runtime's record: reading it
    does not load libllama, which a fully cached run never needs)."""
    info = installed_runtime()
    return _key("toolchain", __version__, info.commit if info else LLAMA_CPP_COMMIT, info.variant if info else None)


@dataclasses.dataclass(frozen=True)
class _Model:
    """The model a run starts from, checked and hashed before anything is written: its path, the
    pull's manifest (Hub), and the digest of every shard (the pull-verified one for a Hub pull)."""

    path: Path
    manifest: PullResult | None
    shards: tuple[tuple[str, str], ...]  # (file name, sha256)

    @property
    def resolved_commit(self) -> str | None:
        return self.manifest.resolved_commit if self.manifest else None


def _unverified_shards(manifest: PullResult) -> list[str]:
    """The model's files that the pull could not check against a Hub checksum (``verified: false``)."""
    entry = manifest.model_entry
    shards = next((list(m.shards) for m in manifest.gguf_models if m.entry == entry), [entry])
    verified = {f.path for f in manifest.files if f.verified}
    return [str(s) for s in shards if s not in verified]


def _resolve_model(ref: ModelRef, base_dir: Path, include: list[str] | None, token: str | None, progress: bool,
                   allow_unverified: bool) -> _Model:
    """Make the model local (synthesize / take the path / pull into ``base_dir/base``), refuse a file
    that is not a GGUF and a pulled file with no Hub checksum (unless ``allow_unverified``), and hash
    every shard."""
    got = resolve(ref, local_dir=base_dir / "base", include=include, token=token, progress=progress)
    shards = split_shards(Path(got.path))
    for s in shards:
        read_header(s)  # GGUFReadError naming the file: not a GGUF, truncated, corrupt
    if got.manifest is not None:
        unverified = _unverified_shards(got.manifest)
        if unverified and not allow_unverified:
            raise HubRefusedError(
                f"{ref.ident}: the Hub gave no checksum for {', '.join(unverified)}, so the pull could not verify "
                "it; pass --allow-unverified to use it anyway")
        pulled = {Path(f.path).name: f.sha256 for f in got.manifest.files}
        digests = tuple((s.name, pulled.get(s.name) or sha256_cached(s, input_digest_cache())[0]) for s in shards)
    else:  # the digest recorded for this very file, unchanged (quantize reads it from there too)
        digests = tuple((s.name, sha256_cached(s, input_digest_cache())[0]) for s in shards)
    return _Model(Path(got.path), got.manifest, digests)


@dataclasses.dataclass
class _Run:
    """The inputs of one :func:`run` and what the stages found so far (each stage reads what the
    earlier ones set)."""

    out: Path
    cache: StageCache
    recipe: Recipe
    model_arg: str
    ref: ModelRef
    model: _Model
    imatrix: str | Path | None
    imatrix_job: RunImatrix | None
    include: list[str] | None
    threads: int
    token: str | None
    progress: bool
    log: Callable[[str], None]
    name: str = "model"  # the model's name in release file names (quant/naming.py)
    signing_key: Path | None = None
    public_key: Path | None = None
    allow_unverified: bool = False
    split: SplitSize | None = None
    shards: int = 0  # a split artifact's shard count (the quantize stage's record says): artifact is the first
    model_key: str = ""
    plan_key: str = ""
    artifact_key: str = ""
    artifact_sha256: str = ""
    verification: JsonObject | None = None  # the receipt's section, as the verify stage recorded it
    planned_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # the plan's bytes per tensor
    # the receipt (or eval) stage's record: set by the receipt stage, empty before it
    receipted: ReceiptStage = dataclasses.field(default_factory=lambda: cast(ReceiptStage, {}))

    @property
    def model_path(self) -> Path:
        return self.model.path

    @property
    def manifest(self) -> PullResult | None:
        return self.model.manifest

    @property
    def artifact(self) -> Path:
        one = self.out / variant_file_name(self.name, self.recipe.release_tag)
        return shard_path(one, 1, self.shards) if self.shards else one

    @property
    def receipt(self) -> Path:
        return self.artifact.with_name(self.artifact.name + ".receipt.json")

    @property
    def card(self) -> Path:
        return self.out / "README.md"


def _stage_pull(r: _Run) -> None:
    """Records the model's identity: where it came from, the resolved Hub commit (not the requested
    revision), and the sha256 of every file. The model was made local and hashed before the run
    wrote anything (:func:`_resolve_model`); this stage is cached when none of that changed."""
    m = r.model
    source: PullSource = {"kind": str(r.ref.kind), "ident": r.ref.ident, "requested_revision": r.ref.revision,
                          "resolved_commit": m.resolved_commit, "include": r.include,
                          "shards": [list(s) for s in m.shards]}
    pull_key, inputs = _named_key(stage="pull", source_model=source)
    manifest = m.manifest.to_dict() if m.manifest else None
    r.cache.run("pull", (pull_key, inputs), lambda: PullStage(model_path=str(m.path), manifest=manifest, source=source))
    r.model_key = _key(pull_key, _toolchain_key())


def _stage_inspect(r: _Run) -> None:
    def do() -> InspectStage:
        report = inspect_model(r.model_path).to_dict()
        return cast(InspectStage, {k: report[k] for k in _INSPECT_FIELDS})

    r.cache.run("inspect", _key("inspect", r.model_key), do)


def _recipe_content(recipe: Recipe) -> JsonObject:
    """The recipe as the receipt records it: its whole content and file name (not where it lies)."""
    d = recipe.to_dict()
    d["path"] = Path(recipe.path).name if recipe.path else None
    return d


def _stage_imatrix(r: _Run) -> None:
    """``--imatrix-corpus``: compute the imatrix (MTP statistics too when the model has the block),
    cached by the model's and the corpus's content, chunks and context; the plan then uses it."""
    if r.imatrix_job is None:
        return
    job = r.imatrix_job
    key = _key("imatrix", r.model_key, job.key())
    done = r.cache.run("imatrix", key, lambda: job.compute(r.model_path, threads=r.threads or None, gpu_layers=None,
                                                             progress=r.progress), _intact("imatrix"))
    r.imatrix = done["imatrix"]["path"]


def _stage_plan(r: _Run) -> None:
    def do() -> PlanStage:
        p = make_plan(r.model_path, r.recipe, r.imatrix, threads=r.threads)
        if p.errors:
            raise PlanError(f"{r.model_path}: pre-flight checks failed:\n  " + "\n  ".join(p.errors), p.errors)
        d = p.to_dict()
        return {"size_bytes": d["size_bytes"], "bpw": d["bpw"], "mtp": d["mtp"], "warnings": d["warnings"],
                "llama_quantize_command": p.llama_quantize_command("OUT.gguf"),
                "tensor_bytes": {t.name: t.bytes for t in p.tensors}}

    im_key = {"name": Path(r.imatrix).name, "sha256": sha256_file(r.imatrix)} if r.imatrix else None
    r.plan_key, inputs = _named_key(stage="plan", model_or_toolchain=r.model_key, recipe=_recipe_content(r.recipe),
                                    imatrix=im_key)
    planned = r.cache.run("plan", (r.plan_key, inputs), do, lambda rec: "tensor_bytes" in rec)
    r.planned_bytes = planned["tensor_bytes"]
    for w in planned["warnings"]:
        r.log(f"warning: {w}")


def _check_memory(r: _Run, verify_options: VerifyOptions, reference_base: bool) -> None:
    """Before quantizing: the verification's GPU memory plan (:mod:`ggufmtp.runtime.memory`),
    the artifact's bytes taken from the quantization plan, printed to the log; MemoryPlanError when
    a phase does not fit, saying what would."""
    from .runtime.memory import plan_for_verify

    if reference_base and verify_options.reference is None:
        verify_options = dataclasses.replace(verify_options, reference=r.model_path)
    plan = plan_for_verify(r.model_path, verify_options.with_defaults(draft_n_max=r.recipe.verify.draft_n_max),
                           tensor_bytes=r.planned_bytes)
    r.log(plan.format())
    plan.refuse_unless_fits("quantizing")


def _stage_quantize(r: _Run) -> None:
    """Writes the artifact, its base receipt (verification comes later) and, with a signing key,
    the receipt's signature and the artifact's (``ARTIFACT.sig``)."""
    def do() -> JsonObject:  # QuantizeResult.to_dict() and the artifact's FileRecord
        # the receipt is written before quantize renames the artifact into place (never one without the other)
        res = quantize(r.model_path, r.recipe, r.artifact, imatrix=r.imatrix, threads=r.threads, progress=r.progress,
                       split=r.split, before_publish=lambda staged: receipt_for_quantize(
                           staged, model_arg=r.model_arg, imatrix=r.imatrix, manifest=r.manifest,
                           signing_key=r.signing_key))
        r.shards = len(res.shards)
        for f in res.files if r.signing_key else []:
            sign_artifact(f, str(r.signing_key))
        d = res.to_dict()
        # the digests quantize took of these bytes for the receipt: no second read of the artifact
        d["artifact"] = {"path": str(r.artifact), "sha256": res.output_sha256} if res.output_sha256 \
            else _file_record(r.artifact)
        d["shard_files"] = [{"path": str(p), "sha256": res.shard_sha256.get(str(p)) or sha256_file(p)}
                            for p in res.shards]
        return d

    quant_key, inputs = _named_key(stage="quantize", plan=r.plan_key, signing_key=_secret_id(r.signing_key),
                                   split_size=str(r.split))
    quantized = r.cache.run("quantize", (quant_key, inputs), do, _intact("artifact", "shard_files"))
    r.shards = len(quantized["shard_files"])
    r.artifact_sha256 = quantized["artifact"]["sha256"]
    r.artifact_key = _key(quant_key, r.artifact_sha256)


def _stage_audit(r: _Run) -> None:
    def do() -> JsonObject:  # AuditReport.to_dict()
        rep = audit(r.artifact, r.receipt, progress=r.progress)
        if not rep.ok:
            raise GgufmtpError(f"{r.artifact}: audit failed: "
                               + "; ".join(f"{c.name}: {c.detail}" for c in rep.failures))
        return rep.to_dict()

    r.cache.run("audit", _key("audit", r.artifact_key), do)


def _stage_verify(r: _Run, verify_options: VerifyOptions, reference_base: bool = True) -> None:
    """A failing verdict is recorded, not cached as done: the next run verifies again. The recipe's
    ``[verify]`` table gives the window and the thresholds the options leave unset; the head is
    judged against the source model (``reference_base``) unless the options name a reference."""
    if reference_base and verify_options.reference is None:
        verify_options = dataclasses.replace(verify_options, reference=r.model_path)

    def do() -> VerifyStage:
        opts = verify_options.with_defaults(
            draft_n_max=r.recipe.verify.draft_n_max,
            thresholds=verify_mod.Thresholds.from_recipe(r.recipe.verify, r.recipe.name))
        # Through the module attribute, so that a patched ``verify`` (tests) is the one called.
        res = verify_mod.verify(r.artifact, opts, progress=r.progress, receipt=r.receipt)
        return {"verification": res.to_receipt()}

    key = _named_key(stage="verify", artifact=r.artifact_key,
                     verify_settings={k: str(v) for k, v in verify_options.to_dict().items()},
                     recipe_thresholds=dataclasses.asdict(r.recipe.verify),
                     reference=r.model_key if verify_options.reference == r.model_path else None)
    passed = r.cache.run("verify", key, do, ok=lambda res: res["verification"].get("verdict") == "pass")
    r.verification = passed["verification"]


def _stage_receipt(r: _Run) -> None:
    """The verification goes into the receipt (signed with the signing key, when there is one)."""
    def do() -> ReceiptStage:
        if r.verification is not None:
            set_verification(r.receipt, r.verification, signing_key=r.signing_key)
        return {"receipt": _file_record(r.receipt), "artifact_sha256": read_receipt(r.receipt).artifact.sha256}

    key = _key("receipt", r.artifact_key, r.verification, _secret_id(r.signing_key))
    r.receipted = r.cache.run("receipt", key, do, _receipt_holds(r))


def _receipt_holds(r: _Run) -> Callable[[ReceiptStage], bool]:
    """The receipt stage's result is valid while the receipt is intact, of the artifact, and holds
    this run's verification; not byte for byte, since a later stage (eval) adds its own section."""
    def check(_: ReceiptStage) -> bool:
        try:
            rc = read_receipt(r.receipt)
        except GgufmtpError:
            return False
        return rc.intact and rc.artifact.sha256 == r.artifact_sha256 and rc.verification == r.verification

    return check


def _stage_eval(r: _Run, eval_options: EvalOptions) -> None:
    """``--eval``: KL-divergence of the artifact against the source model, into the receipt's ``quality``."""
    def do() -> EvalStage:
        from .quality.sections import eval_into_receipt

        quality = eval_into_receipt(r.model_path, r.artifact, r.receipt, eval_options, r.signing_key,
                                    r.progress).to_dict()
        return {"quality": quality, "receipt": _file_record(r.receipt), "artifact_sha256": r.artifact_sha256}

    key = _named_key(stage="eval", artifact=r.artifact_key, receipt=r.receipted,
                     eval_settings={k: str(v) for k, v in eval_options.to_dict().items()})
    r.receipted = r.cache.run("eval", key, do, _intact("receipt"))


def _stage_card(r: _Run, repo_id: str | None, quantized_by: str, base_model: str | None) -> None:
    """The card; its download and run lines name ``repo_id``, the repo ``--upload`` publishes to;
    its metadata ``quantized_by`` and ``base_model`` (None: what the receipt names)."""
    def do() -> CardStage:
        make_card(r.artifact, r.receipt, r.card, repo_id=repo_id, quantized_by=quantized_by, base_model=base_model)
        return {"card": _file_record(r.card)}

    key = _key("card", r.receipted["receipt"], __version__, repo_id, quantized_by, base_model)
    r.cache.run("card", key, do, _intact("card"))


def _stage_upload(r: _Run, repo_id: str, private: bool, dry_run: bool) -> None:
    """Through the publish gate (:mod:`ggufmtp.hub.gate`): without a passing verification of the
    artifact's bytes (or ``allow_unverified``) it raises before any request reaches the Hub."""
    def do() -> JsonObject:  # UploadResult.to_dict()
        options = UploadOptions(private=private, token=r.token, dry_run=dry_run, recipe_name=r.recipe.name,
                                artifact_sha256=r.receipted["artifact_sha256"], allow_unverified=r.allow_unverified,
                                public_key=r.public_key)
        res = hub_upload(repo_id, [r.artifact], [r.receipt], r.card, options, progress=r.progress)
        return res.to_dict()

    key = _key("upload", repo_id, r.receipted, r.card.exists() and sha256_file(r.card), dry_run, private,
               r.allow_unverified, str(r.public_key) if r.public_key else None)
    r.cache.run("upload", key, do)


def _recipe_second(model: str | Path, recipe: Recipe | str | Path) -> Recipe:
    """The recipe, loaded; the old order (a recipe first) is refused by name, not as "no such recipe"."""
    if isinstance(recipe, Recipe):
        return recipe
    try:
        return Recipe.load(recipe)
    except RecipeError:
        swapped = False
        with contextlib.suppress(RecipeError):
            swapped = bool(Recipe.load(model))
        if swapped:
            raise RecipeError(f"run() takes the model first: run({str(recipe)!r}, {str(model)!r}), "
                              f"not run({str(model)!r}, {str(recipe)!r})") from None
        raise


def run(model: str, recipe: Recipe | str | Path, options: RunOptions | None = None, *, out_dir: str | Path = "ggufmtp-out",
        progress: bool = True, log: Callable[[str], None] = lambda m: None) -> RunResult:
    """Run the whole pipeline into ``out_dir``; see the module docstring. ``model`` is
    ``REPO_ID[@REV]``, a local GGUF path, a local safetensors checkpoint directory (converted
    first) or ``builtin:NAME``; ``recipe`` a shipped recipe, a ``.toml`` file or a llama-quantize
    type; ``options``: what to make and how (:class:`RunOptions`, checked when built). Nothing is
    written for a model that is not a GGUF. The model comes first, as in every other function; the
    former order, ``run(recipe, model)``, is refused with a message saying so."""
    o = options if options is not None else RunOptions()
    model, recipe = str(model), _recipe_second(model, recipe)
    out = Path(out_dir)
    from .hfconvert.convert import converted_for_run

    # a safetensors checkpoint directory is converted first (cached by its files' digests)
    shared = Path(o.base_dir) if o.base_dir is not None else out
    converted = converted_for_run(model, shared, progress, o.token) if not is_builtin(model) else None
    rec, ref = recipe, parse_model_ref(str(converted) if converted else model)
    key = resolve_signing_key(o.signing_key)
    pub = resolve_public_key(o.public_key) if o.upload else None
    include = list(o.include) if o.include is not None else None
    resolved = _resolve_model(ref, shared, include, o.token, progress, o.allow_unverified)
    check_reference(o.verify_options if o.verify else None, resolved.path)  # another model: refused before any work
    job = imatrix_for_run(resolved.path, o.imatrix_corpus, out, chunks=o.imatrix_chunks) if o.imatrix_corpus else None
    out.mkdir(parents=True, exist_ok=True)
    r = _Run(out=out, cache=StageCache(out, log, o.force, o.reuse_failed), recipe=rec, model_arg=model, ref=ref, model=resolved,
             imatrix=o.imatrix, imatrix_job=job, include=include, threads=o.quantize_threads, token=o.token,
             progress=progress, log=log, name=model_name(model, resolved.path, converted=converted is not None),
             signing_key=key, public_key=pub, allow_unverified=o.allow_unverified, split=o.split_max_size)
    for stage in (_stage_pull, _stage_inspect, _stage_imatrix, _stage_plan):
        stage(r)
    if o.verify:
        _check_memory(r, o.verify_options or VerifyOptions(), o.reference_base)
    for stage in (_stage_quantize, _stage_audit):
        stage(r)
    if o.until == "audit":
        return RunResult(out_dir=out, artifact=r.artifact, receipt=r.receipt, card=None, stages=r.cache.records)
    if o.verify:
        _stage_verify(r, o.verify_options or VerifyOptions(), o.reference_base)
    _stage_receipt(r)
    if o.eval_options is not None:
        _stage_eval(r, o.eval_options)
    _stage_card(r, o.upload, o.quantized_by, o.base_model)
    if o.upload:
        _stage_upload(r, o.upload, o.private, o.dry_run_upload)
    return RunResult(out_dir=out, artifact=r.artifact, receipt=r.receipt, card=r.card, stages=r.cache.records)


def clean(out_dir: str | Path) -> None:
    """Forget every cached stage result in ``out_dir``."""
    shutil.rmtree(Path(out_dir) / ".ggufmtp", ignore_errors=True)
