"""Receipts of a split model's files, and whether a trunk and a sidecar belong together.

``ggufmtp sidecar`` (:mod:`ggufmtp.quant.sidecar`) writes an MTP-only sidecar and optionally the
trunk without the head. Each gets the project's one receipt (:mod:`ggufmtp.provenance.receipt`)
with a ``pair`` section: its ``role``, the full model it was split from (``made_from``: name and
sha256; with a recipe, the variant quantized on the way), ``source_sha256`` (the base model's file
digests: the BF16 source every variant of the model is made from) and the other file written with
it (``trunk`` or ``sidecar``, name and sha256).

A trunk and a sidecar pair (:func:`pair_problem`) when the files fit each other as llama.cpp loads
them (same architecture, trunk layer count and embedding shape: the head reads the trunk's hidden
state) and, where the sidecar has a receipt, when the trunk is the one it was written with, the
model it was split from, or a model whose own receipt names the same source. Anything else is one
error naming both files and both digests.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..constants import SPLIT_TOOL
from ..errors import AuditError
from ..files.hashing import sha256_file
from ..gguf.model import GGUFModel, MTPStatus, check_mtp
from .binding import source_digests
from .receipt import (
    Receipt,
    _planned_imatrix,
    _recipe_section,
    _result_section,
    base_model_section,
    build_statement,
    default_receipt_path,
    read_receipt,
    seal,
    write_statement,
)
from .statement import NamedDigest, PairSection, Predicate, RecipeSection, ResultSection, SplitSection, Statement
from .toolchain import toolchain

if TYPE_CHECKING:
    from ..quant.quantize import QuantizeResult
    from ..quant.sidecar import ReceiptWriter, StagedPair

__all__ = ["PairSources", "expected_status", "pair_problem", "pair_receipt_writer", "pair_section_problems",
           "write_pair_receipts", "write_trunk_receipt"]


@dataclasses.dataclass(frozen=True)
class PairSources:
    """Where a split came from: ``model`` as given (``model_arg``: its name for the receipt), the
    ``full`` file that was split (``model`` itself, or the variant ``quantized`` from it), and the
    imatrix of that quantization."""

    model: Path
    model_arg: str
    full: Path
    quantized: QuantizeResult | None = None
    imatrix: str | None = None


def _named(path: Path, sha256: str, name: str | None = None) -> NamedDigest:
    return {"name": name or path.name, "sha256": sha256}


def _model_receipt(model: Path) -> Receipt | None:
    """The receipt beside ``model`` when it describes these bytes (a variant ``quantize`` wrote)."""
    path = default_receipt_path(model)
    if not path.is_file():
        return None
    rf = read_receipt(path)
    if not rf.intact or rf.artifact.name != model.name or rf.artifact.sha256 != sha256_file(model):
        raise AuditError(f"{path}: the receipt beside {model.name} does not describe its bytes (edited, or of "
                           f"another file); fix or remove it")
    return rf


def _base(src: PairSources) -> tuple[Predicate, str]:
    """The predicate's base model, imatrix and recipe, and the split file's sha256."""
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    full_sha = sha256_file(src.full)
    q = src.quantized
    if q is not None:
        base = base_model_section(src.model, src.model_arg)
        imatrix, recipe = _planned_imatrix(q.plan, src.imatrix), _recipe_section(q.plan, src.full.name)
        started = q.started_at
    elif (rf := _model_receipt(src.model)) is not None:
        p = rf.predicate
        base, imatrix, recipe, started = p["base_model"], p["imatrix"], p["recipe"], now
    else:
        base, imatrix, started = base_model_section(src.model, src.model_arg, known={str(src.full.resolve()): full_sha}), None, now
        recipe = _kept_recipe(GGUFModel(src.full))
    predicate: Predicate = {"base_model": base, "imatrix": imatrix, "recipe": recipe, "result": cast(ResultSection, {}),
                            "toolchain": toolchain(), "started_at": started, "finished_at": now, "verification": None}
    return predicate, full_sha


def _kept_recipe(gm: GGUFModel) -> RecipeSection:
    """A split of a model with no receipt: its tensors kept as they are."""
    return {"name": "kept", "file": None, "sha256": None, "ftype": gm.file_type or "unknown", "output_type": None,
            "token_embedding_type": None, "rules": [], "llama_quantize_command": ""}


def write_pair_receipts(src: PairSources, sidecar: tuple[Path, Path], trunk: tuple[Path, Path] | None,
                        signing_key: str | Path | None = None) -> tuple[Path, Path | None]:
    """Write the receipts of a sidecar (and trunk), given as ``(staged file, final path)``: each at
    ``FINAL.receipt.json``, naming the other file's digest; with ``signing_key`` each receipt is a
    signed DSSE envelope and each file gets ``FINAL.sig``. Returns the receipts' paths."""
    predicate, full_sha = _base(src)
    digests = {role: sha256_file(staged) for role, (staged, _) in
               (("sidecar", sidecar), *((("trunk", trunk),) if trunk else ()))}
    side_named = _named(sidecar[1], digests["sidecar"])
    trunk_named = _named(trunk[1], digests["trunk"]) if trunk else None
    made_from = _made_from(src, full_sha)
    side = _write_part_receipt(([sidecar[0]], sidecar[1]), {str(sidecar[0]): digests["sidecar"]}, predicate,
                               _pair("sidecar", made_from, predicate, trunk=trunk_named), signing_key)
    if trunk is None:
        return side, None
    return side, _write_part_receipt(([trunk[0]], trunk[1]), {str(trunk[0]): digests["trunk"]}, predicate,
                                     _pair("trunk", made_from, predicate, sidecar=side_named), signing_key)


