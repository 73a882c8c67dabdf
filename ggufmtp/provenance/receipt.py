"""Provenance receipts: an in-toto Statement v1 per artifact, with a ggufmtp predicate.

Layout::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "x.gguf", "digest": {"sha256": ...}, "annotations": {"size": N}}, ...],
     "predicateType": "https://ggufmtp.dev/receipt/v1",
     "predicate": {"base_model", "imatrix", "recipe", "result", "toolchain",
                   "started_at", "finished_at", "verification", "integrity"}}

``predicate.integrity.sha256`` is the digest of the canonical JSON of the whole statement with
that field emptied: an edit to any field that does not recompute it is caught by ``audit``.
(It detects edits, not forgery: sign the statement, e.g. with a DSSE envelope, for that.)
The predicate's JSON Schema ships as ``ggufmtp/data/receipt.schema.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..constants import LLAMA_CPP_COMMIT, LLAMA_CPP_PYTHON_VERSION
from ..errors import AuditError
from ..gguf.fsutil import atomic_write_json
from ..gguf.hashing import sha256_file

if TYPE_CHECKING:  # annotations only: quantize pulls in libllama
    from ..quant.quantize import QuantizeResult

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://ggufmtp.dev/receipt/v1"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "data" / "receipt.schema.json"


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def table_digest(types: dict[str, str]) -> str:
    """sha256 of the tensor-name → type table in canonical JSON."""
    return hashlib.sha256(canonical_json(types)).hexdigest()


def integrity_digest(statement: dict[str, Any]) -> str:
    s = json.loads(json.dumps(statement, default=str))
    s.setdefault("predicate", {})["integrity"] = {"sha256": ""}
    return hashlib.sha256(canonical_json(s)).hexdigest()


def seal(statement: dict[str, Any]) -> dict[str, Any]:
    statement["predicate"]["integrity"] = {"sha256": integrity_digest(statement)}
    return statement


def file_entry(path: Path, sha256: str | None = None) -> dict[str, Any]:
    return {"name": path.name, "size": path.stat().st_size, "sha256": sha256 or sha256_file(path)}


def subject_entry(path: Path, sha256: str | None = None) -> dict[str, Any]:
    e = file_entry(path, sha256)
    return {"name": e["name"], "digest": {"sha256": e["sha256"]}, "annotations": {"size": e["size"]}}


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def toolchain(server: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions and build facts of everything that touched the artifact."""
    from ..runtime import build as runtime

    info = runtime.installed_runtime()
    lib_dir = os.environ.get("LLAMA_CPP_LIB_PATH")
    quantizer = {
        "library": "libllama via llama-cpp-python",
        "llama_cpp_commit": info.commit if info else LLAMA_CPP_COMMIT,
        "lib_path": lib_dir,
        "variant": info.variant if info else None,
        "build_flags": info.build_flags if info else [],
    }
    flags = sorted(runtime.cpu_flags() & {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16",
                                          "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"})
    compiler = None
    if info is not None:
        rec = json.loads((info.bin_dir.parent / runtime.RUNTIME_JSON).read_text())
        compiler = rec.get("compiler")
    return {
        "ggufmtp": __version__,
        "python": sys.version.split()[0],
        "gguf": _dist_version("gguf"),
        "llama_cpp_python": _dist_version("llama-cpp-python") or LLAMA_CPP_PYTHON_VERSION,
        "quantizer": quantizer,
        "server": server,
        "compiler": compiler,
        "cpu_flags": flags,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
    }


