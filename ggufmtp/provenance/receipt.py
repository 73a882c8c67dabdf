"""Provenance receipts: an in-toto Statement v1 per artifact, with a ggufmtp predicate.

Layout::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "x.gguf", "digest": {"sha256": ...}, "annotations": {"size": N}}, ...],
     "predicateType": "https://ggufmtp.dev/receipt/v1",
     "predicate": {"base_model", "imatrix", "recipe", "result", "toolchain",
                   "started_at", "finished_at", "verification", "integrity"}}

``predicate.integrity.sha256`` is the digest of the canonical JSON of the whole statement with
that field emptied: an edit to any field that does not recompute it is caught by ``audit``.
It detects accidental edits, not forgery (anyone can recompute it): with a signing key the file is
a DSSE envelope around the statement instead (:mod:`ggufmtp.provenance.signing`), which is.
The predicate's JSON Schema ships as ``ggufmtp/data/receipt.schema.json``.

Every claim is bound to bytes: the subject digests are the artifact's, the imatrix digest is the
one the plan read (quantize used those bytes), and a verification is accepted only when the
sha256 of the file llama-server served equals the artifact's digest.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..constants import SPLIT_TOOL
from ..errors import AuditDigestMismatch, AuditError
from ..files.fsutil import atomic_write_json
from ..files.hashing import sha256_file
from ..files.records import dataset_name, read_conversion_record, receipt_schema
from ..jsontypes import JsonObject
from .binding import head_binding_problem, shards_problem
from .names import local_paths, non_finite_numbers, plain_file_name, redact_local_paths
from .search_card import search_record
from .signing import (
    envelope_statement,
    is_envelope,
    load_private_key,
    read_json_file,
    resolve_signing_key,
    sign_statement,
    verify_envelope,
)
from .statement import (
    BaseModelSection,
    ConvertedFrom,
    Envelope,
    FileEntry,
    ImatrixComputed,
    ImatrixSection,
    Predicate,
    PullManifest,
    RecipeSection,
    ResultSection,
    Source,
    Statement,
    SubjectEntry,
    Verification,
)
from .toolchain import toolchain
from .tuned import carried_tuned, tuned_binding_problem

if TYPE_CHECKING:  # annotations only: quantize and plan pull in libllama
    from ..gguf.model import GGUFModel
    from ..quant.plan import Plan
    from ..quant.quantize import QuantizeResult

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://ggufmtp.dev/receipt/v1"


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def table_digest(types: dict[str, str]) -> str:
    """sha256 of the tensor-name → type table in canonical JSON."""
    return hashlib.sha256(canonical_json(types)).hexdigest()


def integrity_digest(statement: Statement) -> str:
    s = json.loads(json.dumps(statement, default=str))
    s.setdefault("predicate", {})["integrity"] = {"sha256": ""}
    return hashlib.sha256(canonical_json(s)).hexdigest()


def seal(statement: Statement) -> Statement:
    statement["predicate"]["integrity"] = {"sha256": integrity_digest(statement)}
    return statement


def file_entry(path: Path, sha256: str | None = None) -> FileEntry:
    return {"name": path.name, "size": path.stat().st_size, "sha256": sha256 or sha256_file(path)}


def subject_entry(path: Path, sha256: str | None = None) -> SubjectEntry:
    e = file_entry(path, sha256)
    return {"name": e["name"], "digest": {"sha256": e["sha256"]}, "annotations": {"size": e["size"]}}


def base_model_section(model_path: Path, model_arg: str | None = None, manifest: PullManifest | None = None,
                       known: dict[str, str] | None = None) -> BaseModelSection:
    """Where the input came from and every input file with size and sha256 (``known``: digests of
    these bytes by resolved path, e.g. hashed while quantize ran; else the pull's (``manifest``);
    else hashed now)."""
    from ..gguf.model import split_shards

    shards = split_shards(Path(model_path))
    if manifest:
        pulled = {f.path.split("/")[-1]: f.sha256 for f in manifest.files}
        files = [file_entry(s, (known or {}).get(str(s.resolve())) or pulled.get(s.name)) for s in shards]
        source: Source = {"type": "hub", "repo_id": manifest.repo_id, "revision": manifest.requested_revision,
                          "commit": manifest.resolved_commit}
        card = manifest.card
        if card is not None and card.base_model and card.base_model != manifest.repo_id:
            source["upstream"] = card.base_model  # the pulled repo is a conversion/quantization of it
    else:
        files = [file_entry(s, (known or {}).get(str(s.resolve()))) for s in shards]
        arg = model_arg or str(model_path)
        # names, never local paths: a receipt is published, and a path is neither portable nor private
        source = ({"type": "builtin", "name": arg.split(":", 1)[1]} if arg.startswith("builtin:")
                  else {"type": "local", "name": Path(model_path).name})
    from ..gguf.model import GGUFModel

    lic = GGUFModel(model_path).metadata.get("general.license")
    lic = lic if isinstance(lic, str) and lic else (manifest.card.license if manifest and manifest.card else None)
    if lic:
        source["license"] = lic
    section: BaseModelSection = {"source": source, "files": files}
    if (conv := converted_from(model_path)) is not None:
        section["converted_from"] = conv
    return section


def converted_from(model_path: str | Path) -> ConvertedFrom | None:
    """The conversion record beside ``model_path`` (:func:`ggufmtp.files.records.read_conversion_record`)."""
    return cast("ConvertedFrom | None", read_conversion_record(model_path))


def imatrix_section(imatrix: str | Path | None, missing: list[str], sha256: str | None = None
                    ) -> ImatrixSection | None:
    """The receipt's imatrix section. ``sha256``: the digest the plan read (quantize used those
    bytes); a file that no longer has it is refused, naming the file and both digests."""
    if not imatrix:
        return None
    from ..imatrix.compute import ImatrixProvenance
    from ..imatrix.format import read_imatrix

    try:
        now = sha256_file(imatrix)
    except OSError as e:
        raise AuditError(f"{imatrix}: cannot read the imatrix ({e.strerror or type(e).__name__})") from None
    if sha256 and now != sha256:
        raise AuditDigestMismatch(f"{imatrix}: the imatrix changed after the plan read it (sha256 {sha256} when "
                                  f"planned, {now} now); the artifact was made from the planned bytes: re-run quantize",
                                  path=imatrix, expected=sha256, actual=now)
    im = read_imatrix(imatrix)
    prov = ImatrixProvenance.from_imatrix(im)  # corpus, chunks, ctx, runtime commit of `imatrix compute`
    computed = cast(ImatrixComputed, prov.to_dict()) if prov is not None else None
    return {"file": Path(imatrix).name, "sha256": now, "format": im.format,
            "datasets": [dataset_name(d) for d in im.datasets], "chunk_count": im.chunk_count, "entries": len(im.entries),
            "missing": missing, "computed": computed}


def _planned_imatrix(plan: Plan, imatrix: str | Path | None) -> ImatrixSection | None:
    """The imatrix section of a quantize result: the plan's imatrix (the one quantize used) at the
    digest the plan read. An ``imatrix`` the plan did not use is refused."""
    if imatrix and not plan.imatrix:
        raise AuditError(f"{imatrix}: the plan used no imatrix, so the artifact was not made with it")
    chosen = imatrix or plan.imatrix
    return imatrix_section(chosen, plan.imatrix_missing, plan.imatrix_sha256) if chosen else None


def build_statement(outputs: list[Path], predicate: Predicate, output_sha256: dict[str, str] | None = None
                    ) -> Statement:
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
                  *, imatrix: str | Path | None = None, model_arg: str | None = None,
                  manifest: PullManifest | None = None, signing_key: str | Path | None = None) -> Path:
    """Write the receipt of a :func:`~ggufmtp.quant.quantize.quantize` result (default
    ``OUT.gguf.receipt.json``); ``imatrix`` defaults to the one the plan used. With ``signing_key``
    the receipt is a signed DSSE envelope (sign the artifact with
    :func:`~ggufmtp.provenance.signing.sign_artifact`). Returns its path."""
    return receipt_for_quantize(result, model_arg=model_arg, imatrix=imatrix, receipt_path=receipt_path,
                                manifest=manifest, signing_key=signing_key)


def receipt_for_quantize(res: QuantizeResult, model_arg: str | None = None, imatrix: str | Path | None = None,
                         receipt_path: str | Path | None = None, manifest: PullManifest | None = None,
                         verification: JsonObject | None = None, signing_key: str | Path | None = None) -> Path:
    """Write the receipt of a :class:`~ggufmtp.quant.quantize.QuantizeResult`; returns its path.
    Its imatrix is the plan's, at the digest the plan read; ``verification`` must be of these bytes;
    ``signing_key``: write a DSSE envelope signed with it. ``receipt_path`` defaults to the
    published artifact's (a split artifact's first shard's) ``NAME.receipt.json``."""
    from ..gguf.model import GGUFModel

    out = Path(res.output)
    gm = GGUFModel(out)
    plan = res.plan
    predicate: Predicate = {
        "base_model": base_model_section(Path(plan.model), model_arg, manifest, res.input_sha256),
        "imatrix": _planned_imatrix(plan, imatrix),
        "recipe": _recipe_section(plan, out.name, res),
        "result": _result_section(gm, res),
        "toolchain": toolchain(),
        "started_at": res.started_at,
        "finished_at": res.finished_at,
        "verification": None,
    }
    digests = res.shard_sha256 or ({str(out): res.output_sha256} if res.output_sha256 else None)
    statement = build_statement(res.files, predicate, digests)  # a split artifact: every shard, in order
    if verification is not None:
        _refuse_unbound(statement, cast(Verification, verification), out)
        predicate["verification"] = cast(Verification, verification)
    path = Path(receipt_path) if receipt_path else default_receipt_path(res.destination or out)
    write_statement(path, seal(statement), signing_key)
    return path