def write_trunk_receipt(src: PairSources, trunk: tuple[list[Path], Path], sidecar: Path,
                        signing_key: str | Path | None = None, split_max_size: str | None = None) -> Path:
    """The receipt of a trunk (``(staged files, final path of the first)``: one file, or the shards
    ``llama-gguf-split --split-max-size split_max_size`` wrote) cut from ``src.full`` to be served
    with the published ``sidecar`` made apart from the same source (a ladder's trunk-only variant):
    its pair section names that sidecar by name and sha256. Returns the receipt's path."""
    predicate, full_sha = _base(src)
    side_named = _named(sidecar, sha256_file(sidecar))
    staged, final = trunk
    split: SplitSection | None = ({"count": len(staged), "max_size": str(split_max_size), "tool": SPLIT_TOOL}
                                  if len(staged) > 1 else None)
    return _write_part_receipt((staged, final), {str(f): sha256_file(f) for f in staged}, predicate,
                               _pair("trunk", _made_from(src, full_sha), predicate, sidecar=side_named), signing_key,
                               split)


def _made_from(src: PairSources, full_sha: str) -> NamedDigest:
    return _named(src.full, full_sha, src.model.name if src.quantized is None else src.full.name)


def _pair(role: str, made_from: NamedDigest, predicate: Predicate, *, trunk: NamedDigest | None = None,
          sidecar: NamedDigest | None = None) -> PairSection:
    source = sorted({f["sha256"] for f in predicate["base_model"]["files"]})
    return {"role": role, "made_from": made_from, "source_sha256": source, "trunk": trunk, "sidecar": sidecar}


def _write_part_receipt(files: tuple[list[Path], Path], digests: dict[str, str], predicate: Predicate,
                        pair: PairSection, signing_key: str | Path | None, split: SplitSection | None = None) -> Path:
    """One part's receipt at ``FINAL.receipt.json`` (``FINAL``: the first file's published path; and
    each file's ``.sig`` beside it with ``signing_key``). ``files``: the staged file, or a split
    part's shards (``split``: the receipt's ``result.split``, the subjects every shard in order)."""
    from .signing import sign_artifact, signature_path

    staged, final = files
    result = _result_section(GGUFModel(staged[0]))
    if split is not None:
        result["split"] = split
    p = cast(Predicate, {**predicate, "result": result, "pair": pair})
    st = build_statement(staged, p, digests)
    if signing_key is not None:
        for f in staged:
            sign_artifact(f, signing_key, signature=signature_path(final.parent / f.name if len(staged) > 1 else final))
    return write_statement(default_receipt_path(final), seal(st), signing_key)


def expected_status(st: Statement) -> MTPStatus:
    """The MTP status a receipt's artifact must have: a sidecar's, a trunk's (absent) or complete."""
    pair = st["predicate"].get("pair")
    if pair is None:
        return MTPStatus.COMPLETE
    return MTPStatus.SIDECAR if pair["role"] == "sidecar" else MTPStatus.ABSENT


def pair_section_problems(st: Statement) -> list[str]:
    """What contradicts itself in a ``pair`` section: the other file named by the wrong role."""
    pair = st["predicate"].get("pair")
    if pair is None:
        return []
    other = "trunk" if pair["role"] == "sidecar" else "sidecar"
    own = "sidecar" if pair["role"] == "sidecar" else "trunk"
    if pair.get(own) is not None:
        return [f"a {pair['role']}'s pair section names a {own} besides itself (only the {other} written with it)"]
    return []


