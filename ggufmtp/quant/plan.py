"""``ggufmtp plan``: what a recipe will do to a model, decided by llama.cpp itself.

The planned type of every tensor comes from a ``dry_run`` of libllama's ``llama_model_quantize``
with exactly the parameters the real run will use (so the plan *is* what llama.cpp does); ggufmtp
adds the reason for each decision and the pre-flight checks llama-quantize lacks: imatrix
coverage of every tensor whose type needs one (the MTP block, which llama-imatrix never
covers, is written last and would fail hours in), overrides that an F16/BF16/F32 base would
silently ignore, a missing or incomplete MTP block, an MTP recipe on an architecture
llama.cpp has no MTP draft graph for, and every planned conversion the pinned llama.cpp would abort
on rather than refuse (:mod:`.ggml_types`: a type it cannot write, a token-embedding or output type
whose block does not divide the rows; the dry run checks neither). Where llama.cpp falls back to
another type for a row width, the dry run reports it and the plan shows the type really written.

A model with several MTP blocks (``nextn_predict_layers`` > 1) is planned for all of them: the
recipe's ``{mtp}`` rules and ``[mtp]`` roles cover each block (:mod:`ggufmtp.quant.recipe`), every
block's tensors are flagged ``mtp`` and their imatrix coverage is checked.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import gguf

from ..constants import LLAMA_CPP_COMMIT, MTP_ARCHITECTURES
from ..errors import PlanError
from ..files.fsutil import not_a_regular_file
from ..files.hashing import sha256_file
from ..files.records import dataset_name
from ..fmt import human_bytes
from ..gguf.model import GGUFModel, MTPCheck, MTPStatus, block_prefixes, check_mtp, format_blocks
from ..imatrix import check as imx_check
from ..imatrix import entries as imx_entries
from ..imatrix import format as imx
from ..jsontypes import JsonObject
from ..runtime.libllama import KVOverride, QuantizeParams
from .ggml_types import tensor_problem
from .kv import kept_entries, parse_kv_override
from .qtypes import FTYPE_DEFAULT_TYPE, bits_per_weight
from .recipe import NO_IMATRIX_TYPES, Recipe, Rule, ftype_names, ggml_type_names
from .worker import run_quantize_interruptible

# ggml types llama.cpp does not count as quantized (ggml_is_quantized): no --allow-requantize needed
_UNQUANTIZED_TYPES = frozenset({"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"})

_TENSOR_LINE = re.compile(
    r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)\s+-\s+\[([^\]]*)\],\s+type =\s*(\S+),\s+size =\s*[\d.]+ MiB"
    r"(?:\s*->\s*[\d.]+ MiB \((\S+)\))?"
)
_FALLBACK_LINE = re.compile(r"warning:\s+(\S+)\s+- ncols.*falling back to\s+(\S+)")


def _norm_type(name: str) -> str:
    return name.strip().upper()


def row_bytes(type_name: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of ``shape`` (ne order) stored as ``type_name``."""
    qt = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    n = 1
    for d in shape:
        n *= d
    return n // block * size


@dataclasses.dataclass
class PlannedTensor:
    """One tensor's fate: its type before and after, why, and whether it needs imatrix statistics."""

    name: str
    shape: list[int]
    from_type: str
    to_type: str
    reason: str
    bytes: int
    mtp: bool = False
    needs_imatrix: bool = False
    has_imatrix: bool | None = None

    def to_dict(self) -> JsonObject:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class MtpSummary:
    """The MTP block(s) of a plan at a glance (the ``mtp`` object of plan and quantize JSON).
    ``block`` is the first MTP block, ``blocks`` all of them; ``tensors``, ``bytes``, ``types``
    count every block; ``eh_proj`` is the first block's (the head the draft starts from)."""

    block: int | None
    status: str
    tensors: int
    bytes: int
    types: dict[str, int]  # planned type -> tensor count
    eh_proj: str | None  # nextn.eh_proj's planned type: the tensor the draft quality hangs on most
    blocks: tuple[int, ...] = ()

    def to_dict(self) -> JsonObject:
        return {"block": self.block, "blocks": list(self.blocks), "status": self.status, "tensors": self.tensors,
                "bytes": self.bytes, "types": dict(self.types), "eh_proj": self.eh_proj}

    @property
    def where(self) -> str:
        """``blk.4`` or ``blk.40, blk.41``: the blocks as messages name them."""
        return format_blocks(list(self.blocks)) if self.blocks else f"blk.{self.block}"