def _recipe_section(plan: Plan, out_name: str, res: QuantizeResult | None = None) -> RecipeSection:
    rec = plan.recipe_obj
    command = plan.llama_quantize_command(out_name, by_name=True)
    if res is not None and res.shards:  # llama-quantize writes one file, which llama-gguf-split then splits
        stem = out_name.rsplit("-", 3)[0]
        command = (plan.llama_quantize_command(f"{stem}.gguf", by_name=True) + f" && {SPLIT_TOOL} --split "
                   f"--split-max-size {res.split_max_size} {stem}.gguf {stem}")
    section: RecipeSection = {
        "name": plan.recipe,
        "file": Path(rec.path).name if rec and rec.path else None,
        "sha256": rec.sha256 if rec else None,
        "ftype": plan.ftype,
        "output_type": rec.output_type if rec else None,
        "token_embedding_type": rec.token_embedding_type if rec else None,
        "rules": [{"pattern": r.pattern, "type": r.type, "source": r.source} for r in plan.rules],
        "llama_quantize_command": command,
    }
    found = search_record(rec.path, rec.sha256) if rec else None  # a searched recipe: how it was found, for the card
    if found:
        section["search"] = found
    return section


def _result_section(gm: GGUFModel, res: QuantizeResult | None = None) -> ResultSection:
    from ..gguf.model import check_mtp

    mtp = check_mtp(gm)
    types = gm.type_table()
    section: ResultSection = {
        "tensor_types": types,
        "tensor_types_sha256": table_digest(types),
        "mtp_block": mtp.block,  # the first MTP block: what readers of single-block receipts use
        "mtp_blocks": list(mtp.blocks),
        "mtp_status": mtp.status,
        "nextn_predict_layers": gm.nextn_predict_layers,
        "file_type": gm.file_type,
        "size_bytes": gm.size_bytes,
        "n_params": gm.n_params,
        "bpw": round(gm.bpw, 4),
    }
    if res is not None and res.shards:  # the subjects are the shards: the receipt says they are one set
        section["split"] = {"count": len(res.shards), "max_size": str(res.split_max_size), "tool": SPLIT_TOOL}
    return section


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class Subject:
    """One artifact file a receipt describes: its name (a plain file name, unique in the receipt),
    sha256 and size."""

    name: str
    sha256: str
    size: int


