"""``ggufmtp run``: checkpoint to verified, receipted (and optionally published) artifact.

Stages, in order: pull, inspect, plan, quantize, audit, verify, receipt, card, upload. Each
stage's result is recorded in ``OUT/.ggufmtp/stages/<stage>.json`` under a key computed from its
inputs (the keys of the stages it depends on plus its own parameters). A rerun reuses every
stage whose key is unchanged and whose outputs are still intact, so a run that failed in
``verify`` resumes there, and a changed recipe reruns plan and quantize but not pull.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable

from .errors import GgufmtpError, PlanError
from .gguf.fsutil import atomic_write_json
from .quant.recipe import Recipe

STAGES = ("pull", "inspect", "plan", "quantize", "audit", "verify", "receipt", "card", "upload")


@dataclasses.dataclass
class StageRecord:
    stage: str
    key: str
    cached: bool
    result: dict[str, Any]


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

    def summary(self) -> dict[str, Any]:
        ins = self.stage("inspect").result if self.stage("inspect") else {}
        q = self.stage("quantize").result if self.stage("quantize") else {}
        v = (self.stage("verify").result or {}).get("verification") if self.stage("verify") else None
        return {
            "artifact": str(self.artifact),
            "receipt": str(self.receipt),
            "card": str(self.card) if self.card else None,
            "size_bytes": q.get("size_bytes"),
            "bpw": q.get("bpw"),
            "mtp_status": q.get("mtp", {}).get("status", ins.get("mtp_status")),
            "mtp_block": q.get("mtp", {}).get("block"),
            "acceptance": v["mtp"]["acceptance"] if v else None,
            "acceptance_ci95": v["mtp"]["acceptance_ci95"] if v else None,
            "speedup": v["speedup"] if v else None,
            "speedup_ci95": v["speedup_ci95"] if v else None,
            "verdict": v["verdict"] if v else None,
            "uploaded": (self.stage("upload").result or {}).get("commit_url") if self.stage("upload") else None,
            "stages": {s.stage: ("cached" if s.cached else "ran") for s in self.stages},
        }


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _fingerprint(path: Path) -> dict[str, Any]:
    """Cheap identity of a file a stage produced or consumed (content hashing is the receipt's job)."""
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class _Stages:
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


def parse_model_arg(model: str) -> tuple[str, str, str | None]:
    """``builtin:NAME`` | a local path | ``REPO_ID[@REV]`` → (kind, id, revision)."""
    if model.startswith("builtin:"):
        return "builtin", model, None
    if Path(model).exists():
        return "local", str(Path(model).resolve()), None
    repo, _, rev = model.partition("@")
    if repo.count("/") != 1 or repo.startswith(("/", ".")):
        raise GgufmtpError(f"{model}: not a file, not builtin:NAME and not a Hub repo id (owner/name[@revision])")
    return "hub", repo, rev or None


def run(recipe: str | Path, model: str, imatrix: str | Path | None = None, out_dir: str | Path = "ggufmtp-out",
        verify: bool = True, upload: str | None = None, *, include: list[str] | None = None,
        verify_options: dict[str, Any] | None = None, threads: int = 0, private: bool = False,
        dry_run_upload: bool = False, token: str | None = None, force: bool = False, progress: bool = True,
        log: Callable[[str], None] = lambda m: None) -> RunResult:
    """Run the whole pipeline; see the module docstring. ``model`` is ``REPO_ID[@REV]``, a local
    GGUF path or ``builtin:NAME``. ``verify_options`` go to :func:`ggufmtp.verify.verify`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    st = _Stages(out, log, force)
    rec = Recipe.load(recipe)
    kind, ident, rev = parse_model_arg(model)
    im_key = _fingerprint(Path(imatrix)) if imatrix else None

    # --- pull ----------------------------------------------------------------------------------
    def do_pull() -> dict[str, Any]:
        if kind == "builtin":
            from .synth.factory import builtin_path

            path = builtin_path(ident)
            return {"model_path": str(path), "manifest": None, "source": _fingerprint(path)}
        if kind == "local":
            return {"model_path": ident, "manifest": None, "source": _fingerprint(Path(ident))}
        from .hub.hub import pull

        res = pull(ident, revision=rev, include=include, local_dir=out / "base", token=token, progress=progress)
        if res.model_path is None:
            raise GgufmtpError(f"{ident}: the pulled files hold {len(res.gguf_models)} GGUF models; "
                               f"choose one with --include")
        return {"model_path": str(res.model_path), "manifest": res.to_dict(), "source": _fingerprint(res.model_path)}

    pull_key = _key("pull", kind, ident, rev, include)
    pulled = st.run("pull", pull_key, do_pull, _exists("source"))
    model_path = Path(pulled["model_path"])
    model_key = _key(pull_key, pulled["source"])

    # --- inspect -------------------------------------------------------------------------------
    def do_inspect() -> dict[str, Any]:
        from .gguf.model import inspect_model

        r = inspect_model(model_path).to_dict()
        return {k: r[k] for k in ("architecture", "block_count", "nextn_predict_layers", "mtp_block", "mtp_status",
                                  "mtp_missing", "file_type", "n_params", "size_bytes", "bpw")}

    st.run("inspect", _key("inspect", model_key), do_inspect)

    # --- plan ----------------------------------------------------------------------------------
    plan_key = _key("plan", model_key, rec.sha256, rec.name, im_key)

    def do_plan() -> dict[str, Any]:
        from .quant.plan import make_plan

        p = make_plan(model_path, rec, imatrix, threads)
        if p.errors:
            raise PlanError(f"{model_path}: pre-flight checks failed:\n  " + "\n  ".join(p.errors), p.errors)
        d = p.to_dict()
        return {"size_bytes": d["size_bytes"], "bpw": d["bpw"], "mtp": d["mtp"], "warnings": d["warnings"],
                "llama_quantize_command": p.llama_quantize_command("OUT.gguf")}

    planned = st.run("plan", plan_key, do_plan)
    for w in planned["warnings"]:
        log(f"warning: {w}")

    # --- quantize (writes the artifact and its base receipt) ------------------------------------
    artifact = out / f"{model_path.name.split('-00001-of-')[0].removesuffix('.gguf')}-{rec.name}.gguf"
    receipt_path = artifact.with_name(artifact.name + ".receipt.json")
    quant_key = _key("quantize", plan_key)

    def do_quantize() -> dict[str, Any]:
        from .quant.quantize import quantize
        from .provenance.receipt import receipt_for_quantize

        res = quantize(model_path, rec, artifact, imatrix=imatrix, threads=threads, progress=progress)
        receipt_for_quantize(res, model_arg=model, imatrix=imatrix, receipt_path=receipt_path,
                             manifest=pulled.get("manifest"))
        d = res.to_dict()
        d["artifact"] = _fingerprint(artifact)
        return d

    quantized = st.run("quantize", quant_key, do_quantize, _exists("artifact"))
    art_key = _key(quant_key, quantized["artifact"])

    # --- audit ---------------------------------------------------------------------------------
    def do_audit() -> dict[str, Any]:
        from .provenance.audit import audit

        rep = audit(artifact, receipt_path)
        if not rep.ok:
            raise GgufmtpError(f"{artifact}: audit failed: "
                               + "; ".join(f"{c.name}: {c.detail}" for c in rep.failures))
        return rep.to_dict()

    st.run("audit", _key("audit", art_key), do_audit)

    # --- verify --------------------------------------------------------------------------------
    vopts = dict(verify_options or {})
    verification = None
    if verify:
        def do_verify() -> dict[str, Any]:
            from .measure.verify import verify as run_verify

            opts = dict(vopts)
            opts.setdefault("draft_n_max", rec.verify.draft_n_max)
            opts.setdefault("thresholds", rec.verify)
            res = run_verify(artifact, progress=progress, **opts)
            return {"verification": res.to_receipt()}

        verification = st.run("verify", _key("verify", art_key, {k: str(v) for k, v in vopts.items()},
                                             dataclasses.asdict(rec.verify)), do_verify)["verification"]

    # --- receipt (the verification goes into the receipt) -------------------------------------
    def do_receipt() -> dict[str, Any]:
        from .provenance.receipt import load_receipt, set_verification

        if verification is not None:
            set_verification(receipt_path, verification)
        stmt = load_receipt(receipt_path)
        return {"receipt": _fingerprint(receipt_path), "artifact_sha256": stmt["subject"][0]["digest"]["sha256"]}

    receipted = st.run("receipt", _key("receipt", art_key, verification), do_receipt, _exists("receipt"))

    # --- card ----------------------------------------------------------------------------------
    card_path = out / "README.md"

    def do_card() -> dict[str, Any]:
        from .provenance.card import make_card

        make_card(artifact, receipt_path, card_path)
        return {"card": _fingerprint(card_path)}

    st.run("card", _key("card", receipted["receipt"]), do_card, _exists("card"))

    # --- upload --------------------------------------------------------------------------------
    if upload:
        def do_upload() -> dict[str, Any]:
            from .hub.hub import upload as hub_upload

            r = hub_upload(upload, [artifact], [receipt_path], card_path, private=private, token=token,
                           dry_run=dry_run_upload, recipe_name=rec.name,
                           artifact_sha256=receipted["artifact_sha256"])
            return r.to_dict() if hasattr(r, "to_dict") else {"result": str(r)}

        st.run("upload", _key("upload", upload, receipted, dry_run_upload, private), do_upload)
    return RunResult(out_dir=out, artifact=artifact, receipt=receipt_path, card=card_path, stages=st.records)


def format_summary(s: dict[str, Any]) -> str:
    def ci(v, lo_hi, pct):
        if v is None:
            return "-"
        if pct:
            return f"{100 * v:.1f}%" + (f" (95% CI {100 * lo_hi[0]:.1f}-{100 * lo_hi[1]:.1f}%)" if lo_hi else "")
        return f"{v:.2f}x" + (f" (95% CI {lo_hi[0]:.2f}-{lo_hi[1]:.2f}x)" if lo_hi else "")

    rows = [
        ("artifact", s["artifact"]),
        ("size", f"{s['size_bytes']:,} bytes, {s['bpw']:.3f} bpw" if s.get("size_bytes") else "-"),
        ("MTP", f"blk.{s['mtp_block']} {s['mtp_status']}"),
        ("acceptance", ci(s["acceptance"], s["acceptance_ci95"], True)),
        ("speedup", ci(s["speedup"], s["speedup_ci95"], False)),
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