@dataclasses.dataclass
class Plan:
    """The per-tensor plan plus totals; ``errors`` non-empty means quantize would refuse."""

    model: str
    recipe: str
    ftype: str
    mtp_block: int | None
    mtp_status: MTPStatus
    rules: list[Rule]
    tensors: list[PlannedTensor]
    n_params: int
    errors: list[str]
    warnings: list[str]
    imatrix: str | None = None
    imatrix_missing: list[str] = dataclasses.field(default_factory=list)
    imatrix_sha256: str | None = None  # the bytes the plan read: quantize uses them, the receipt names them
    params: QuantizeParams | None = dataclasses.field(default=None, repr=False)
    recipe_obj: Recipe | None = dataclasses.field(default=None, repr=False)
    mtp_blocks: list[int] = dataclasses.field(default_factory=list)  # every MTP block; mtp_block is the first

    def __post_init__(self) -> None:
        if not self.mtp_blocks and self.mtp_block is not None:  # built the single-block way
            self.mtp_blocks = [self.mtp_block]

    @property
    def size_bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)

    @property
    def bpw(self) -> float:
        return 8.0 * self.size_bytes / self.n_params if self.n_params else 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    def type_table(self) -> dict[str, str]:
        return {t.name: t.to_type for t in self.tensors}

    def mtp_summary(self) -> MtpSummary:
        mtp = [t for t in self.tensors if t.mtp]
        types: dict[str, int] = {}
        for t in mtp:
            types[t.to_type] = types.get(t.to_type, 0) + 1
        return MtpSummary(block=self.mtp_block, status=self.mtp_status, tensors=len(mtp),
                          bytes=sum(t.bytes for t in mtp), types=types,
                          eh_proj=next((t.to_type for t in mtp if ".nextn.eh_proj." in t.name), None),
                          blocks=tuple(self.mtp_blocks))

    def to_dict(self) -> JsonObject:
        return {
            "model": self.model, "recipe": self.recipe, "ftype": self.ftype,
            "mtp_block": self.mtp_block, "mtp_blocks": list(self.mtp_blocks), "mtp_status": self.mtp_status,
            "mtp": self.mtp_summary().to_dict(),
            "rules": [r.to_dict() for r in self.rules],
            "tensors": [t.to_dict() for t in self.tensors],
            "size_bytes": self.size_bytes, "n_params": self.n_params, "bpw": round(self.bpw, 4),
            "imatrix": self.imatrix, "imatrix_missing": self.imatrix_missing,
            "errors": self.errors, "warnings": self.warnings,
        }

    def llama_quantize_argv(self, out: str = "OUT.gguf", binary: str = "llama-quantize",
                            threads: int | None = None, by_name: bool = False) -> list[str]:
        """The exact equivalent llama-quantize command line (``by_name``: the input and imatrix by
        file name, as a receipt records it: no local path leaves the machine)."""
        r = self.recipe_obj
        argv = [binary]
        if self.imatrix:
            argv += ["--imatrix", Path(self.imatrix).name if by_name else self.imatrix]
        if r is not None and r.output_type:
            argv += ["--output-tensor-type", r.output_type.lower()]
        if r is not None and r.token_embedding_type:
            argv += ["--token-embedding-type", r.token_embedding_type.lower()]
        for rule in self.rules:
            argv += ["--tensor-type", f"{rule.llama_pattern}={rule.type.lower()}"]
        if r is not None:
            argv += [flag for flag, on in (("--leave-output-tensor", r.leave_output_tensor), ("--pure", r.pure),
                                           ("--allow-requantize", r.allow_requantize)) if on]
            for flag, values in (("--override-kv", r.kv_overrides), ("--include-weights", r.include_weights),
                                 ("--exclude-weights", r.exclude_weights)):
                argv += [a for v in values for a in (flag, v)]
        argv += [Path(self.model).name if by_name else self.model, out, self.ftype]
        if threads:
            argv.append(str(threads))
        return argv

    def llama_quantize_command(self, out: str = "OUT.gguf", binary: str = "llama-quantize",
                               threads: int | None = None, by_name: bool = False) -> str:
        return shlex.join(self.llama_quantize_argv(out, binary, threads, by_name))


