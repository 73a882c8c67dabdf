"""The heads stage of ``ggufmtp tune-joint`` (:mod:`ggufmtp.search.joint`, #52): each candidate head
type is the *source's* head re-typed (:func:`make_head`), drafting on the artifact's trunk (``-md``)
in one :func:`~ggufmtp.measure.verify.run.verify` against the source: verify's head finding and its
lossless finding decide whether the head stays, and its fair speedup at the fixed window is the
head type's speed (:class:`HeadStage`, which ``benchmarks/head_type_speed.py`` writes as a table and
``tune-joint --heads-from`` reads back instead of measuring again)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GgufmtpError, TuneError
from ..files.jsonfile import read_json_file
from ..files.shape import json_kind, record_problem
from ..fmt import ci_text, pct, times
from ..jsontypes import JsonObject
from ..measure.core.options import ServerOptions, VerifyOptions
from ..measure.core.records import ServedSet
from ..measure.core.suite import Suite
from ..measure.verify.reference import reference_head
from ..measure.verify.run import verify
from ..provenance.head import HeadDecision
from ..provenance.verdict import Finding
from ..quality.head_sweep import head_bytes, head_recipe
from ..quant.qtypes import bits_per_weight
from ..quant.quantize import quantize
from ..quant.recipe import Recipe, normalize_type

__all__ = ["OWN_HEAD", "OWN_SIDECAR", "HeadRow", "HeadSettings", "HeadStage", "make_head", "head_stage"]

OWN_HEAD = "own"  # the artifact's head as it is (its recipe is the artifact's recipe unchanged)
# The artifact's own head cut as a sidecar and served with -md like the re-typed heads: its row against
# OWN_HEAD's is what serving a head as a sidecar costs, so the types' rows compare like with like. A
# measurement only, never a candidate of the joint stage (the artifact serves its head built in).
OWN_SIDECAR = "own-md"


@dataclass(frozen=True)
class HeadRow:
    """One head of the heads stage: its type, file, bytes and what verify found at the fixed window."""

    head: str
    k: int
    file: str | None
    head_bytes: int
    decision: str
    lossless: bool
    acceptance: float | None
    speedup: float | None
    speedup_ci95: list[float | None]
    mtp_tokens_per_second: float | None
    vanilla_tokens_per_second: float | None
    kept: bool
    why: str | None = None

    def to_dict(self) -> JsonObject:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HeadRow:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class HeadSettings:
    """How the heads stage measures: the heads (the artifact's own first when ``own_head``), the
    window, the suite's first ``limit`` prompts under ``seeds`` with ``max_tokens``, the servers."""

    head_types: Sequence[str]
    own_head: bool
    k: int | None
    limit: int | None
    seeds: Sequence[int]
    suite: str | os.PathLike | Suite
    max_tokens: int
    server: ServerOptions

    def __post_init__(self) -> None:
        object.__setattr__(self, "head_types",
                           tuple(dict.fromkeys(normalize_type(t, "head types") for t in self.head_types)))


@dataclass(frozen=True)
class HeadStage:
    """The heads stage's rows and what they were measured on: the model's and the source's sha256,
    the recipe's name, the window and the hardware (a GPU's name, else "CPU")."""

    model: str
    model_sha256: str
    source: str
    source_sha256: list[str]
    recipe: str
    k: int
    hardware: str
    rows: list[HeadRow]

    def to_dict(self) -> JsonObject:
        return {**dataclasses.asdict(self), "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def load(cls, path: str | os.PathLike) -> HeadStage:
        """The heads stage of a ``head_type_speed.py`` JSON or a ``tune-joint --output`` JSON (its
        ``joint.heads_stage``); TuneError naming the file."""
        d = read_json_file(Path(path), "heads stage JSON")
        joint = d.get("joint") if isinstance(d, dict) else None
        d = joint.get("heads_stage", d) if isinstance(joint, dict) else d
        problem = record_problem(cls, d, nested=("rows",))
        if problem is None and not isinstance(d["rows"], list):
            problem = f"rows must be an array of head rows, not {json_kind(d['rows'])}"
        rows = d["rows"] if problem is None else []
        problem = problem or next((f"rows[{i}]: {p}" for i, r in enumerate(rows)
                                   if (p := record_problem(HeadRow, r)) is not None), None)
        if problem is not None:
            raise TuneError(f"{path}: not a heads stage (benchmarks/head_type_speed.py or tune-joint JSON): {problem}")
        names = {f.name for f in dataclasses.fields(cls)}  # unknown keys pass, as in a row
        return cls(**{**{k: v for k, v in d.items() if k in names}, "rows": [HeadRow.from_dict(r) for r in rows]})

    def check_for(self, model: Path, source: Path, recipe: Recipe, where: str) -> None:
        """TuneError naming ``where`` unless these rows were measured on ``model`` against ``source`` with ``recipe``."""
        got = (ServedSet.of(model).first.sha256, ServedSet.of(source).digests, recipe.name)
        want = (self.model_sha256, self.source_sha256, self.recipe)
        for what, g, w in zip(("the model's sha256", "the source's sha256", "the recipe"), got, want, strict=True):
            if g != w:
                raise TuneError(f"{where}: measured with {what} {w}, not {g} ({model.name}, {source.name}, "
                                f"{recipe.name}): run the heads stage again")

    def markdown(self) -> str:
        """The head-type speed table (benchmarks/README.md)."""
        L = [f"| head | head MiB | vs the source's head (k={self.k}) | lossless | kept | acceptance | MTP tok/s | "
             "vanilla tok/s | fair speedup (95% CI) |", "| --- | ---: | --- | --- | --- | ---: | ---: | ---: | --- |"]
        for r in self.rows:
            role = "yes" if r.kept else "(-md cost)" if r.head == OWN_SIDECAR else "no"
            L.append(f"| {r.head} | {r.head_bytes / 2**20:.1f} | {r.decision} | {'yes' if r.lossless else 'NO'} | {role} | "
                     f"{pct(r.acceptance)} | {_num(r.mtp_tokens_per_second)} | {_num(r.vanilla_tokens_per_second)} | "
                     f"{times(r.speedup)} {ci_text(r.speedup_ci95)} |")
        acc = [r.acceptance for r in self.rows if r.kept and r.acceptance is not None]
        if acc:
            L += ["", f"Acceptance across the kept heads: {pct(min(acc))} to {pct(max(acc))} "
                      f"(spread {100 * (max(acc) - min(acc)):.2f} points)."]
        return "\n".join(L)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def make_head(source: Path, recipe: Recipe, head_type: str) -> Path:
    """The source's MTP head re-typed to ``head_type`` as an MTP-only sidecar: the source's head cut
    once (:func:`reference_head`) and quantized with ``recipe`` whose ``[mtp]`` roles all say the type
    (no imatrix: llama-imatrix never collects the MTP block), cached beside the cut by content."""
    cut = reference_head(source, ServedSet.of(source))
    rec = dataclasses.replace(head_recipe(recipe, head_type), imatrix="none")
    key = hashlib.sha256(f"{cut.sha256}\n{rec.to_toml()}".encode()).hexdigest()[:16]
    out = cut.path.parent / f"mtp-{head_type}-{key}.gguf"
    if not out.is_file():
        try:
            quantize(cut.path, rec, out, progress=False, mtp_optional=True, split=None)
        except GgufmtpError as e:  # one line, the cache's path as the file's name
            why = "; ".join(x.strip() for x in str(e).replace(str(cut.path), cut.path.name).splitlines() if x.strip())
            raise TuneError(f"head type {head_type}: cannot re-type {source.name}'s head: {why}") from None
    return out


def _left_out(head: str, k: int, sidecar: Path | None, nbytes: int, decision: str, why: str) -> HeadRow:
    """The row of a head that was not measured (below the recipe's floor) or whose verify failed."""
    return HeadRow(head, k, sidecar.name if sidecar else None, nbytes, decision, False, None, None, [None, None], None,
                   None, False, why)


def _verify_head(model: Path, source: Path, head: str, sidecar: Path | None, recipe: Recipe,
                 o: HeadSettings) -> tuple[HeadRow, str | None]:
    """verify of one head on the artifact's trunk against the source, at the heads stage's window;
    (its row, the hardware's name: None when verify failed)."""
    k = o.k or recipe.verify.draft_n_max or 4
    vo = VerifyOptions(draft_n_max=k, seeds=tuple(o.seeds), suite=o.suite, limit=o.limit, max_tokens=o.max_tokens,
                       reference=source, sidecar=sidecar, server=o.server).with_defaults(thresholds=recipe.verify)
    try:
        res = verify(model, vo, progress=False)
    except GgufmtpError as e:  # e.g. a type this backend cannot serve: the head leaves, the search goes on
        failed = f"verify failed: {str(e).splitlines()[0][:300]}"
        return _left_out(head, k, sidecar, head_bytes(sidecar or model), "failed", failed), None
    decision = res.head.decision().value if res.head is not None else HeadDecision.INCONCLUSIVE.value
    lossless = res.findings is not None and res.findings.lossless == Finding.PASS
    c = res.main
    why = None if decision == HeadDecision.PRESERVED.value else f"head finding {decision} against {source.name}"
    if why is None and not lossless:
        why = "output not lossless"
    row = HeadRow(head, k, sidecar.name if sidecar else None, head_bytes(sidecar or model), decision, lossless,
                  c.acceptance, c.speedup, list(c.speedup_ci95), c.mtp_tokens_per_second, c.vanilla_tokens_per_second,
                  why is None, why)
    return row, (res.hardware.gpu if res.hardware.offloaded else None) or "CPU"


def _head_file(model: Path, source: Path, recipe: Recipe, head: str) -> Path | None:
    """The sidecar a head drafts from (None: the artifact's head built in)."""
    if head == OWN_HEAD:
        return None
    if head == OWN_SIDECAR:  # cut once per artifact by content, as the reference's head is
        return reference_head(model, ServedSet.of(model)).path
    return make_head(source, recipe, head)


def _below_floor(recipe: Recipe, head: str) -> str | None:
    """Why the recipe does not allow ``head`` (its ``[mtp] floor`` is above the type), else None."""
    if head in (OWN_HEAD, OWN_SIDECAR) or recipe.mtp_floor is None:
        return None
    if bits_per_weight(head) < bits_per_weight(recipe.mtp_floor):
        return f"below recipe {recipe.name}'s [mtp] floor {recipe.mtp_floor}: not measured"
    return None


def _head_row(model: Path, source: Path, recipe: Recipe, head: str, o: HeadSettings) -> tuple[HeadRow, str | None]:
    """One head's row: not measured when the recipe does not allow it, failed when it cannot be made
    or served, else verify's (the own head as a sidecar is never a candidate)."""
    k = o.k or recipe.verify.draft_n_max or 4
    if (why := _below_floor(recipe, head)) is not None:
        return _left_out(head, k, None, 0, "not measured", why), None
    try:
        sidecar = _head_file(model, source, recipe, head)
    except GgufmtpError as e:
        return _left_out(head, k, None, 0, "failed", f"cannot be made: {str(e).splitlines()[0][:300]}"), None
    row, hw = _verify_head(model, source, head, sidecar, recipe, o)
    if head == OWN_SIDECAR:
        row = dataclasses.replace(row, kept=False, why=row.why or f"the {OWN_HEAD} head served as a sidecar (-md): "
                                  "what -md costs against the head built in; not a candidate")
    return row, hw


def head_stage(model: str | os.PathLike, source: str | os.PathLike, recipe: Recipe, o: HeadSettings,
               log: Callable[[str], None] | None = None) -> HeadStage:
    """Every candidate head verified at the fixed window, in order: the artifact's own (built in, then
    as a sidecar: :data:`OWN_SIDECAR`) first; a head that cannot be made or served, or that the
    recipe's ``[mtp] floor`` does not allow, leaves with the reason and the stage goes on. ``log``:
    a line per head as it is decided."""
    model, source = Path(model), Path(source)
    rows, hw = [], "CPU"
    for t in ([OWN_HEAD, OWN_SIDECAR] if o.own_head else []) + list(o.head_types):
        row, got = _head_row(model, source, recipe, t, o)
        hw = got or hw
        rows.append(row)
        if log:
            log(f"head {t}: {row.decision}, acceptance {pct(row.acceptance)}, fair speedup {times(row.speedup)} "
                f"{ci_text(row.speedup_ci95)}" + (f" -- {row.why}" if row.why else ""))
    return HeadStage(model.name, ServedSet.of(model).first.sha256, source.name, ServedSet.of(source).digests,
                     recipe.name, rows[0].k, hw, rows)