@dataclasses.dataclass(frozen=True)
class Receipt:
    """A receipt as read by :func:`read_receipt`, the one reader: its in-toto statement (valid
    against the schema, exactly), its subjects, and the DSSE envelope it came in when signed (the
    signature is checked by ``audit --public-key``, never by reading)."""

    path: Path
    statement: Statement
    subjects: tuple[Subject, ...]
    envelope: Envelope | None = None
    stamp: tuple[int, int] | None = None  # the file's (mtime_ns, size) just before it was read

    def fresh(self) -> Receipt:
        """This receipt, or the file read again where it changed since (a long run may have another
        command write it meanwhile): a command reads its receipt once and rewrites what is on disk."""
        return self if self.stamp is not None and _stamp(self.path) == self.stamp else read_receipt(self.path)

    @property
    def signed(self) -> bool:
        return self.envelope is not None

    @property
    def artifact(self) -> Subject:
        """The first subject: the file a server is given (a split model's first shard)."""
        return self.subjects[0]

    @property
    def predicate(self) -> Predicate:
        return self.statement["predicate"]

    @property
    def verification(self) -> Verification | None:
        return self.predicate.get("verification")

    @property
    def recipe_name(self) -> str:
        return self.predicate["recipe"]["name"]

    def digests(self) -> set[str]:
        return {s.sha256 for s in self.subjects}

    @property
    def intact(self) -> bool:
        """Whether the statement's integrity digest holds (no edit since it was sealed)."""
        return self.predicate["integrity"]["sha256"] == integrity_digest(self.statement)

    def subject_named(self, name: str) -> Subject | None:
        return next((s for s in self.subjects if s.name == name), None)