def quantize_params(recipe: Recipe, rules: list[Rule], imatrix: imx_entries.Imatrix | None,
                    imatrix_arg: str | None, threads: int = 0, dry_run: bool = False) -> QuantizeParams:
    """The ``llama_model_quantize_params`` llama-quantize builds from the equivalent flags,
    including the ``quantize.imatrix.*`` metadata it adds through key overrides."""
    types = ggml_type_names()
    kv: list[KVOverride] = [parse_kv_override(t) for t in recipe.kv_overrides]  # llama-quantize: these first
    data = None
    if imatrix is not None:
        data = imx_entries.to_quantize_data(imatrix)
        # file names only: a published GGUF carries no local path (llama-quantize writes what it was given)
        kv.append(KVOverride("quantize.imatrix.file", Path(imatrix_arg or str(imatrix.path)).name))
        if imatrix.datasets:
            kv.append(KVOverride("quantize.imatrix.dataset", dataset_name(imatrix.datasets[0])))
        kv.append(KVOverride("quantize.imatrix.entries_count", len(data)))
        if imatrix.chunk_count and imatrix.chunk_count > 0:
            kv.append(KVOverride("quantize.imatrix.chunks_count", imatrix.chunk_count))
    return QuantizeParams(
        ftype=ftype_names()[recipe.ftype],
        nthread=threads,
        output_tensor_type=types[recipe.output_type] if recipe.output_type else None,
        token_embedding_type=types[recipe.token_embedding_type] if recipe.token_embedding_type else None,
        overrides=[(r.llama_pattern, types[r.type]) for r in rules],
        imatrix=data,
        kv_overrides=kv,
        dry_run=dry_run,
        pure=recipe.pure,
        quantize_output_tensor=not recipe.leave_output_tensor,
        allow_requantize=recipe.allow_requantize,
    )


@dataclasses.dataclass
class _Preflight:
    """What the pre-flight checks found, in the order they found it."""

    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)


