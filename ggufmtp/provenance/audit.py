"""``ggufmtp audit``: check an artifact against its receipt, or against itself.

With a receipt: it is read strictly (:func:`~ggufmtp.provenance.receipt.read_receipt`: anything
that is not exactly a valid receipt fails), then the signatures (with a public key: the receipt's
DSSE signature and each artifact file's model-signing signature must verify; without one nothing
is checked and the report says so), then everything is re-read and re-hashed: the receipt's own
integrity digest, that the receipt names these files, every file's size and sha256, that the
verification is of these bytes and that its verdict follows from its own figures and thresholds
(:func:`~ggufmtp.provenance.verdict.judge_recorded`), every tensor's type, the
tensor table digest, the MTP blocks (every one a receipt lists; an older receipt, which names
only ``mtp_block``, is checked on that), the recorded result figures and the imatrix the file's
``quantize.imatrix.*`` metadata names, and a ``source`` section (``receipt add-source``; see
:func:`source_problems`). A split model's file (``ggufmtp sidecar``: a receipt with a ``pair``
section) must have its role's MTP status (an MTP-only sidecar, or a trunk without the block), and
``--sidecar`` checks that a sidecar pairs with the audited trunk (:mod:`ggufmtp.provenance.pair`).
Without a receipt: what the file alone can show (it reads as a GGUF, its MTP block or an MTP-only
sidecar's, its ``quantize.imatrix.*`` metadata).

``upload`` (and ``run --upload``) run exactly this audit and refuse on any failure. An audit
never writes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import Path

from ..checks import Check, Status
from ..errors import AuditError, GgufmtpError, GGUFReadError
from ..files.hashing import sha256_file
from ..files.records import dataset_name
from ..gguf.model import SPLIT_RE, GGUFModel, MTPCheck, MTPStatus, check_mtp, format_blocks, shard_path, split_shards
from ..jsontypes import JsonObject
from ..provenance.receipt import (
    Receipt,
    check_intact,
    default_receipt_path,
    integrity_digest,
    read_receipt,
    served_problem,
    table_digest,
    write_statement,
)
from ..provenance.signing import UNSIGNED_NOTE, signature_path, verify_artifact, verify_envelope
from .binding import head_binding_problem, shards_problem
from .pair import expected_status, pair_problem, pair_section_problems
from .statement import ImatrixSection, ResultSection, Statement
from .tuned import tuned_binding_problem


class Trust(str, enum.Enum):
    """What an audited receipt's integrity rests on."""

    VERIFIED = "verified"  # a public key checked the receipt's and the artifacts' signatures
    FAILED = "failed"  # a public key was given and a signature did not verify (or was missing)
    UNSIGNED = "unsigned"  # a plain receipt, no key: its checksum detects accidents, not forgery
    UNCHECKED = "unchecked"  # a signed receipt, no key: nothing checked the signature


_SYMBOL = {Status.PASS: "✓", Status.FAIL: "✗", Status.INFO: "·"}


