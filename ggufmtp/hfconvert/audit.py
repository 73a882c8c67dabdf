"""``audit MODEL.gguf --source SRC``: the GGUF's tensors against the safetensors they were converted from.

The name map and the value transforms are the pinned converter's own: a subprocess
(``runner --audit``) instantiates the converter's model class for the checkpoint and runs each
source tensor through its ``filter_tensors`` + ``modify_tensors`` (MTP remapping, norm offsets,
expert stacking, ...), one tensor at a time, then encodes it at the GGUF tensor's type with gguf-py's
own rounding. A match is byte equality with the GGUF (exact for BF16 -> BF16; F16 and Q8_0 match
when they are the converter's rounding of the source); ``max_abs_err`` says how far the stored values
are from the source's. By default the MTP block is audited; ``all_tensors`` audits every tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from .._version import __version__
from ..constants import LLAMA_CPP_COMMIT
from ..errors import ConvertError
from ..files.hashing import sha256_file
from ..files.memo import JsonMemo
from ..gguf.model import GGUFModel
from ..jsontypes import JsonObject
from ..provenance.statement import SourceSection
from ..runtime.build import cache_root
from .convert import converter_tree, require_convert_deps
from .source import read_checkpoint

__all__ = ["TensorMatch", "SourceAudit", "audit_source"]


@dataclass(frozen=True)
class TensorMatch:
    name: str
    match: bool
    type: str | None = None
    max_abs_err: float | None = None
    problem: str | None = None

    def to_dict(self) -> JsonObject:
        return {k: v for k, v in {"name": self.name, "match": self.match, "type": self.type,
                                  "max_abs_err": self.max_abs_err, "problem": self.problem}.items() if v is not None}


@dataclass
class SourceAudit:
    """The result, and the receipt's ``source`` section (``to_section``)."""

    model: Path
    source_dir: Path
    scope: str  # "mtp" or "all"
    tensors: list[TensorMatch]
    files: dict[str, str]  # checkpoint file -> sha256
    repo_id: str | None = None
    commit: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.tensors) and all(t.match for t in self.tensors)

    @property
    def mismatches(self) -> list[TensorMatch]:
        return [t for t in self.tensors if not t.match]

    def to_section(self) -> JsonObject:
        return {"format": "safetensors", "name": self.source_dir.name, "repo_id": self.repo_id,
                "revision": self.commit, "scope": self.scope, "ok": self.ok,
                "files": [{"path": n, "sha256": d} for n, d in sorted(self.files.items())],
                "tensors": [t.to_dict() for t in self.tensors]}

    def to_dict(self) -> JsonObject:
        return {"model": str(self.model), **self.to_section(), "path": str(self.source_dir), "n_tensors": len(self.tensors),
                "n_mismatches": len(self.mismatches)}

    def summary(self) -> str:
        head = (f"{self.model} vs {self.source_dir}: {len(self.tensors)} {self.scope} tensor(s) compared, "
                f"{len(self.mismatches)} mismatch(es)")
        lines = [head] + [f"  MISMATCH {t.name}: {t.problem or f'{t.type} bytes differ (max |err| {t.max_abs_err:.3g})'}"
                          for t in self.mismatches[:20]]
        return "\n".join(lines + ([f"  all {len(self.tensors)} tensors match the source"] if self.ok else []))


class JobTensor(TypedDict):
    type: str
    shape: list[int]
    offset: int
    nbytes: int
    mtp: bool


class AuditJob(TypedDict):
    """What the runner (``python -m ggufmtp.hfconvert.runner --audit``) reads: the GGUF's tensors to compare."""

    gguf: str
    source_dir: str
    trunk_layers: int
    only_mtp: bool
    tensors: dict[str, JobTensor]


def _job(model: GGUFModel, source_dir: Path, trunk: int, only_mtp: bool) -> AuditJob:
    mtp_prefixes = tuple(f"blk.{b}." for b in model.mtp_blocks)
    return {"gguf": str(model.path), "source_dir": str(source_dir), "trunk_layers": trunk, "only_mtp": only_mtp,
            "tensors": {n: {"type": t.type, "shape": list(t.shape), "offset": model.tensor_data_offsets[n],
                            "nbytes": t.n_bytes, "mtp": n.startswith(mtp_prefixes)}
                        for n, t in model.tensors.items()}}


def _recorded_source(model_path: Path) -> tuple[str | None, str | None]:
    from ..provenance.receipt import converted_from

    data = converted_from(model_path) or {}
    return data.get("repo_id"), data.get("commit")