def make_plan(model: str | Path, recipe: Recipe | str | Path, imatrix: str | Path | None = None,
              *, threads: int = 0, mtp_optional: bool = False) -> Plan:
    """Plan ``recipe`` on ``model`` (dry run in libllama); never raises for pre-flight problems,
    which land in ``Plan.errors``. Raises for unreadable inputs. ``model``: a path (``ggufmtp.plan``
    also takes ``builtin:NAME``)."""
    rec = recipe if isinstance(recipe, Recipe) else Recipe.load(recipe)
    gm = GGUFModel(model)
    mtp = check_mtp(gm)
    found = _Preflight()
    # a sidecar's MTP blocks are MTP blocks too: the joint search re-types a head cut from the source (#52)
    blocks = list(mtp.blocks) if mtp.status in (MTPStatus.COMPLETE, MTPStatus.INCOMPLETE, MTPStatus.SIDECAR) else []
    if rec.mtp_required and not mtp_optional:
        found.errors += _mtp_errors(model, rec, mtp, gm.architecture)
    rules = rec.resolved_rules(blocks)
    found.warnings += [f"rule {r.source} '{r.pattern}' -> {r.type} needs {r.max_mtp_index() + 1} MTP blocks "
                       f"({{mtp{r.max_mtp_index()}}}); the model has {len(blocks)} ({format_blocks(blocks)}): left out"
                       for r in rec.rules_beyond(blocks)]
    _check_recipe(rec, rules, found)
    imatrix_sha256 = sha256_file(imatrix) if imatrix and not_a_regular_file(imatrix) is None else None
    im = _read_imatrix(imatrix, rec, gm, found)
    mtp_prefixes = block_prefixes(blocks)
    rules, params, tensors, fallbacks = _dry_run_with_floor(
        gm, rec, rules, mtp_prefixes, lambda rs: quantize_params(rec, rs, im, str(imatrix) if imatrix else None,
                                                                 threads, dry_run=True))
    found.errors += _requantize_errors(model, rec, tensors)
    found.errors += _abort_errors(model, tensors)
    names = [t.name for t in tensors]
    for r in rules:
        if not any(re.search(r.llama_pattern, n) for n in names):
            found.warnings.append(f"rule {r.source} {r.pattern!r} -> {r.type} matches no tensor")
    missing_stats = _annotate(tensors, rec, rules, fallbacks, im, mtp_prefixes)
    _check_imatrix_coverage(missing_stats, rec, im, imatrix, mtp_prefixes, found,
                            below_8_bits=any(t.to_type not in NO_IMATRIX_TYPES for t in tensors))
    return Plan(model=str(model), recipe=rec.name, ftype=rec.ftype, mtp_block=blocks[0] if blocks else None,
                mtp_blocks=blocks, mtp_status=mtp.status,
                rules=rules, tensors=tensors, n_params=gm.n_params, errors=found.errors, warnings=found.warnings,
                imatrix=str(imatrix) if imatrix else None, imatrix_missing=missing_stats,
                imatrix_sha256=imatrix_sha256,
                params=dataclasses.replace(params, dry_run=False), recipe_obj=rec)


def _dry_run_with_floor(gm: GGUFModel, rec: Recipe, rules: list[Rule], mtp_prefixes: tuple[str, ...],
                        params_for: Callable[[list[Rule]], QuantizeParams]
                        ) -> tuple[list[Rule], QuantizeParams, list[PlannedTensor], dict[str, str]]:
    """llama.cpp's dry run; with ``[mtp] floor``, again with a rule for each MTP tensor that no rule
    names and that the first run planned below the floor (the type's mix may keep others higher:
    only those below are raised, by exact name, so the emitted llama-quantize line does the same)."""
    params = params_for(rules)
    tensors, fallbacks, _log = _dry_run(gm, params)
    for _ in range(len(tensors)):  # a pass raises every tensor below; the next only confirms
        extra = _floor_rules(rec, rules, tensors, mtp_prefixes)
        if not extra:
            break
        rules = rules + extra
        params = params_for(rules)
        tensors, fallbacks, _log = _dry_run(gm, params)
    return rules, params, tensors, fallbacks


def _floor_rules(rec: Recipe, rules: list[Rule], tensors: list[PlannedTensor], mtp_prefixes: tuple[str, ...]
                 ) -> list[Rule]:
    """``mtp.floor`` rules (anchored exact names) for MTP tensors planned below ``rec.mtp_floor``
    (bits per weight) that no rule names."""
    if rec.mtp_floor is None or rec.is_unquantized or not mtp_prefixes:
        return []
    floor = bits_per_weight(rec.mtp_floor)
    out = []
    for t in tensors:
        if (not t.name.startswith(mtp_prefixes) or bits_per_weight(t.to_type) >= floor
                or not imx_check.is_quantizable(t.name, t.shape, quantize_output_tensor=not rec.leave_output_tensor)
                or any(re.search(r.llama_pattern, t.name) for r in rules)):
            continue
        out.append(Rule("^" + t.name.replace(".", r"\.") + "$", rec.mtp_floor, "mtp.floor"))
    return out