def read_receipt(path: str | Path) -> Receipt:
    """Read a receipt, plain statement or DSSE envelope, strictly: one AuditError (naming the file)
    for anything that is not exactly a valid receipt: unreadable, not JSON, duplicate keys or
    non-finite numbers (which two JSON readers may read differently), an envelope with fields
    beyond DSSE's, not an in-toto Statement v1, any schema error (unknown fields included), two
    subjects with one name, a subject name that is not a plain file name, or a local path."""
    p = Path(path)
    stamp = _stamp(p)
    data = read_json_file(p, "receipt")
    envelope = None
    if is_envelope(data):
        envelope, data = data, envelope_statement(data, p)
    if not isinstance(data, dict) or data.get("_type") != STATEMENT_TYPE:
        got = str(data.get("_type"))[:80] if isinstance(data, dict) else type(data).__name__
        raise AuditError(f"{p}: not an in-toto Statement v1 (_type is {got!r})")
    problems = statement_problems(data)
    if problems:
        raise AuditError(f"{p}: not a valid ggufmtp receipt: {'; '.join(problems[:3])}")
    subjects = tuple(Subject(s["name"], s["digest"]["sha256"], s["annotations"]["size"]) for s in data["subject"])
    return Receipt(p, cast(Statement, data), subjects, envelope, stamp)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def as_receipt(receipt: str | Path | Receipt) -> Receipt:
    """``receipt`` itself when already read (the one typed object a command passes down), else read."""
    return receipt if isinstance(receipt, Receipt) else read_receipt(receipt)


def load_receipt(path: str | Path) -> JsonObject:
    """The statement of the receipt at ``path``, as JSON (:attr:`Receipt.statement` is the same, typed)."""
    return cast(JsonObject, read_receipt(path).statement)


def statement_problems(statement: Any) -> list[str]:
    """Everything that makes ``statement`` not exactly a valid receipt (empty when it is one): the
    schema (types, values, no unknown fields), unique plain subject names, no local paths."""
    errs = schema_errors(statement)
    if errs or not isinstance(statement, dict):
        return errs
    names = [s["name"] for s in statement["subject"]]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        errs.append(f"subject: two subjects named {dup[0]!r} (which one would an audit check?)")
    odd = [n for n in names if not plain_file_name(n)]
    if odd:
        errs.append(f"subject: {odd[0]!r} is not a plain file name")
    errs += [f"{where}: holds a local path ({text[:80]!r}); receipts hold names, digests and Hub coordinates"
             for where, text in local_paths(statement)[:3]]
    errs += [f"{where}: {value} is not a JSON number" for where, value in non_finite_numbers(statement)[:3]]
    return errs


def schema() -> JsonObject:
    return receipt_schema()


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(schema())


def schema_errors(statement: Any) -> list[str]:
    """Where ``statement`` breaks the receipt's JSON Schema (empty: it validates), each at its
    deepest reason (a ``oneOf`` names the branch's own error, not the whole value)."""
    out = []
    for e in sorted(_validator().iter_errors(statement), key=lambda e: [str(x) for x in e.absolute_path]):
        while e.context:  # the branch that got furthest (not "is not of type 'null'")
            e = max(e.context, key=lambda c: (len(c.absolute_path), c.validator != "type"))
        out.append(f"{'/'.join(str(x) for x in e.absolute_path) or '<root>'}: {e.message[:200]}")
    return out