def base_model_section(model_path: Path, model_arg: str | None = None,
                       manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where the input came from and every input file with size and sha256."""
    from ..gguf.model import split_shards

    shards = split_shards(Path(model_path))
    if manifest:
        by_name = {f["path"].split("/")[-1]: f for f in manifest.get("files", [])}
        files = [file_entry(s, by_name.get(s.name, {}).get("sha256")) for s in shards]
        source = {"type": "hub", "repo_id": manifest.get("repo_id"),
                  "revision": manifest.get("requested_revision"), "commit": manifest.get("resolved_commit")}
    else:
        files = [file_entry(s) for s in shards]
        arg = model_arg or str(model_path)
        source = ({"type": "builtin", "name": arg.split(":", 1)[1], "path": str(model_path)}
                  if arg.startswith("builtin:") else {"type": "local", "path": str(Path(model_path).resolve())})
    from ..gguf.model import GGUFModel

    lic = GGUFModel(model_path).metadata.get("general.license")
    if isinstance(lic, str) and lic:
        source["license"] = lic
    return {"source": source, "files": files}


def imatrix_section(imatrix: str | Path | None, missing: list[str]) -> dict[str, Any] | None:
    if not imatrix:
        return None
    from ..imatrix.format import read_imatrix

    im = read_imatrix(imatrix)
    return {"file": Path(imatrix).name, "sha256": sha256_file(imatrix), "format": im.format,
            "datasets": list(im.datasets), "chunk_count": im.chunk_count, "entries": len(im.entries),
            "missing": missing}


def build_statement(outputs: list[Path], predicate: dict[str, Any], output_sha256: dict[str, str] | None = None
                    ) -> dict[str, Any]:
    output_sha256 = output_sha256 or {}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [subject_entry(p, output_sha256.get(str(p))) for p in outputs],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def default_receipt_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + ".receipt.json")


def write_receipt(result: QuantizeResult, receipt_path: str | Path | None = None,
                  imatrix: str | Path | None = None, model_arg: str | None = None,
                  manifest: dict[str, Any] | None = None) -> Path:
    """Write the receipt of a :func:`~ggufmtp.quant.quantize.quantize` result (default
    ``OUT.gguf.receipt.json``); ``imatrix`` defaults to the one the plan used. Returns its path."""
    return receipt_for_quantize(result, model_arg=model_arg, imatrix=imatrix or result.plan.imatrix,
                                receipt_path=receipt_path, manifest=manifest)


def receipt_for_quantize(res: QuantizeResult, model_arg: str | None = None, imatrix: str | Path | None = None,
                         receipt_path: str | Path | None = None, manifest: dict[str, Any] | None = None,
                         verification: dict[str, Any] | None = None) -> Path:
    """Write the receipt of a :class:`~ggufmtp.quant.quantize.QuantizeResult`; returns its path."""
    from ..gguf.model import GGUFModel, check_mtp

    out = Path(res.output)
    gm = GGUFModel(out)
    mtp = check_mtp(gm)
    types = gm.type_table()
    plan = res.plan
    rec = plan.recipe_obj
    predicate = {
        "base_model": base_model_section(Path(plan.model), model_arg, manifest),
        "imatrix": imatrix_section(imatrix, plan.imatrix_missing) if imatrix else None,
        "recipe": {
            "name": plan.recipe,
            "file": Path(rec.path).name if rec and rec.path else None,
            "sha256": rec.sha256 if rec else None,
            "ftype": plan.ftype,
            "output_type": rec.output_type if rec else None,
            "token_embedding_type": rec.token_embedding_type if rec else None,
            "rules": [{"pattern": r.pattern, "type": r.type, "source": r.source} for r in plan.rules],
            "llama_quantize_command": plan.llama_quantize_command(out.name),
        },
        "result": {
            "tensor_types": types,
            "tensor_types_sha256": table_digest(types),
            "mtp_block": mtp.block,
            "mtp_status": mtp.status,
            "nextn_predict_layers": gm.nextn_predict_layers,
            "file_type": gm.file_type,
            "size_bytes": gm.size_bytes,
            "n_params": gm.n_params,
            "bpw": round(gm.bpw, 4),
        },
        "toolchain": toolchain(),
        "started_at": res.started_at,
        "finished_at": res.finished_at,
        "verification": verification,
    }
    statement = seal(build_statement([out], predicate))
    validate_statement(statement)
    path = Path(receipt_path) if receipt_path else default_receipt_path(out)
    atomic_write_json(path, statement)
    return path


def load_receipt(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise AuditError(f"{p}: no such receipt") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AuditError(f"{p}: not a JSON receipt ({e})") from None
    if not isinstance(data, dict) or data.get("_type") != STATEMENT_TYPE:
        raise AuditError(f"{p}: not an in-toto Statement v1 (_type is {data.get('_type') if isinstance(data, dict) else None!r})")
    return data


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def schema_errors(statement: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    return [f"{'/'.join(str(x) for x in e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(statement), key=lambda e: list(e.absolute_path))]


def validate_statement(statement: dict[str, Any]) -> None:
    errs = schema_errors(statement)
    if errs:
        raise AuditError("receipt does not match its schema: " + "; ".join(errs[:5]))


# Sections that tune, curve and profiles add to a verification; a new verify run keeps them.
ADDED_VERIFICATION_SECTIONS = ("tuned", "profiles", "acceptance_curve")


def set_verification(path: str | Path, verification: dict[str, Any], keep_added: bool = False) -> dict[str, Any]:
    """Fill the receipt's ``verification`` slot (re-sealing it) and write it back atomically.
    ``keep_added``: carry over what tune, curve and profiles stored in the old section (a
    ``tuned`` of this verification, from a sweep, wins; an older sweep's is not carried)."""
    st = load_receipt(path)
    old = st["predicate"].get("verification") or {}
    if keep_added:
        kept = {k: old[k] for k in ADDED_VERIFICATION_SECTIONS if old.get(k) and not verification.get(k)}
        if (kept.get("tuned") or {}).get("kind") != "ggufmtp tune":
            kept.pop("tuned", None)  # an older verify sweep's recommendation describes an older run
        verification = {**verification, **kept}
    st["predicate"]["verification"] = verification
    if verification.get("server"):
        st["predicate"]["toolchain"]["server"] = verification["server"]
    seal(st)
    validate_statement(st)
    atomic_write_json(Path(path), st)
    return st


def format_receipt(st: dict[str, Any]) -> str:
    p = st.get("predicate", {})
    lines = [f"receipt ({st.get('predicateType')})"]
    for s in st.get("subject", []):
        lines.append(f"  artifact  {s['name']}  {s.get('annotations', {}).get('size')} bytes  sha256 {s['digest']['sha256']}")
    bm = p.get("base_model") or {}
    src = bm.get("source", {})
    lines.append(f"  base      {src.get('repo_id') or src.get('name') or src.get('path')}"
                 + (f" @ {src['commit']}" if src.get("commit") else ""))
    for f in bm.get("files", []):
        lines.append(f"            {f['name']}  {f['size']} bytes  sha256 {f['sha256']}")
    im = p.get("imatrix")
    lines.append(f"  imatrix   {im['file']} sha256 {im['sha256']} ({im['format']}, {im['entries']} entries, "
                 f"{im['chunk_count']} chunks, datasets {im['datasets']}, no stats for {len(im['missing'])})"
                 if im else "  imatrix   none")
    r = p.get("recipe", {})
    lines.append(f"  recipe    {r.get('name')} ({r.get('ftype')}) sha256 {r.get('sha256')}")
    for rule in r.get("rules", []):
        lines.append(f"            {rule['source']:<18} {rule['pattern']} -> {rule['type']}")
    res = p.get("result", {})
    lines.append(f"  result    {res.get('file_type')}, {res.get('size_bytes')} bytes, {res.get('bpw')} bpw, "
                 f"{len(res.get('tensor_types', {}))} tensors (table sha256 {str(res.get('tensor_types_sha256'))[:16]}...)")
    lines.append(f"  MTP       blk.{res.get('mtp_block')} {res.get('mtp_status')}, "
                 f"nextn_predict_layers {res.get('nextn_predict_layers')}")
    tc = p.get("toolchain", {})
    q = tc.get("quantizer", {})
    lines.append(f"  toolchain ggufmtp {tc.get('ggufmtp')}, llama.cpp {q.get('llama_cpp_commit')} ({q.get('variant')}), "
                 f"llama-cpp-python {tc.get('llama_cpp_python')}, gguf {tc.get('gguf')}, python {tc.get('python')}")
    lines.append(f"            {tc.get('compiler')}; {tc.get('os')}; cpu {' '.join(tc.get('cpu_flags', []))}")
    lines.append(f"  time      {p.get('started_at')} -> {p.get('finished_at')}")
    v = p.get("verification")
    if v:
        m = v.get("mtp", {})
        lines.append(f"  verified  acceptance {m.get('acceptance')} CI95 {m.get('acceptance_ci95')}, "
                     f"speedup {v.get('speedup')} CI95 {v.get('speedup_ci95')}, verdict {v.get('verdict')}")
    else:
        lines.append("  verified  not yet")
    return "\n".join(lines)


def read_statement(path: str | Path) -> dict[str, Any] | None:
    """The statement in a receipt file, plain JSON or wrapped in a DSSE envelope (``payloadType`` +
    base64 ``payload``); None when the file is unreadable or holds no JSON object. Unlike
    ``load_receipt`` it neither raises nor checks ``_type``: for callers that only glean facts."""
    import base64  # stdlib; kept local so this reader stays one self-contained addition

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("payload"), str) and "payloadType" in data:
        try:
            data = json.loads(base64.b64decode(data["payload"]))
        except ValueError:
            return None
    return data if isinstance(data, dict) else None