def _requantize_errors(model: str | Path, rec: Recipe, tensors: list[PlannedTensor]) -> list[str]:
    """llama.cpp refuses to requantize an already quantized tensor without ``allow_requantize``,
    and only when it reaches it (the dry run does not check): say so before any work."""
    if rec.allow_requantize:
        return []
    again = [t for t in tensors if t.from_type not in _UNQUANTIZED_TYPES and t.to_type != t.from_type]
    if not again:
        return []
    types = sorted({t.from_type for t in again})
    return [f"{model}: {len(again)} tensor(s) are already quantized ({', '.join(types)}: {again[0].name} ...); "
            f"llama.cpp requantizes them only with --allow-requantize (allow_requantize = true in a recipe)"]


def _abort_errors(model: str | Path, tensors: list[PlannedTensor]) -> list[str]:
    """The planned conversions the pinned llama.cpp would abort on rather than refuse (a type it
    cannot write, a block that does not divide the rows: :func:`.ggml_types.tensor_problem`), as one
    error; the dry run does not check them, the real run asserts."""
    problems = [p for t in tensors if (p := tensor_problem(t.name, t.shape, t.from_type, t.to_type))]
    if not problems:
        return []
    more = f" (and {len(problems) - 1} more tensor(s))" if len(problems) > 1 else ""
    return [f"{model}: llama-quantize would abort here: {problems[0]}{more}"]


def _mtp_errors(model: str | Path, rec: Recipe, mtp: MTPCheck, arch: str) -> list[str]:
    """An MTP recipe on a model without a usable MTP block, as one error: first an architecture
    llama.cpp cannot draft with at all (converting again would not help), then the block itself."""
    if arch not in MTP_ARCHITECTURES:
        return [f"{model}: recipe {rec.name} requires an MTP block, but architecture {arch} has no MTP draft "
                f"graph in llama.cpp {LLAMA_CPP_COMMIT} (MTP architectures: {', '.join(sorted(MTP_ARCHITECTURES))}); "
                f"use a recipe with [mtp] required = false"]
    if mtp.status == MTPStatus.ABSENT:
        return [f"{model}: recipe {rec.name} expects an MTP block and the model has none "
                f"(nextn_predict_layers = 0); convert the checkpoint with its MTP layer kept"]
    if mtp.status == MTPStatus.INCOMPLETE:
        where = (f"MTP block blk.{mtp.block} is" if len(mtp.blocks) <= 1
                 else f"MTP blocks {format_blocks(mtp.blocks)} are")
        return [f"{model}: {where} incomplete (missing {', '.join(mtp.missing)})"]
    if mtp.status == MTPStatus.SIDECAR:
        return [f"{model}: is an MTP-only sidecar; quantize the full model"]
    return []


def _check_recipe(rec: Recipe, rules: list[Rule], found: _Preflight) -> None:
    """Overrides an F16/BF16/F32 base would silently ignore."""
    if rec.is_unquantized and rules:
        found.errors.append(f"recipe {rec.name}: ftype {rec.ftype} ignores every override rule (llama.cpp applies "
                            f"--tensor-type only when the base type is quantized); use a quantized ftype")
    if rec.is_unquantized and (rec.output_type or rec.token_embedding_type):
        found.warnings.append(f"recipe {rec.name}: output/token-embedding types apply, but the ftype is {rec.ftype}")