def validate_statement(statement: Statement) -> None:
    """AuditError unless ``statement`` is exactly a valid receipt (what :func:`read_receipt` accepts)."""
    errs = statement_problems(statement)
    if errs:
        raise AuditError("not a valid receipt: " + "; ".join(errs[:5]))


# ----------------------------------------------------------------------------- writing


def write_statement(path: str | Path, statement: Statement, signing_key: str | Path | None = None) -> Path:
    """Validate ``statement`` and write it atomically to ``path``: plain JSON, or with ``signing_key``
    a DSSE envelope signed with it. Local paths in its strings become file names first (they are
    sealed again when they change). AuditError naming the file when it cannot be written."""
    path = Path(path)
    clean = redact_local_paths(statement)
    if clean != statement:
        in_place = cast(JsonObject, statement)  # the caller's statement, rewritten where it is
        in_place.clear()
        in_place.update(seal(clean) if (clean.get("predicate") or {}).get("integrity") else clean)
    validate_statement(statement)
    data = sign_statement(statement, signing_key) if signing_key else statement
    try:
        if path.is_dir():
            raise AuditError(f"{path}: is a directory; give the receipt a file path")
        if path.exists() and not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
            raise AuditError(f"{path}: the receipt is read-only; not replacing it")
        atomic_write_json(path, data)
    except OSError as e:
        raise AuditError(f"{path}: cannot write the receipt ({e.strerror or type(e).__name__})") from None
    return path


def verification_problem(statement: Statement, verification: Verification) -> str | None:
    """Why ``verification`` is not bound to the receipt's artifact and source (None when it is):
    the file llama-server was given (:func:`served_problem`), every shard it read
    (:func:`~ggufmtp.provenance.binding.shards_problem`), and the head's reference is the source
    (:func:`~ggufmtp.provenance.binding.head_binding_problem`), and a ``verify --tuned-from``
    recommendation says what the verification measured (:func:`~ggufmtp.provenance.tuned.tuned_binding_problem`)."""
    return (served_problem(statement, verification) or shards_problem(statement, verification)
            or head_binding_problem(statement, verification) or tuned_binding_problem(verification))


def served_problem(statement: Statement, verification: Verification) -> str | None:
    """Why ``verification`` is not of the receipt's artifact (None when it is): the sha256 of the
    file llama-server served (``verification.model.sha256``) must equal the digest of the
    receipt's artifact (its first subject: the file a server is given)."""
    subject = statement["subject"][0]
    want = subject["digest"]["sha256"]
    model = verification.get("model") if isinstance(verification, dict) else None
    served = model.get("sha256") if isinstance(model, dict) else None
    if not served:
        return (f"the verification does not name the sha256 of the file it served (verification.model.sha256), "
                f"so it cannot be bound to {subject['name']} (sha256 {want})")
    if str(served).lower() != str(want).lower():
        return (f"the verification is of another file: the served file has sha256 {served}, "
                f"the receipt's artifact {subject['name']} has sha256 {want}")
    return None


def refuse_other_file(receipt: str | Path | Receipt, model: str | Path) -> None:
    """Before a verification runs: refuse a model whose size differs from the receipt's artifact, so a
    mismatched ``verify B --receipt A`` costs no server run. Sizes can only prove a mismatch; an equal
    size is settled by the sha256 binding when the results are written (:func:`set_verification`)."""
    rf = as_receipt(receipt)
    receipt = rf.path
    subject = rf.statement["subject"][0]
    size = (subject.get("annotations") or {}).get("size")
    try:
        actual = Path(model).stat().st_size
    except OSError as e:
        raise AuditError(f"{model}: cannot read the model: {e.strerror or e}") from None
    if size is not None and actual != size:
        got = sha256_file(model)
        raise AuditDigestMismatch(f"{receipt}: refusing the verification before any server starts: it is of another "
                                  f"file: {model} has sha256 {got} ({actual:,} bytes), the receipt's artifact "
                                  f"{subject['name']} has sha256 {subject['digest']['sha256']} ({size:,} bytes)",
                                  path=model, expected=subject["digest"]["sha256"], actual=got)
    for other in rf.subjects[1:]:  # a split artifact: llama-server loads these too
        shard = Path(model).parent / other.name
        have = shard.stat().st_size if shard.is_file() else None
        if have != other.size:
            raise AuditError(f"{shard}: refusing the verification before any server starts: the receipt's shard "
                             f"{other.name} has {other.size:,} bytes, " + (f"this file {have:,}" if have is not None
                                                                             else "and it is missing"))


