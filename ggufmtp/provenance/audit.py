"""``ggufmtp audit``: check an artifact against its receipt, or against itself.

With a receipt: the schema, the receipt's own integrity digest, that the receipt names these
files, every file's size and sha256, every tensor's type, the tensor table digest, the MTP block
and the recorded result figures. Without one: what the file alone can show (it reads as a GGUF,
its MTP block, its ``quantize.imatrix.*`` metadata).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import GGUFReadError, GgufmtpError
from ..gguf.hashing import sha256_file
from ..gguf.model import GGUFModel, check_mtp, split_shards
from ..provenance.receipt import default_receipt_path, integrity_digest, load_receipt, schema_errors, table_digest


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclasses.dataclass
class AuditReport:
    artifact: str
    receipt: str | None
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "artifact": self.artifact, "receipt": self.receipt,
                "checks": [dataclasses.asdict(c) for c in self.checks]}


def audit(artifact: str | Path, receipt: str | Path | None = None, progress: bool = False) -> AuditReport:
    """Audit ``artifact`` (any shard of a split model). ``receipt`` defaults to
    ``ARTIFACT.receipt.json`` when that file exists."""
    artifact = Path(artifact)
    if receipt is None and default_receipt_path(artifact).exists():
        receipt = default_receipt_path(artifact)
    checks: list[Check] = []
    try:
        shards = split_shards(artifact) if artifact.exists() else [artifact]
    except GGUFReadError as e:
        shards = None
        checks.append(Check("all shards present", False, str(e)))
    model = None
    if shards is not None:
        try:
            model = GGUFModel(artifact)
            checks.append(Check("readable GGUF", True, f"{len(model.tensors)} tensors in {len(shards)} file(s)"))
        except GgufmtpError as e:
            checks.append(Check("readable GGUF", False, str(e)))
    if receipt is not None:
        checks += _against_receipt(artifact, shards, model, Path(receipt), progress)
    elif model is not None:
        checks += _standalone(model)
    return AuditReport(str(artifact), str(receipt) if receipt else None, checks)


def _standalone(model: GGUFModel) -> list[Check]:
    mtp = check_mtp(model)
    out = [Check("MTP block", mtp.status == "complete",
                 f"{mtp.status}" + (f" (blk.{mtp.block})" if mtp.block is not None else "")
                 + (f"; missing {', '.join(mtp.missing)}" if mtp.missing else ""))]
    md = model.metadata
    keys = [k for k in md if k.startswith("quantize.imatrix.")]
    if keys:
        entries = md.get("quantize.imatrix.entries_count")
        ok = isinstance(entries, int) and entries > 0 and "quantize.imatrix.file" in md
        out.append(Check("quantize.imatrix metadata", ok,
                         ", ".join(f"{k.split('.')[-1]}={md[k]}" for k in sorted(keys))))
    else:
        out.append(Check("quantize.imatrix metadata", True, "none (quantized without an imatrix, or not by llama.cpp)"))
    return out


def _against_receipt(artifact: Path, shards: list[Path] | None, model: GGUFModel | None, receipt: Path,
                     progress: bool) -> list[Check]:
    try:
        st = load_receipt(receipt)
    except GgufmtpError as e:
        return [Check("receipt readable", False, str(e))]
    checks = _statement_checks(st) + _file_checks(artifact, shards, st, progress)
    if model is not None:
        checks += _model_checks(model, st)
    return checks


def _statement_checks(st: dict[str, Any]) -> list[Check]:
    """The receipt against its schema and its own integrity digest."""
    errs = schema_errors(st)
    recorded = (st.get("predicate", {}).get("integrity") or {}).get("sha256")
    actual = integrity_digest(st)
    return [Check("receipt schema", not errs, "; ".join(errs[:3]) or "valid"),
            Check("receipt integrity", recorded == actual,
                  "unchanged since written" if recorded == actual else
                  f"receipt was edited after it was written (digest {str(recorded)[:12]}... != {actual[:12]}...)")]


def _file_checks(artifact: Path, shards: list[Path] | None, st: dict[str, Any], progress: bool) -> list[Check]:
    """The receipt names these files, all are present, and each has the recorded size and sha256."""
    subjects = {s.get("name"): s for s in st.get("subject", []) if isinstance(s, dict)}
    names = [p.name for p in shards] if shards else [artifact.name]
    foreign = [n for n in names if n not in subjects]
    checks = [Check("receipt names this artifact", not foreign,
                    f"receipt covers {', '.join(subjects) or 'nothing'}; not {', '.join(foreign)}" if foreign
                    else ", ".join(names))]
    missing = [n for n in subjects if not (artifact.parent / n).exists()]
    if missing:
        checks.append(Check("all shards present", False, f"missing {', '.join(missing)}"))
    for name, subj in subjects.items():
        p = artifact.parent / name
        if not p.exists():
            continue
        want = subj.get("digest", {}).get("sha256")
        size = subj.get("annotations", {}).get("size")
        got_size = p.stat().st_size
        if size is not None and size != got_size:
            checks.append(Check(f"sha256 {name}", False, f"size: receipt {size}, file {got_size}"))
            continue
        got = sha256_file(p, progress=progress)
        checks.append(Check(f"sha256 {name}", got == want, got if got == want else f"receipt {want}, file {got}"))
    return checks


def _model_checks(model: GGUFModel, st: dict[str, Any]) -> list[Check]:
    """What the file's GGUF says against the receipt's result: tensor types, MTP block, figures, imatrix."""
    checks: list[Check] = []
    res = st.get("predicate", {}).get("result", {})
    want_types: dict[str, str] = res.get("tensor_types", {})
    have = model.type_table()
    diffs = [f"{n}: receipt {t}, file {have.get(n, 'absent')}" for n, t in want_types.items() if have.get(n) != t]
    diffs += [f"{n}: receipt absent, file {have[n]}" for n in have if n not in want_types]
    checks.append(Check("tensor types", not diffs, "; ".join(diffs[:5]) + (" ..." if len(diffs) > 5 else "")
                        if diffs else f"{len(have)} tensors match"))
    digest_ok = table_digest(want_types) == res.get("tensor_types_sha256")
    checks.append(Check("tensor table digest", digest_ok,
                        "matches" if digest_ok else "receipt's tensor_types does not match its own digest"))
    mtp = check_mtp(model)
    ok = mtp.status == res.get("mtp_status") and mtp.block == res.get("mtp_block")
    checks.append(Check("MTP block", ok and mtp.status == "complete",
                        f"file blk.{mtp.block} {mtp.status}; receipt blk.{res.get('mtp_block')} {res.get('mtp_status')}"
                        + (f"; missing {', '.join(mtp.missing)}" if mtp.missing else "")))
    figures = {"file_type": model.file_type, "nextn_predict_layers": model.nextn_predict_layers,
               "size_bytes": model.size_bytes, "bpw": round(model.bpw, 4)}
    bad = [f"{k}: receipt {res.get(k)}, file {v}" for k, v in figures.items() if res.get(k) != v]
    checks.append(Check("result figures", not bad, "; ".join(bad) or "file_type, layers, size, bpw match"))
    im = st.get("predicate", {}).get("imatrix")
    md_entries = model.metadata.get("quantize.imatrix.entries_count")
    if im:
        ok = md_entries == im.get("entries")
        checks.append(Check("imatrix metadata", ok, f"file entries_count {md_entries}, receipt entries {im.get('entries')}"))
    return checks


def format_audit(r: AuditReport) -> str:
    lines = [f"audit {r.artifact}" + (f" against {r.receipt}" if r.receipt else " (no receipt: file-only checks)")]
    for c in r.checks:
        lines.append(f"  {'✓' if c.ok else '✗'} {c.name}: {c.detail}")
    lines.append("PASS" if r.ok else f"FAIL ({len(r.failures)} check(s) failed)")
    return "\n".join(lines)