def _read_imatrix(imatrix: str | Path | None, rec: Recipe, gm: GGUFModel, found: _Preflight) -> imx_entries.Imatrix | None:
    """The imatrix, read and validated against the model; or the error of a recipe that requires one."""
    if imatrix is None:
        if rec.imatrix == "required":
            found.errors.append(f"recipe {rec.name} requires an imatrix (--imatrix FILE)")
        return None
    im = imx.read_imatrix(imatrix)
    if not im.has_metadata:
        found.errors.append(f"{imatrix}: GGUF imatrix without imatrix.datasets/chunk_count/chunk_size "
                            f"(llama-quantize refuses it); re-save it with `ggufmtp imatrix convert`")
    report = imx_check.validate(im, gm.shapes(), strict=False)
    found.errors += [f"{imatrix}: {p}" for p in getattr(report, "errors", [])]
    found.warnings += [f"{imatrix}: {p}" for p in getattr(report, "warnings", [])]
    if not (rec.include_weights or rec.exclude_weights):
        return im
    # --include-weights/--exclude-weights: llama-quantize filters the entries before it passes any,
    # and passes no imatrix at all (nor its quantize.imatrix.* keys) when none is left
    kept = kept_entries(im.entries, rec.include_weights, rec.exclude_weights)
    return dataclasses.replace(im, entries={n: im.entries[n] for n in kept}) if kept else None


def _annotate(tensors: list[PlannedTensor], rec: Recipe, rules: list[Rule], fallbacks: dict[str, str],
              im: imx_entries.Imatrix | None, mtp_prefixes: tuple[str, ...]) -> list[str]:
    """Fill in each tensor's MTP flag (any MTP block), reason and imatrix needs; returns the tensors
    lacking statistics."""
    covered = set(im.entries) if im is not None else set()
    missing_stats: list[str] = []
    for t in tensors:
        t.mtp = bool(mtp_prefixes) and t.name.startswith(mtp_prefixes)
        t.reason = _reason(t, rec, rules, fallbacks)
        t.needs_imatrix = imx_check.needs_imatrix(t.to_type, rec.ftype, t.name) and t.to_type != t.from_type
        if im is not None:
            t.has_imatrix = t.name in covered
        if t.needs_imatrix and not t.has_imatrix:
            missing_stats.append(t.name)
    return missing_stats


def _check_imatrix_coverage(missing_stats: list[str], rec: Recipe, im: imx_entries.Imatrix | None,
                            imatrix: str | Path | None, mtp_prefixes: tuple[str, ...], found: _Preflight, *,
                            below_8_bits: bool) -> None:
    """Types that need statistics the imatrix lacks (the MTP blocks, which llama-imatrix never covers,
    are written last: without this check the run would fail hours in)."""
    if missing_stats:
        what = "no imatrix was given" if im is None else f"{imatrix} has no statistics for them"
        head = [n for n in missing_stats if mtp_prefixes and n.startswith(mtp_prefixes)]
        trunk = [n for n in missing_stats if n not in head]
        mtp_note = (" (the MTP block: llama-imatrix never collects statistics for it; compute them with "
                    "`ggufmtp imatrix compute --mtp`, or give it a non-IQ type in the recipe's [mtp] table)"
                    if head else "")
        named = head + trunk[:6]  # every head tensor (a dozen a block), the trunk's first few
        found.errors.append(f"{len(missing_stats)} tensor(s) planned as a type that needs an imatrix, but {what}"
                            f"{mtp_note}: {', '.join(named)}{' ...' if len(named) < len(missing_stats) else ''}")
    elif rec.imatrix == "recommended" and im is None and below_8_bits:
        # by the planned types, not the ftype: a searched recipe is a Q8_0 ftype whose rules go lower
        found.warnings.append(f"recipe {rec.name} recommends an imatrix; quantizing without one")