def _refuse_unbound(statement: Statement, verification: Verification, where: str | Path) -> None:
    problem = verification_problem(statement, verification)
    if problem:
        model = verification.get("model") if isinstance(verification, dict) else None
        raise AuditDigestMismatch(f"{where}: refusing the verification: {problem}", path=where,
                                  expected=statement["subject"][0]["digest"]["sha256"],
                                  actual=model.get("sha256") if isinstance(model, dict) else None)


def check_intact(rf: Receipt, signing_key: str | Path | None) -> None:
    """Before rewriting a receipt: its checksum holds, and a signed one verifies with the key about
    to re-sign it (re-sealing or re-signing must never launder an edit)."""
    if not rf.intact:
        raise AuditError(f"{rf.path}: the receipt was edited after it was written (its integrity digest does not "
                         f"match); refusing to re-seal it")
    if rf.envelope is not None and signing_key:
        verify_envelope(rf.envelope, load_private_key(signing_key).public_key(), rf.path)


# Sections that tune, curve, profiles and verify --matrix add to a verification; a new verify run keeps them.
ADDED_VERIFICATION_SECTIONS = ("tuned", "profiles", "acceptance_curve", "matrix")


def set_verification(path: str | Path | Receipt, verification: JsonObject, keep_added: bool = False,
                     signing_key: str | Path | None = None) -> Statement:
    """Fill the receipt's ``verification`` slot (re-sealing it) and write it back atomically.

    Refused (AuditError naming both digests) unless ``verification.model.sha256`` equals the
    artifact's digest. ``keep_added``: carry over what tune, curve and profiles stored in the old
    section (a ``tuned`` of this verification, from a sweep or ``--tuned-from``, wins; an older one of
    those is not carried, a search's is: :func:`~ggufmtp.provenance.tuned.is_search`).
    A signed receipt stays signed: ``signing_key`` (else ``$GGUFMTP_SIGNING_KEY``) re-signs it.
    ``path`` may be the receipt as the command read it (:meth:`Receipt.fresh`: not read again unless
    it changed on disk since)."""
    rf = path.fresh() if isinstance(path, Receipt) else read_receipt(path)
    st = rf.statement
    _refuse_unbound(st, cast(Verification, verification), rf.path)
    key = _rewrite_key(rf, signing_key)
    old = cast(JsonObject, st["predicate"].get("verification") or {})
    if keep_added:
        kept = {k: old[k] for k in ADDED_VERIFICATION_SECTIONS if old.get(k) and not verification.get(k)}
        # an older verification's recommendation describes an older run; a search's stays
        kept["tuned"] = carried_tuned(old.get("tuned"), verification.get("tuned"))
        verification = {**verification, **kept}
    st["predicate"]["verification"] = cast(Verification, verification)
    if verification.get("server"):
        st["predicate"]["toolchain"]["server"] = verification["server"]
    write_statement(rf.path, seal(st), key)
    return st


def set_section(path: str | Path | Receipt, name: str, section: JsonObject,
                signing_key: str | Path | None = None) -> Statement:
    """Store ``section`` as ``predicate[name]`` (e.g. ``quality``), re-sealed and re-signed like
    :func:`set_verification` (an edited or unsigned-with-key receipt is refused first; ``path`` may
    be the receipt as the command read it)."""
    rf = path.fresh() if isinstance(path, Receipt) else read_receipt(path)
    key = _rewrite_key(rf, signing_key)
    cast(JsonObject, rf.statement["predicate"])[name] = section
    write_statement(rf.path, seal(rf.statement), key)
    return rf.statement


def _rewrite_key(rf: Receipt, signing_key: str | Path | None) -> str | Path | None:
    """The key to re-sign ``rf`` with (``signing_key``, else ``$GGUFMTP_SIGNING_KEY`` for a signed
    receipt), once the receipt is checked intact: a signed receipt is never rewritten unsigned."""
    key = signing_key or (resolve_signing_key(None) if rf.signed else None)
    if rf.signed and not key:
        raise AuditError(f"{rf.path}: the receipt is signed; give the signing key (--signing-key or "
                         f"$GGUFMTP_SIGNING_KEY) to re-sign it, or it would lose its signature")
    check_intact(rf, key)
    return key
