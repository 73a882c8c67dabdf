"""``ggufmtp run``: checkpoint to verified, receipted (and optionally published) artifact.

Stages, in order: pull, inspect, plan, quantize, audit, verify, receipt, card, upload. Each
stage's result is recorded in ``OUT/.ggufmtp/stages/<stage>.json`` under a key computed from its
inputs (the keys of the stages it depends on plus its own parameters). A rerun reuses every
stage whose key is unchanged and whose outputs are still intact, so a run that failed in
``verify`` resumes there, and a changed recipe reruns plan and quantize but not pull.

Each stage is a ``_stage_*`` function below; :func:`run` calls them in order on one ``_Run``
record, which carries the inputs and what the earlier stages found (paths, keys).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable

from .errors import GgufmtpError, PlanError
from .fmt import ci_phrase, pct, times
from .gguf.fsutil import atomic_write_json
from .gguf.model import inspect_model
from .hub.upload import upload as hub_upload
from .measure import verify as verify_mod
from .provenance.audit import audit
from .provenance.card import make_card
from .provenance.receipt import load_receipt, receipt_for_quantize, set_verification
from .quant.plan import make_plan
from .quant.quantize import quantize
from .quant.recipe import Recipe
from .refs import ModelRef, parse_model_ref, resolve

STAGES = ("pull", "inspect", "plan", "quantize", "audit", "verify", "receipt", "card", "upload")

# What the inspect stage keeps of the model report.
_INSPECT_FIELDS = ("architecture", "block_count", "nextn_predict_layers", "mtp_block", "mtp_status", "mtp_missing",
                   "file_type", "n_params", "size_bytes", "bpw")


class StageStatus(enum.StrEnum):
    """What a stage did in this run."""

    RAN = "ran"
    CACHED = "cached"


@dataclasses.dataclass
class StageRecord:
    """One stage of a run: its input key, whether its result came from the cache, and the result
    (the JSON the stage stored in ``OUT/.ggufmtp/stages/<stage>.json``)."""

    stage: str
    key: str
    cached: bool
    result: dict[str, Any]

    @property
    def status(self) -> StageStatus:
        return StageStatus.CACHED if self.cached else StageStatus.RAN


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """The run in one record: what ``ggufmtp run`` prints (:meth:`format`) or emits as JSON (:meth:`to_dict`)."""

    artifact: str
    receipt: str
    card: str | None
    size_bytes: int | None
    bpw: float | None
    mtp_status: str | None
    mtp_block: int | None
    acceptance: float | None
    acceptance_ci95: list[float] | None
    speedup: float | None
    speedup_ci95: list[float] | None
    verdict: str | None
    uploaded: str | None
    stages: dict[str, StageStatus]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stages"] = {k: str(v) for k, v in self.stages.items()}
        return d

    def format(self) -> str:
        return format_summary(self.to_dict())


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

    def _result(self, name: str) -> dict[str, Any]:
        rec = self.stage(name)
        return (rec.result or {}) if rec else {}

    def summary_record(self) -> RunSummary:
        ins, q = self._result("inspect"), self._result("quantize")
        v = self._result("verify").get("verification")
        return RunSummary(
            artifact=str(self.artifact),
            receipt=str(self.receipt),
            card=str(self.card) if self.card else None,
            size_bytes=q.get("size_bytes"),
            bpw=q.get("bpw"),
            mtp_status=q.get("mtp", {}).get("status", ins.get("mtp_status")),
            mtp_block=q.get("mtp", {}).get("block"),
            acceptance=v["mtp"]["acceptance"] if v else None,
            acceptance_ci95=v["mtp"]["acceptance_ci95"] if v else None,
            speedup=v["speedup"] if v else None,
            speedup_ci95=v["speedup_ci95"] if v else None,
            verdict=v["verdict"] if v else None,
            uploaded=self._result("upload").get("commit_url") if self.stage("upload") else None,
            stages={s.stage: s.status for s in self.stages},
        )

    def summary(self) -> dict[str, Any]:
        """The run in one JSON object (``ggufmtp run --json``)."""
        return self.summary_record().to_dict()


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _fingerprint(path: Path) -> dict[str, Any]:
    """Cheap identity of a file a stage produced or consumed (content hashing is the receipt's job)."""
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class _StageCache:
    """Runs a stage unless ``OUT/.ggufmtp/stages/<stage>.json`` holds a successful result for the
    same key whose outputs are still intact; records what happened either way."""

    def __init__(self, out_dir: Path, log: Callable[[str], None], force: bool):
        self.dir = out_dir / ".ggufmtp" / "stages"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.force = force
        self.records: list[StageRecord] = []

    def run(self, stage: str, key: str, fn: Callable[[], dict[str, Any]],
            still_valid: Callable[[dict[str, Any]], bool] = lambda r: True) -> dict[str, Any]:
        path = self.dir / f"{stage}.json"
        if not self.force and path.exists():
            rec = json.loads(path.read_text())
            if rec.get("key") == key and rec.get("ok") and still_valid(rec["result"]):
                self.log(f"[{stage}] cached")
                self.records.append(StageRecord(stage, key, True, rec["result"]))
                return rec["result"]
        self.log(f"[{stage}] running")
        path.unlink(missing_ok=True)
        result = fn()
        atomic_write_json(path, {"stage": stage, "key": key, "ok": True, "result": result})
        self.records.append(StageRecord(stage, key, False, result))
        return result


def _exists(*keys: str) -> Callable[[dict[str, Any]], bool]:
    """A cached result is valid while the files it fingerprinted under ``keys`` are unchanged."""
    def check(r: dict[str, Any]) -> bool:
        for k in keys:
            fp = r.get(k)
            if not fp:
                return False
            p = Path(fp["path"])
            if not p.exists() or p.stat().st_size != fp["size"] or p.stat().st_mtime_ns != fp["mtime_ns"]:
                return False
        return True

    return check


@dataclasses.dataclass
class _Run:
    """The inputs of one :func:`run` and what the stages found so far (each stage reads what the
    earlier ones set)."""

    out: Path
    cache: _StageCache
    recipe: Recipe
    model_arg: str
    ref: ModelRef
    imatrix: str | Path | None
    include: list[str] | None
    threads: int
    token: str | None
    progress: bool
    log: Callable[[str], None]
    model_path: Path = Path()
    manifest: dict[str, Any] | None = None
    model_key: str = ""
    plan_key: str = ""
    artifact_key: str = ""
    verification: dict[str, Any] | None = None
    receipted: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def artifact(self) -> Path:
        stem = self.model_path.name.split("-00001-of-")[0].removesuffix(".gguf")
        return self.out / f"{stem}-{self.recipe.name}.gguf"

    @property
    def receipt(self) -> Path:
        return self.artifact.with_name(self.artifact.name + ".receipt.json")

    @property
    def card(self) -> Path:
        return self.out / "README.md"


def _stage_pull(r: _Run) -> None:
    def do() -> dict[str, Any]:
        got = resolve(r.ref, local_dir=r.out / "base", include=r.include, token=r.token, progress=r.progress)
        return {"model_path": str(got.path), "manifest": got.manifest, "source": _fingerprint(got.path)}

    pull_key = _key("pull", r.ref.kind, r.ref.ident, r.ref.revision, r.include)
    pulled = r.cache.run("pull", pull_key, do, _exists("source"))
    r.model_path, r.manifest = Path(pulled["model_path"]), pulled.get("manifest")
    r.model_key = _key(pull_key, pulled["source"])


def _stage_inspect(r: _Run) -> None:
    def do() -> dict[str, Any]:
        report = inspect_model(r.model_path).to_dict()
        return {k: report[k] for k in _INSPECT_FIELDS}

    r.cache.run("inspect", _key("inspect", r.model_key), do)


def _stage_plan(r: _Run) -> None:
    def do() -> dict[str, Any]:
        p = make_plan(r.model_path, r.recipe, r.imatrix, r.threads)
        if p.errors:
            raise PlanError(f"{r.model_path}: pre-flight checks failed:\n  " + "\n  ".join(p.errors), p.errors)
        d = p.to_dict()
        return {"size_bytes": d["size_bytes"], "bpw": d["bpw"], "mtp": d["mtp"], "warnings": d["warnings"],
                "llama_quantize_command": p.llama_quantize_command("OUT.gguf")}

    im_key = _fingerprint(Path(r.imatrix)) if r.imatrix else None
    r.plan_key = _key("plan", r.model_key, r.recipe.sha256, r.recipe.name, im_key)
    planned = r.cache.run("plan", r.plan_key, do)
    for w in planned["warnings"]:
        r.log(f"warning: {w}")


def _stage_quantize(r: _Run) -> None:
    """Writes the artifact and its base receipt (verification comes later)."""
    def do() -> dict[str, Any]:
        res = quantize(r.model_path, r.recipe, r.artifact, imatrix=r.imatrix, threads=r.threads, progress=r.progress)
        receipt_for_quantize(res, model_arg=r.model_arg, imatrix=r.imatrix, receipt_path=r.receipt,
                             manifest=r.manifest)
        d = res.to_dict()
        d["artifact"] = _fingerprint(r.artifact)
        return d

    quant_key = _key("quantize", r.plan_key)
    quantized = r.cache.run("quantize", quant_key, do, _exists("artifact"))
    r.artifact_key = _key(quant_key, quantized["artifact"])


def _stage_audit(r: _Run) -> None:
    def do() -> dict[str, Any]:
        rep = audit(r.artifact, r.receipt)
        if not rep.ok:
            raise GgufmtpError(f"{r.artifact}: audit failed: "
                               + "; ".join(f"{c.name}: {c.detail}" for c in rep.failures))
        return rep.to_dict()

    r.cache.run("audit", _key("audit", r.artifact_key), do)


def _stage_verify(r: _Run, verify_options: dict[str, Any]) -> None:
    def do() -> dict[str, Any]:
        opts = dict(verify_options)
        opts.setdefault("draft_n_max", r.recipe.verify.draft_n_max)
        opts.setdefault("thresholds", r.recipe.verify)
        # Through the module attribute, so that a patched ``verify`` (tests) is the one called.
        res = verify_mod.verify(r.artifact, progress=r.progress, **opts)
        return {"verification": res.to_receipt()}

    key = _key("verify", r.artifact_key, {k: str(v) for k, v in verify_options.items()},
               dataclasses.asdict(r.recipe.verify))
    r.verification = r.cache.run("verify", key, do)["verification"]


def _stage_receipt(r: _Run) -> None:
    """The verification goes into the receipt."""
    def do() -> dict[str, Any]:
        if r.verification is not None:
            set_verification(r.receipt, r.verification)
        stmt = load_receipt(r.receipt)
        return {"receipt": _fingerprint(r.receipt), "artifact_sha256": stmt["subject"][0]["digest"]["sha256"]}

    r.receipted = r.cache.run("receipt", _key("receipt", r.artifact_key, r.verification), do, _exists("receipt"))


def _stage_card(r: _Run) -> None:
    def do() -> dict[str, Any]:
        make_card(r.artifact, r.receipt, r.card)
        return {"card": _fingerprint(r.card)}

    r.cache.run("card", _key("card", r.receipted["receipt"]), do, _exists("card"))


def _stage_upload(r: _Run, repo_id: str, private: bool, dry_run: bool) -> None:
    def do() -> dict[str, Any]:
        res = hub_upload(repo_id, [r.artifact], [r.receipt], r.card, private=private, token=r.token,
                         dry_run=dry_run, recipe_name=r.recipe.name, artifact_sha256=r.receipted["artifact_sha256"])
        return res.to_dict() if hasattr(res, "to_dict") else {"result": str(res)}

    r.cache.run("upload", _key("upload", repo_id, r.receipted, dry_run, private), do)


def run(recipe: str | Path, model: str, imatrix: str | Path | None = None, out_dir: str | Path = "ggufmtp-out",
        verify: bool = True, upload: str | None = None, *, include: list[str] | None = None,
        verify_options: dict[str, Any] | None = None, threads: int = 0, private: bool = False,
        dry_run_upload: bool = False, token: str | None = None, force: bool = False, progress: bool = True,
        log: Callable[[str], None] = lambda m: None) -> RunResult:
    """Run the whole pipeline; see the module docstring. ``model`` is ``REPO_ID[@REV]``, a local
    GGUF path or ``builtin:NAME``. ``verify_options`` go to :func:`ggufmtp.measure.verify.verify`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    r = _Run(out=out, cache=_StageCache(out, log, force), recipe=Recipe.load(recipe), model_arg=model,
             ref=parse_model_ref(model), imatrix=imatrix, include=include, threads=threads, token=token,
             progress=progress, log=log)
    for stage in (_stage_pull, _stage_inspect, _stage_plan, _stage_quantize, _stage_audit):
        stage(r)
    if verify:
        _stage_verify(r, dict(verify_options or {}))
    _stage_receipt(r)
    _stage_card(r)
    if upload:
        _stage_upload(r, upload, private, dry_run_upload)
    return RunResult(out_dir=out, artifact=r.artifact, receipt=r.receipt, card=r.card, stages=r.cache.records)


def format_summary(s: dict[str, Any]) -> str:
    """The summary for people (what ``ggufmtp run`` prints)."""
    def with_ci(v: float | None, ci: list | None, as_pct: bool) -> str:
        if v is None:
            return "-"
        if as_pct:
            return pct(v, space=False) + ci_phrase(ci, scale=100, digits=1, unit="%", sep="-")
        return times(v, nd=2, sign="x") + ci_phrase(ci, digits=2, unit="x", sep="-")

    rows = [
        ("artifact", s["artifact"]),
        ("size", f"{s['size_bytes']:,} bytes, {s['bpw']:.3f} bpw" if s.get("size_bytes") else "-"),
        ("MTP", f"blk.{s['mtp_block']} {s['mtp_status']}"),
        ("acceptance", with_ci(s["acceptance"], s["acceptance_ci95"], True)),
        ("speedup", with_ci(s["speedup"], s["speedup_ci95"], False)),
        ("verdict", s["verdict"] or "not verified"),
        ("receipt", s["receipt"]),
        ("card", s["card"] or "-"),
    ]
    if s.get("uploaded"):
        rows.append(("uploaded", s["uploaded"]))
    rows.append(("stages", ", ".join(f"{k} {v}" for k, v in s["stages"].items())))
    return "\n".join(f"{k:<11} {v}" for k, v in rows)


def clean(out_dir: str | Path) -> None:
    """Forget every cached stage result in ``out_dir``."""
    shutil.rmtree(Path(out_dir) / ".ggufmtp", ignore_errors=True)