def _dry_run(gm: GGUFModel, params: QuantizeParams) -> tuple[list[PlannedTensor], dict[str, str], list[str]]:
    # in a worker thread: Ctrl-C inside libllama's log callback would be swallowed (exit 130, not 0)
    run = run_quantize_interruptible(str(gm.shards[0]), "/dev/null", params)
    if run.exc is not None:
        raise PlanError(f"{gm.path}: llama.cpp dry run failed: {run.exc}")
    rc, log = run.rc, run.log
    if rc != 0:
        tail = "\n".join(line for line in log[-12:] if line.strip())
        raise PlanError(f"{gm.path}: llama.cpp dry run failed:\n{tail}")
    fallbacks: dict[str, str] = {}
    tensors: list[PlannedTensor] = []
    for line in log:
        m = _FALLBACK_LINE.search(line)
        if m:
            fallbacks[m.group(1)] = _norm_type(m.group(2))
            continue
        m = _TENSOR_LINE.match(line)
        if not m:
            continue
        name = m.group(3)
        info = gm.tensors[name]
        from_type = _norm_type(m.group(5))
        to_type = _norm_type(m.group(6)) if m.group(6) else from_type
        tensors.append(PlannedTensor(name=name, shape=list(info.shape), from_type=from_type, to_type=to_type,
                                     reason="", bytes=row_bytes(to_type, info.shape)))
    if len(tensors) != len(gm.tensors):
        raise PlanError(f"{gm.path}: could not read llama.cpp's plan ({len(tensors)} of {len(gm.tensors)} "
                        f"tensors in its log)")
    return tensors, fallbacks, log


def _reason(t: PlannedTensor, rec: Recipe, rules: list[Rule], fallbacks: dict[str, str]) -> str:
    if rec.leave_output_tensor and t.name == "output.weight":
        return "not quantized (leave_output_tensor)"
    if not imx_check.is_quantizable(t.name, t.shape):
        return "not quantized (1-D, norm, router or conv)"
    fb = f", shape fallback to {fallbacks[t.name]}" if t.name in fallbacks else ""
    if rec.token_embedding_type and t.name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embedding_type"
    if rec.output_type and t.name == "output.weight":
        return "output_type"
    default = FTYPE_DEFAULT_TYPE.get(rec.ftype)
    if not rec.is_unquantized:
        for i, r in enumerate(rules):
            if re.search(r.llama_pattern, t.name):
                return f"{r.source} #{i} '{r.pattern}'{fb}"
    if t.name in fallbacks:
        return f"shape fallback to {fallbacks[t.name]}"
    if t.to_type == default:
        return f"{rec.ftype} default" + (" (pure)" if rec.pure else "")
    return f"{rec.ftype} mix"


def format_plan(p: Plan, rows: list[PlannedTensor] | None = None) -> str:
    """The plan as a table; ``rows`` limits the tensors listed (totals always cover all)."""
    w = max((len(t.name) for t in p.tensors), default=20)
    lines = [f"plan: {p.model}  recipe {p.recipe} ({p.ftype})" + (f"  imatrix {p.imatrix}" if p.imatrix else ""),
             f"{'tensor':<{w}}  {'shape':<22} {'from':<7} {'to':<8} {'bytes':>10}  reason"]
    shown = p.tensors if rows is None else rows
    for t in shown:
        shape = "x".join(str(d) for d in t.shape)
        mark = "*" if t.mtp else " "
        lines.append(f"{t.name:<{w}}{mark} {shape:<22} {t.from_type:<7} {t.to_type:<8} {t.bytes:>10}  {t.reason}")
    if len(shown) < len(p.tensors):
        lines.append(f"... {len(p.tensors) - len(shown)} more trunk tensors not listed (--all lists them)")
    s = p.mtp_summary()
    lines += ["",
              f"total  {human_bytes(p.size_bytes)} ({p.size_bytes} bytes), {p.bpw:.3f} bpw, {len(p.tensors)} tensors",
              "MTP    " + (f"{s.where} ({p.mtp_status}): {s.tensors} tensors (* above), "
                          f"{human_bytes(s.bytes)}, types {', '.join(f'{t} x{n}' for t, n in s.types.items())}, eh_proj {s.eh_proj}"
                          if s.block is not None else f"no MTP block ({p.mtp_status})")]
    lines += [f"warning: {m}" for m in p.warnings]
    lines += [f"error: {m}" for m in p.errors]
    return "\n".join(lines)