@dataclasses.dataclass
class AuditReport:
    """The checks of one audit. ``signed``: whether the receipt is a DSSE envelope (None: no
    receipt read); ``signatures_checked``: whether a public key checked the signatures;
    ``unchecked``: the checks this audit did not run (without a receipt, every one a receipt brings:
    ``ok`` then speaks for the file alone, and ``partial`` is True)."""

    artifact: str
    receipt: str | None
    checks: list[Check]
    signed: bool | None = None
    signatures_checked: bool = False
    unchecked: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every check that ran passed (see ``partial`` for whether all of them ran)."""
        return all(c.ok for c in self.checks)

    @property
    def partial(self) -> bool:
        """Some checks were not run (``unchecked`` names them): no receipt was read."""
        return bool(self.unchecked)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def trust(self) -> Trust | None:
        """What the receipt's integrity rests on (None when no receipt was read): VERIFIED only when
        every signature check ran and passed."""
        if self.signed is None:
            return None
        if self.signatures_checked:
            sig = [c for c in self.checks if c.name.startswith(SIGNATURE_CHECK)]
            return Trust.VERIFIED if sig and all(c.status == Status.PASS for c in sig) else Trust.FAILED
        return Trust.UNCHECKED if self.signed else Trust.UNSIGNED

    @property
    def trust_text(self) -> str | None:
        return {None: None, Trust.VERIFIED: "signed: signatures verified",
                Trust.FAILED: "a signature did NOT verify (or is missing)",
                Trust.UNSIGNED: UNSIGNED_NOTE.removeprefix("unsigned: "),
                Trust.UNCHECKED: "signed, but nothing checked the signatures (give --public-key)"}[self.trust]

    def to_dict(self) -> JsonObject:
        return {"ok": self.ok, "partial": self.partial, "unchecked": list(self.unchecked),
                "artifact": self.artifact, "receipt": self.receipt,
                "signed": self.signed, "signatures_checked": self.signatures_checked,
                "trust": self.trust.value if self.trust else None, "trust_text": self.trust_text,
                "checks": [c.to_dict() for c in self.checks]}


SIGNATURE_CHECK = "signature"  # the names of signature checks start with it
# What an audit without a receipt cannot check (AuditReport.unchecked): everything bound to one.
RECEIPT_CHECKS = ("receipt integrity and signatures", "every file's size and sha256 (against the receipt)",
                  "tensor types and the tensor table digest (against the receipt)",
                  "MTP blocks (against the receipt)", "imatrix and result figures (against the receipt)",
                  "verification: of these bytes, its verdict from its figures")


def audit(artifact: str | Path, receipt: str | Path | None = None, *, progress: bool = True,
          public_key: str | Path | None = None, signature: str | Path | None = None,
          sidecar: str | Path | None = None) -> AuditReport:
    """Audit ``artifact`` (any shard of a split model). ``receipt`` defaults to
    ``ARTIFACT.receipt.json`` when that file exists. ``public_key``: also require and check the
    receipt's DSSE signature and the artifact's model-signing signature (``signature``, default
    ``ARTIFACT.sig``; for a split model each shard's). ``sidecar``: an MTP-only sidecar to be
    served with ``artifact`` as its trunk; it must pair with it (:func:`~ggufmtp.provenance.pair.pair_problem`)."""
    artifact = Path(artifact)
    if receipt is None and default_receipt_path(artifact).exists():
        receipt = default_receipt_path(artifact)
    if public_key is not None and receipt is None:
        raise AuditError(f"{artifact}: no receipt to check signatures against (--receipt, or "
                         f"{default_receipt_path(artifact).name} beside it)")
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
    report = AuditReport(str(artifact), str(receipt) if receipt else None, checks,
                         signatures_checked=public_key is not None,
                         unchecked=[] if receipt is not None else list(RECEIPT_CHECKS))
    if sidecar is not None and receipt is None:
        checks.append(_pair_check(artifact, sidecar, None))
    if receipt is not None:
        try:
            rf = read_receipt(receipt)
        except GgufmtpError as e:
            checks.append(Check("receipt readable", False, str(e)))
            return report
        checks.append(Check("receipt readable", True, "exactly a valid receipt (schema, unique plain subject names, "
                                                      "no local paths)"))
        report.signed = rf.signed
        checks += _signature_checks(artifact, rf, public_key, signature)
        checks += _against_receipt(artifact, shards, model, rf, progress)
        if sidecar is not None:
            checks.append(_pair_check(artifact, sidecar, rf))
        checks += _verified_sidecar(rf, sidecar)
    elif model is not None:
        checks += _standalone(model, trunk=sidecar is not None)
    return report


def _pair_check(trunk: Path, sidecar: str | Path, rf: Receipt | None) -> Check:
    """The sidecar fits the trunk and its own receipt (beside it: required) binds it to the trunk's
    source (``rf``: the trunk's receipt, when read)."""
    try:
        problem = pair_problem(trunk, sidecar, bound=True, trunk_receipt=rf)
    except GgufmtpError as e:
        problem = str(e)
    return Check(f"pairs with {Path(sidecar).name}", problem is None,
                 problem or "the sidecar's head fits this trunk and its receipt binds them")


def _verified_sidecar(rf: Receipt, sidecar: str | Path | None) -> list[Check]:
    """A verification made with a sidecar (``verify --sidecar``) is of that pair: audited with
    ``--sidecar``, it must be that file; without, the report says which sidecar it needs."""
    v = rf.predicate.get("verification") or {}
    named = (v.get("model") or {}).get("sidecar")
    if named is None:
        return []
    if sidecar is None:
        return [Check.info("verified with a sidecar", f"{named['name']} (sha256 {named['sha256']}): audit the pair "
                                                     f"with --sidecar")]
    try:
        got = sha256_file(sidecar)
    except OSError as e:
        return [Check("verification of this pair", False, f"{sidecar}: cannot read ({e.strerror or e})")]
    return [Check("verification of this pair", got == named["sha256"],
                  f"the verification drafted with {named['name']}" if got == named["sha256"] else
                  f"the verification drafted with {named['name']} (sha256 {named['sha256']}), not "
                  f"{Path(sidecar).name} (sha256 {got}): its acceptance is not this sidecar's")]


def _standalone(model: GGUFModel, trunk: bool = False) -> list[Check]:
    """What the file alone shows: a complete MTP block, or a complete MTP-only sidecar; ``trunk``:
    audited as a sidecar's trunk (no MTP block is fine)."""
    mtp = check_mtp(model)
    ok = mtp.status in (MTPStatus.COMPLETE, MTPStatus.SIDECAR) or (trunk and mtp.status == MTPStatus.ABSENT)
    out = [Check("MTP block", ok,
                 f"{mtp.status}" + (f" ({format_blocks(mtp.blocks)})" if mtp.blocks else "")
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


def _signature_checks(artifact: Path, rf: Receipt, public_key: str | Path | None,
                      signature: str | Path | None) -> list[Check]:
    """The receipt's DSSE signature and each artifact file's model-signing signature. Without a
    public key nothing can be checked: the report says what the receipt is, and checks nothing."""
    if public_key is None:
        detail = "DSSE envelope; NOT checked (give --public-key)" if rf.signed else UNSIGNED_NOTE
        checks = [Check.info(f"{SIGNATURE_CHECK} of the receipt", detail)]
        sig = Path(signature) if signature else signature_path(artifact)
        if sig.is_file():
            checks.append(Check.info(f"{SIGNATURE_CHECK} of the artifact", f"{sig.name} present; NOT checked "
                                                                           f"(give --public-key)"))
        return checks
    if rf.signed:
        try:
            verify_envelope(rf.envelope, public_key, rf.path)
            checks = [Check(f"{SIGNATURE_CHECK} of the receipt", True, f"DSSE signature verifies with {Path(public_key).name}")]
        except AuditError as e:
            checks = [Check(f"{SIGNATURE_CHECK} of the receipt", False, str(e))]
    else:
        checks = [Check(f"{SIGNATURE_CHECK} of the receipt", False, f"{UNSIGNED_NOTE}; a public key was given, so a "
                                                                     f"signed receipt is required")]
    files = [artifact] if signature else [artifact.parent / s.name for s in rf.subjects]
    for f in files:
        try:
            verify_artifact(f, public_key, signature)
            checks.append(Check(f"{SIGNATURE_CHECK} of {f.name}", True,
                                f"{(Path(signature) if signature else signature_path(f)).name} verifies (model-signing)"))
        except AuditError as e:
            checks.append(Check(f"{SIGNATURE_CHECK} of {f.name}", False, str(e)))
    return checks


def _against_receipt(artifact: Path, shards: list[Path] | None, model: GGUFModel | None, rf: Receipt,
                     progress: bool) -> list[Check]:
    st = rf.statement
    checks = _statement_checks(st) + _file_checks(artifact, shards, rf, progress) + _verification_checks(st)
    if st["predicate"].get("pair") is not None:
        problems = pair_section_problems(st)
        pair = st["predicate"]["pair"]
        checks.append(Check("pair section", not problems, "; ".join(problems) or
                            f"a {pair['role']} split from {pair['made_from']['name']}"))
    if st["predicate"].get("source") is not None:
        problems = source_problems(st)
        checks.append(Check("source section", not problems, "; ".join(problems) or
                            "a passing comparison with the checkpoint, bound to the artifact's sha256"))
    if model is not None:
        checks += _model_checks(model, st)
    return checks


def _statement_checks(st: Statement) -> list[Check]:
    """The receipt against its own integrity digest (the schema was checked when it was read)."""
    recorded = (st.get("predicate", {}).get("integrity") or {}).get("sha256")
    actual = integrity_digest(st)
    return [Check("receipt integrity", recorded == actual,
                  "digest matches the statement" if recorded == actual else
                  f"receipt was edited after it was written (digest {str(recorded)[:12]}... != {actual[:12]}...)")]


def _file_checks(artifact: Path, shards: list[Path] | None, rf: Receipt, progress: bool) -> list[Check]:
    """The receipt names these files (the artifact first: the verification is of the file a server
    is given), all are present, and each has the recorded size and sha256."""
    names = [p.name for p in shards] if shards else [artifact.name]
    listed = [s.name for s in rf.subjects]
    foreign = [n for n in names if n not in listed]
    checks = [Check("receipt names this artifact", not foreign,
                    f"receipt covers {', '.join(listed)}; not {', '.join(foreign)}" if foreign else ", ".join(names))]
    if not foreign and rf.artifact.name != names[0]:
        checks.append(Check("artifact is the receipt's first subject", False,
                            f"the receipt's verification is of {rf.artifact.name}, not {names[0]}"))
    missing = [s.name for s in rf.subjects if not (artifact.parent / s.name).is_file()]
    if missing and shards is not None and not foreign:  # else already said: the set's missing shards, other names
        checks.append(Check("all shards present", False, f"missing {', '.join(missing)}"))
    checks += [_digest_check(artifact.parent / s.name, s.sha256, s.size, progress)
               for s in rf.subjects if s.name not in missing]
    return checks + _split_checks(artifact, rf)


def _split_checks(artifact: Path, rf: Receipt) -> list[Check]:
    """A split artifact (the receipt's ``result.split``): its subjects are exactly the set's shards,
    in order, named as llama.cpp names them, and no other shard of that name lies beside them (one
    added to the folder would be published with it, and loaded by nobody)."""
    split = rf.predicate["result"].get("split")
    if split is None:
        return []
    names = [s.name for s in rf.subjects]
    m = SPLIT_RE.match(names[0])
    n = split["count"]
    want = [shard_path(Path(m.group("stem") + ".gguf"), i, n).name for i in range(1, n + 1)] if m else []
    checks = [Check("split set", names == want,
                    f"{n} shards of at most {split['max_size']} ({split['tool']})" if names == want else
                    f"the receipt's subjects ({', '.join(names)}) are not the {n} shards of one split set in order")]
    if m is not None:
        stem = m.group("stem")
        extra = sorted(p.name for p in artifact.parent.glob("*-of-*.gguf")
                       if (e := SPLIT_RE.match(p.name)) and e.group("stem") == stem and p.name not in names)
        if extra:
            checks.append(Check("no extra shards", False, f"{', '.join(extra)}: a shard of {stem} beside the set "
                                                          f"that the receipt does not list"))
    return checks


def _digest_check(p: Path, want: str, size: int, progress: bool) -> Check:
    try:
        got_size = p.stat().st_size
        if size != got_size:
            return Check(f"sha256 {p.name}", False, f"size: receipt {size}, file {got_size}")
        got = sha256_file(p, progress=progress)
    except OSError as e:
        return Check(f"sha256 {p.name}", False, f"cannot read {p} ({e.strerror or type(e).__name__})")
    return Check(f"sha256 {p.name}", got == want, got if got == want else f"receipt {want}, file {got}")


def _verification_checks(st: Statement) -> list[Check]:
    """A verification in the receipt must be of the artifact's bytes (the served file's sha256),
    and its verdict must be the one its own figures and thresholds give."""
    from .verdict import judge_recorded

    v = st["predicate"].get("verification")
    if not v:
        return [Check.info("verification", "none recorded: the receipt claims no runtime verification")]
    problem = served_problem(st, v)
    verdict, reasons = judge_recorded(v)
    recorded = v.get("verdict")
    follows = recorded == verdict.value
    detail = (f"{recorded}, as its figures and thresholds ({(v.get('thresholds') or {}).get('source')}) give"
              if follows else f"recorded {recorded!r}, but its own figures and thresholds give {verdict.value!r}"
              + (f": {'; '.join(reasons[:3])}" if reasons else ""))
    checks = [Check("verification of these bytes", problem is None,
                    problem or f"served file sha256 {v['model']['sha256']} is the artifact's")]
    if len(st["subject"]) > 1 or (v.get("model") or {}).get("shards") is not None:
        shards = shards_problem(st, v)
        checks.append(Check("verification of every shard", shards is None,
                            shards or f"all {len(st['subject'])} shards served are the receipt's (sha256 each)"))
    if v.get("head") is not None:
        unbound = head_binding_problem(st, v)
        checks.append(Check("head reference is the source", unbound is None, unbound or
                            f"{v['head']['reference']['name']}: bound by {v['head']['reference']['bound']['by']}"))
    tuned = v.get("tuned")
    if isinstance(tuned, dict) and "profile" in tuned:  # verify --tuned-from's: derived from this verification
        unbound = tuned_binding_problem(v)
        checks.append(Check("recommended settings are this verification's", unbound is None, unbound or
                            f"the {tuned['profile'].get('name')} profile as served and measured here"))
    return [*checks, Check("verdict follows from the figures", follows, detail)]


def source_problems(st: Statement) -> list[str]:
    """What is wrong with the receipt's ``source`` section (``receipt add-source``; empty when it
    holds): it must be bound to the artifact's sha256, compare at least one tensor and find every
    one matching, and, where the receipt records the checkpoint its base model was converted from
    (``base_model.converted_from``), be a comparison with that checkpoint's files."""
    src = st["predicate"].get("source")
    if src is None:
        return []
    out = []
    want = st["subject"][0]["digest"]["sha256"]
    if src.get("artifact_sha256") != want:
        out.append(f"bound to sha256 {_shown(src.get('artifact_sha256'))}, not the artifact's {want}")
    tensors = src.get("tensors") or []
    bad = [t.get("name") for t in tensors if t.get("match") is not True]
    if not tensors:
        out.append("it compares no tensor")
    elif bad:
        out.append(f"{len(bad)} of its {len(tensors)} tensors do not match ({', '.join(map(str, bad[:3]))}), yet "
                   f"it is recorded as a pass")
    converted = st["predicate"]["base_model"].get("converted_from") or {}
    if converted.get("files"):
        problem = checkpoint_difference({f["path"]: f["sha256"] for f in converted["files"]},
                                        {f["path"]: f["sha256"] for f in src.get("files") or []})
        if problem:
            out.append(f"not the checkpoint the base model was converted from ({converted.get('name')}): {problem}")
    return out


def checkpoint_difference(converted: Mapping[str, str], compared: Mapping[str, str]) -> str | None:
    """How the checkpoint files ``compared`` (name -> sha256) differ from those a GGUF was
    ``converted`` from (None: the same files, or more files that are not weights)."""
    changed = [f"{n} (sha256 {compared[n][:12]}..., converted from {d[:12]}...)"
               for n, d in sorted(converted.items()) if n in compared and compared[n] != d]
    missing = sorted(n for n in converted if n not in compared)
    extra = sorted(n for n in compared if n not in converted and n.endswith(".safetensors"))
    parts = ([f"{len(changed)} file(s) differ: {', '.join(changed[:2])}"] if changed else []) + \
        ([f"missing {', '.join(missing[:3])}"] if missing else []) + ([f"extra {', '.join(extra[:3])}"] if extra else [])
    return "; ".join(parts) or None


def _model_checks(model: GGUFModel, st: Statement) -> list[Check]:
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
    checks.append(_mtp_check(check_mtp(model), res, expected_status(st)))
    figures = {"file_type": model.file_type, "nextn_predict_layers": model.nextn_predict_layers,
               "size_bytes": model.size_bytes, "bpw": round(model.bpw, 4)}
    bad = [f"{k}: receipt {_shown(res.get(k))}, file {_shown(v)}" for k, v in figures.items() if res.get(k) != v]
    checks.append(Check("result figures", not bad, "; ".join(bad) or "file_type, layers, size, bpw match"))
    checks.append(imatrix_check(model.metadata, st.get("predicate", {}).get("imatrix")))
    return checks


def _shown(value: object) -> str:
    """A recorded value in a check's detail: ``none`` where the receipt or the file has none (never ``None``)."""
    return "none" if value is None else str(value)


def _one_block(block: object, status: object) -> str:
    """``blk.4 complete``, or ``no block (absent)`` for a trunk (``mtp_block`` null)."""
    if isinstance(block, int) and not isinstance(block, bool):
        return f"{format_blocks([block])} {status}"
    return f"no block ({status})"


def _mtp_check(mtp: MTPCheck, res: ResultSection, expected: MTPStatus = MTPStatus.COMPLETE) -> Check:
    """The file's MTP blocks against the receipt's: status, the first block, and every block when
    the receipt lists them (``mtp_blocks``; a receipt without it predates multi-block support and
    is checked on ``mtp_block``, as it was). A receipt that drops a block of a chain fails here.
    ``expected``: the status the artifact must have (complete; a split model's sidecar or trunk:
    :func:`~ggufmtp.provenance.pair.expected_status`)."""
    listed = res.get("mtp_blocks")
    ok = mtp.status == res.get("mtp_status") and mtp.block == res.get("mtp_block")
    if listed is not None:
        ok = ok and list(mtp.blocks) == listed
    if listed is None or (len(listed) <= 1 and len(mtp.blocks) <= 1):  # the single-block wording, as before
        detail = f"file {_one_block(mtp.block, mtp.status)}; receipt {_one_block(res.get('mtp_block'), res.get('mtp_status'))}"
    else:
        detail = (f"file {format_blocks(mtp.blocks) or 'no block'} {mtp.status}; receipt "
                  f"{format_blocks(listed) if isinstance(listed, list) else listed} {res.get('mtp_status')}")
    return Check("MTP block", ok and mtp.status == expected,
                 detail + (f"; missing {', '.join(mtp.missing)}" if mtp.missing else ""))


# llama.cpp stores a string key override in a 128-byte buffer: longer values are cut to 127 bytes.
_KV_STRING_MAX = 127


def imatrix_check(md: Mapping[str, object], im: ImatrixSection | None) -> Check:
    """The file's ``quantize.imatrix.*`` metadata (written by llama.cpp from the imatrix it was
    given) against the receipt's imatrix section: both absent, or both present and agreeing."""
    keys = sorted(k for k in md if k.startswith("quantize.imatrix."))
    said = ", ".join(f"{k.split('.')[-1]}={str(md[k])[:80]}" for k in keys)
    if not im:
        return Check("imatrix metadata", not keys, f"the receipt says no imatrix, but the file's metadata says one "
                                                   f"was used ({said})" if keys else "none in the file or the receipt")
    if not keys:
        return Check("imatrix metadata", False, f"the receipt names imatrix {im.get('file')}, but the file has no "
                                                f"quantize.imatrix.* metadata")
    diffs = []
    if md.get("quantize.imatrix.entries_count") != im.get("entries"):
        diffs.append(f"entries_count: file {_shown(md.get('quantize.imatrix.entries_count'))}, "
                     f"receipt {_shown(im.get('entries'))}")
    if "quantize.imatrix.chunks_count" in md and md["quantize.imatrix.chunks_count"] != im.get("chunk_count"):
        diffs.append(f"chunks_count: file {md['quantize.imatrix.chunks_count']}, receipt {_shown(im.get('chunk_count'))}")
    datasets = im.get("datasets") or []
    dataset = md.get("quantize.imatrix.dataset")
    if (isinstance(dataset, str) and len(dataset.encode()) < _KV_STRING_MAX
            and dataset_name(dataset) not in {dataset_name(str(d)) for d in datasets}):
        diffs.append(f"dataset: file {dataset[:80]!r}, receipt {datasets[:3]}")
    file = md.get("quantize.imatrix.file")
    if isinstance(file, str) and len(file.encode()) < _KV_STRING_MAX and Path(file).name != im.get("file"):
        diffs.append(f"file: file's metadata {Path(file).name!r}, receipt {im.get('file')!r}")
    return Check("imatrix metadata", not diffs, "; ".join(diffs) or f"file's metadata agrees with the receipt ({said})")


def format_audit(r: AuditReport) -> str:
    lines = [f"audit {r.artifact}" + (f" against {r.receipt}" if r.receipt else " (no receipt: file-only checks)")]
    for c in r.checks:
        lines.append(f"  {_SYMBOL[c.status]} {c.name}: {c.detail}")
    lines += [f"  - NOT checked: {u}" for u in r.unchecked]
    verdict = "PASS" if r.ok else f"FAIL ({len(r.failures)} check(s) failed)"
    if r.partial:
        verdict += f" (partial: {len(r.unchecked)} check(s) not run, without a receipt; give --receipt)"
    lines.append(verdict + (f" (trust: {r.trust.value}: {r.trust_text})" if r.trust else ""))
    return "\n".join(lines)


def sign_receipt(path: str | Path, signing_key: str | Path, artifact: str | Path | None = None) -> list[Path]:
    """Sign an existing receipt (rewritten as a DSSE envelope) and its artifact files (``X.sig``
    beside each; ``artifact``: the first subject's file, default beside the receipt). Only a
    receipt its own audit passes is signed (``ggufmtp audit ARTIFACT --receipt PATH``: its checksum,
    every subject file's sha256, the verdict its figures give, the tensors...): a signature must
    never launder an edit or vouch for a failing receipt. Returns the signatures written."""
    from .signing import sign_artifact

    rf = read_receipt(path)
    check_intact(rf, signing_key)
    folder = Path(artifact).parent if artifact else rf.path.parent
    files = [Path(artifact) if artifact and i == 0 else folder / Path(s.name).name for i, s in enumerate(rf.subjects)]
    report = audit(files[0], rf.path, progress=False)
    if not report.ok:
        raise AuditError(f"{rf.path}: its audit fails ({len(report.failures)} check(s)): " + "; ".join(
            f"{c.name}: {c.detail}" for c in report.failures[:3]) + "; not signing")
    signatures = [sign_artifact(f, signing_key) for f in files]
    write_statement(rf.path, rf.statement, signing_key)
    return signatures