def audit_source(model_path: str | os.PathLike, source: str | os.PathLike, *, all_tensors: bool = False,
                 progress: bool = True) -> SourceAudit:
    """Compare the MTP block (or every tensor) of ``model_path`` with the safetensors checkpoint ``source``."""
    require_convert_deps()
    model_path = Path(model_path)
    model = GGUFModel(model_path)
    if len(model.shards) > 1:
        raise ConvertError(f"{model_path}: audit --source reads single-file GGUFs")
    ckpt = read_checkpoint(source)
    trunk = ckpt.mtp.trunk_layers if ckpt.mtp.trunk_layers is not None else model.trunk_layers
    if not all_tensors and not model.mtp_blocks:
        raise ConvertError(f"{model_path}: no MTP block to audit (use --all to compare every tensor)")
    digests = ckpt.hash_files(progress=progress)
    key = _comparison_key(model_path, digests, trunk, all_tensors)
    rows = _comparisons().get(key)
    if not isinstance(rows, list):
        rows = _compare(model, ckpt.directory, trunk, all_tensors)
        _comparisons().put(key, rows)
    tensors = sorted((TensorMatch(r["name"], r["match"], r.get("type"), r.get("max_abs_err"), r.get("problem"))
                      for r in rows), key=lambda t: t.name)
    repo_id, commit = _recorded_source(model_path)
    return SourceAudit(model_path, ckpt.directory, "all" if all_tensors else "mtp", tensors, digests, repo_id, commit)


def _compare(model: GGUFModel, source_dir: Path, trunk: int, all_tensors: bool) -> list[JsonObject]:
    """The pinned converter's model class on the checkpoint, tensor by tensor against the GGUF (a
    subprocess: the converter imports torch)."""
    with tempfile.TemporaryDirectory() as tmp:
        job, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job.write_text(json.dumps(_job(model, source_dir, trunk, not all_tensors)))
        proc = subprocess.run([sys.executable, "-m", "ggufmtp.hfconvert.runner", "--audit", str(converter_tree()),
                               str(job), str(result)], capture_output=True, text=True, errors="replace")
        if proc.returncode != 0 or not result.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConvertError(f"audit --source: the converter's model class failed on {source_dir}: {last[-300:]}")
        return cast(list[JsonObject], json.loads(result.read_text()))


def _comparisons() -> JsonMemo:
    """Source comparisons already made, by content: the converter run costs seconds (torch's import
    alone) to hours (a large checkpoint), and its answer is fixed by the bytes on both sides."""
    return JsonMemo(cache_root() / "source-audits.json", max_entries=256)


def _comparison_key(model_path: Path, source_digests: dict[str, str], trunk: int, all_tensors: bool) -> str:
    """The GGUF's sha256, every checkpoint file's, the trunk depth, the scope, the pinned llama.cpp
    commit and ggufmtp's version: a comparison is reused only for the same bytes on both sides."""
    blob = json.dumps({"gguf": sha256_file(model_path), "source": source_digests, "trunk": trunk, "all": all_tensors,
                       "llama_cpp": LLAMA_CPP_COMMIT, "ggufmtp": __version__}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def record_source_audit(res: SourceAudit, receipt: str | os.PathLike, signing_key: str | os.PathLike | None = None
                        ) -> SourceSection:
    """Store a passing source audit as the receipt's ``source`` section, bound to the artifact's
    digest (``artifact_sha256``): the artifact must be the receipt's (its first subject's sha256)
    and the comparison must have found no mismatch. The one way a source audit reaches a receipt
    (``ggufmtp receipt add-source``; ``audit --source`` never writes). Returns the section."""
    from ..errors import AuditError
    from ..files.hashing import sha256_file
    from ..provenance.audit import checkpoint_difference
    from ..provenance.receipt import read_receipt, set_section

    rc = read_receipt(receipt)
    if not res.ok:
        raise AuditError(f"{res.model}: the source audit found {len(res.mismatches)} mismatch(es) with {res.source_dir}; "
                         f"a failed comparison is not recorded in {receipt}")
    digest = sha256_file(res.model)
    if digest != rc.artifact.sha256:
        raise AuditError(f"{receipt}: describes {rc.artifact.name} (sha256 {rc.artifact.sha256}), not {res.model} "
                         f"(sha256 {digest}); the source audit is not recorded")
    section = {**res.to_section(), "artifact_sha256": digest}
    converted = (rc.predicate["base_model"].get("converted_from") or {}).get("files")
    problem = checkpoint_difference({f["path"]: f["sha256"] for f in converted},
                                    {f["path"]: f["sha256"] for f in section["files"]}) if converted else None
    if problem:
        raise AuditError(f"{res.source_dir}: not the checkpoint {receipt} records the base model was converted from "
                         f"(base_model.converted_from): {problem}; the source audit is not recorded")
    set_section(receipt, "source", section, signing_key)
    return cast(SourceSection, section)