def _shape_problem(trunk: GGUFModel, side: GGUFModel) -> str | None:
    if trunk.architecture != side.architecture:
        return f"architecture {trunk.architecture}, the sidecar's {side.architecture}"
    if trunk.trunk_layers != side.trunk_layers:
        return f"{trunk.trunk_layers} trunk layers, the sidecar's head follows {side.trunk_layers}"
    a, b = trunk.tensors.get("token_embd.weight"), side.tensors.get("token_embd.weight")
    if a is None or b is None or a.shape != b.shape:
        return (f"token_embd {a.shape if a else 'absent'}, the sidecar's {b.shape if b else 'absent'} "
                "(another vocabulary or width)")
    return None


def pair_problem(trunk: str | Path, sidecar: str | Path, *, bound: bool = False, trunk_receipt: Receipt | None = None,
                 sidecar_receipt: Receipt | None = None) -> str | None:
    """Why ``sidecar`` cannot be served as the MTP draft of ``trunk`` (None when it can): see the
    module docstring. Receipts are the ones given, else read beside each file (``FILE.receipt.json``).
    ``bound`` (audit, the upload gate): a sidecar without a receipt describing its bytes is refused
    too: nothing then says which source its head was made from."""
    trunk, sidecar = Path(trunk), Path(sidecar)
    for p in (trunk, sidecar):
        if not p.is_file():
            return f"{p}: no such file"
    tg, sg = GGUFModel(trunk), GGUFModel(sidecar)
    if check_mtp(sg).status != MTPStatus.SIDECAR:
        return f"{sidecar}: not an MTP-only sidecar (its MTP status is {check_mtp(sg).status})"
    if check_mtp(tg).status == MTPStatus.SIDECAR:
        return f"{trunk}: is an MTP-only sidecar itself, not a trunk"
    if (shape := _shape_problem(tg, sg)) is not None:
        return f"{sidecar} does not fit {trunk}: the trunk has {shape}"
    srec = default_receipt_path(sidecar)
    if sidecar_receipt is None and not srec.is_file():
        return (f"{sidecar.name} has no receipt ({srec.name} beside it): nothing says which source its head was made "
                f"from, so it cannot be bound to {trunk.name}; publish it with the receipt `ggufmtp sidecar` wrote"
                if bound else None)  # verify: nothing recorded to bind, the files fit
    rf = sidecar_receipt or read_receipt(srec)
    side_pair = rf.predicate.get("pair")
    if side_pair is None:
        return f"{rf.path}: not a sidecar's receipt (no pair section)"
    if bound and (ssha := sha256_file(sidecar)) != rf.artifact.sha256:
        return (f"{rf.path} describes sha256 {rf.artifact.sha256}, not {sidecar.name} (sha256 {ssha}): the sidecar "
                f"has no receipt of its own")
    return _bound_problem(trunk, sidecar, side_pair, trunk_receipt)


def _bound_problem(trunk: Path, sidecar: Path, side_pair: PairSection, trunk_receipt: Receipt | None) -> str | None:
    """Why the sidecar's receipt (its ``pair`` section) does not bind it to ``trunk``: it was written
    with that trunk, split from it, or made from the source the trunk's receipt names."""
    tsha = sha256_file(trunk)
    bound = {d["sha256"] for d in (side_pair["made_from"], side_pair.get("trunk")) if d}
    if tsha in bound:
        return None
    trec = default_receipt_path(trunk)
    trf = trunk_receipt or (read_receipt(trec) if trec.is_file() else None)
    if trf is not None and source_digests(trf.statement) == frozenset(side_pair["source_sha256"]):
        return None
    made = side_pair.get("trunk") or side_pair["made_from"]
    return (f"{sidecar.name} belongs to another model: it was made with {made['name']} (sha256 {made['sha256']}) "
            f"from source sha256 {', '.join(side_pair['source_sha256'])}; {trunk.name} (sha256 {tsha}) is not that "
            f"trunk" + (" and its receipt names another source" if trf is not None else
                        " and has no receipt naming the same source"))


def pair_receipt_writer(signing_key: Path | None = None) -> ReceiptWriter:
    """The ``before_publish`` of :func:`ggufmtp.quant.sidecar.make_sidecar` that writes each staged
    file's receipt (signed with ``signing_key``, when given)."""
    def write(st: StagedPair) -> tuple[Path | None, Path | None]:
        return write_pair_receipts(PairSources(st.model, st.model_arg, st.full, st.quantized, st.imatrix), st.sidecar,
                                   st.trunk, signing_key)
    return write
