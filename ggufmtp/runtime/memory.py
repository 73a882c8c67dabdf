"""The memory plan of a verification: what each llama-server it starts will hold on each GPU, by
phase (the servers resident at the same time), against the GPUs' free memory, decided before any
work (``verify`` before serving; ``run`` and ``ladder`` before quantizing).

Per server (vanilla, MTP, default vanilla, reference) the plan adds, on each device:

- **weights**: every tensor's bytes (the GGUF header, read with :mod:`ggufmtp.gguf.reader`; before
  quantizing, the quantization plan's bytes), placed as the pinned llama.cpp places them
  (``src/llama-model.cpp: load_tensors``): the input layer (``token_embd``) always in host memory;
  repeating layer ``il`` on the GPU when ``il >= n_layer_all + 1 - ngl`` (no ``-ngl`` with
  ``--fit off``: every layer); every other tensor with the output layer (``il = n_layer_all``);
  then the partial-offload overrides (:class:`Offload`: ``-ot``, ``--cpu-moe``, ``--n-cpu-moe``),
  the first matching pattern winning (``llama-model-loader.cpp``). A server without
  ``--spec-type draft-mtp`` does not load the MTP block (``TENSOR_SKIP`` without ``load_mtp`` in
  every MTP architecture's loader); a GGUF without ``output.weight`` puts a second copy of
  ``token_embd`` with the output layer (``TENSOR_DUPLICATED``).
- **KV cache** and **recurrent state**: the layout of :mod:`ggufmtp.runtime.kv_layout` (per cache
  layer its K and V widths and cell count: plain, hybrid, MLA, SWA, DSA, GLM5-Next's indexer,
  DeepSeek-V4's compressed caches; per recurrent layer one F32 row width), times the server's
  settings: ``n_ctx_seq = pad256(pad256(ctx) / slots)`` cells per slot for the context's caches
  (``llama-context.cpp``; one stream per slot, as the KV cache is not unified under an explicit
  ``--parallel``), the window caches' ``pad256(min(n_ctx_seq, n_swa + ubatch))``, the KV types
  (f16 unless ``-ctk``/``-ctv``; the MTP draft context's are ``-ctkd``/``-ctvd``, f16 by default:
  :func:`plan_for_verify` plans them at f16, an upper bound unless ``-ctkd f32`` is passed),
  on the layer's device. The MTP server's draft context holds the MTP layer(s). Recurrent rows:
  per slot ``1 + n_rs_seq``, ``n_rs_seq`` the MTP server's draft window (rollback snapshots) on the
  architectures that roll back (``llm_arch_supports_rs_rollback``), else 0. Exact, to the 0.01 MiB
  llama-server prints, for every architecture ggufmtp synthesizes (tests/test_memory_plan.py), on
  the assumptions :mod:`~ggufmtp.runtime.kv_layout` names (flash attention on, no ``--swa-full``).
- **compute buffers** (:mod:`ggufmtp.runtime.compute`, :func:`planned_compute`): ggufmtp's
  :func:`compute_estimate` for each context (the main one and the MTP draft one) on the output
  layer's device, calibrated on GQA and hybrid graphs (qwen35moe, glm4moe: 42.8 GiB planned against
  42.0 measured on an H200 at the 35B-A3B shape). For the graphs it is low for (MLA, DSA,
  DeepSeek-V4, GLM5-Next: :data:`COMPUTE_UNCALIBRATED`, 1.4-7.5x on the tiny models) the larger of
  it and llama.cpp's own projection of the main context (``llama-fit-params --fit-print on`` with
  the server's sizing flags: :func:`fit_flags`, :mod:`ggufmtp.runtime.fit_params`), per device,
  each device's floored MiB + 1: a safe upper bound, as that tool reserves every token of the
  physical batch as an output (one logits tensor more: 501 MiB projected against 76.02 reported on
  a 4-layer model with Qwen3.6's 248,320-token vocabulary, why the calibrated graphs do not use
  it); the draft context's is bounded by the same projection. Where the tool is missing or fails,
  the estimate, with a note. The server's :class:`ComputeFigures` say which (``source``,
  ``draft_source``: ``llama.cpp`` or ``estimate``) and why; plus :data:`GPU_PROCESS_OVERHEAD_MIB`
  per server for the CUDA context itself (and :data:`HOST_WEIGHTS_OVERHEAD_MIB` more where weights
  stay in host memory), ggufmtp's figures.
  Weights, KV and states are ggufmtp's own (exact, and known before quantizing, from the plan's bytes).

Free memory: :envvar:`GGUFMTP_GPU_FREE_MIB` (comma-separated MiB per GPU, for tests and for
planning another machine), else ``nvidia-smi``'s ``memory.free``. Without a GPU the plan is
informational. Several GPUs: each server's layers are split in proportion to the memory free when
it starts, as llama.cpp does without ``--tensor-split``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import GgufmtpError, MemoryPlanError, VerifyError
from ..gguf.model import split_shards
from ..gguf.reader import GGUFHeader, read_header, tensor_nbytes
from .compute import (
    COMPUTE_ROWS,
    COMPUTE_ROWS_DRAFT,
    COMPUTE_TOLERANCE,
    COMPUTE_UNCALIBRATED,
    ComputeFigures,
    Source,
    compute_estimate,
    planned_compute,
)
from .fit_params import Projected, project_memory, sizing_flags, ubatch_of
from .hardware import nvidia_gpus
from .kv_layout import KVLayout, cells_per_stream, kv_layout
from .memory_records import GPU_PROCESS_OVERHEAD_MIB, MIB, MemoryPlan, PhaseMemory, Role, ServerMemory, Usage
from .offload import Offload

__all__ = ["FREE_MEMORY_ENV", "ModelFacts", "Role", "ServerSpec", "Usage", "ServerMemory", "PhaseMemory", "MemoryPlan",
           "MemoryPlanError", "COMPUTE_ROWS", "COMPUTE_ROWS_DRAFT", "COMPUTE_TOLERANCE", "COMPUTE_UNCALIBRATED",
           "ComputeFigures", "Source", "compute_estimate", "fit_flags", "gpu_free", "plan_memory", "plan_for_verify"]

FREE_MEMORY_ENV = "GGUFMTP_GPU_FREE_MIB"
#: More per server when weights stay in host memory (``--n-cpu-moe``, ``--cpu-moe``, ``-ot``): the
#: CUDA backend stages host weights through device buffers for large batches (op offload). The same
#: run measured 1.1 GiB beyond the formulas with 512 MiB a server for vanilla + MTP at --n-cpu-moe
#: 28 and 36 (17.2 and 10.0 GiB), and --n-cpu-moe 21, which they called a fit at 22.9 GiB of 23.0,
#: ran out of memory.
HOST_WEIGHTS_OVERHEAD_MIB = 256
#: llama.cpp's default physical batch (``-ub``), the compute graph's worst case
DEFAULT_UBATCH = 512
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_INPUT_TENSORS = ("token_embd.", "token_types.", "position_embd.")
# llm_arch_supports_rs_rollback (src/llama-arch.cpp at 0c1e570)
_RS_ROLLBACK = frozenset({"kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
                          "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"})


# ----------------------------------------------------------------------------- what a GGUF holds


@dataclass(frozen=True)
class ModelFacts:
    """What the plan needs of one GGUF: its tensors' bytes and its cache layout. ``tensors`` maps
    every tensor's name to its bytes (all shards of a split model); ``layout`` the caches of its
    main and MTP draft contexts (:mod:`ggufmtp.runtime.kv_layout`)."""

    name: str
    arch: str
    n_layer_all: int
    n_nextn: int
    n_embd: int
    n_vocab: int
    n_head: int
    n_ctx_train: int
    tensors: Mapping[str, int]
    layout: KVLayout = field(default_factory=KVLayout)
    elements: Mapping[str, int] = field(default_factory=dict, repr=False)  # values per tensor
    # the file it was read from: what llama-fit-params projects the main context of (the compute
    # graph does not depend on the weights' types, so a quantization plan's bytes keep the source's)
    path: Path | None = field(default=None, repr=False)

    @property
    def weight_bytes(self) -> int:
        return sum(self.tensors.values())

    @classmethod
    def read(cls, path: str | os.PathLike, tensor_bytes: Mapping[str, int] | None = None) -> ModelFacts:
        """The facts of the GGUF at ``path`` (every shard of a split model); ``tensor_bytes``
        replaces the file's bytes per tensor (a quantization plan's, before the artifact exists)."""
        p = Path(path)
        headers = [read_header(s) for s in split_shards(p)]
        sizes = {t.name: tensor_nbytes(t.shape, t.type_id)[1] for h in headers for t in h.tensors}
        if tensor_bytes is not None:
            sizes.update({k: int(v) for k, v in tensor_bytes.items() if k in sizes})
        facts = _facts(p.name, headers[0], {t.name: t.shape for h in headers for t in h.tensors}, sizes)
        return dataclasses.replace(facts, elements={t.name: math.prod(t.shape) for h in headers for t in h.tensors},
                                   path=p)


def _key(meta: Mapping[str, Any], arch: str, key: str, default: Any = None) -> Any:
    v = meta.get(f"{arch}.{key}")
    return default if v is None or isinstance(v, str) else v


def _facts(name: str, h: GGUFHeader, shapes: Mapping[str, tuple[int, ...]], sizes: dict[str, int]) -> ModelFacts:
    meta = h.metadata
    arch = str(meta.get("general.architecture") or "")
    n_all = int(_key(meta, arch, "block_count", 0))
    if n_all <= 0:
        raise GgufmtpError(f"{name}: no {arch}.block_count in the header", path=name)
    heads = _key(meta, arch, "attention.head_count", 1)
    embd = shapes.get("token_embd.weight") or shapes.get("output.weight") or (0, 0)
    vocab = h.array_lengths.get("tokenizer.ggml.tokens") or int(embd[1]) if len(embd) > 1 else 0
    return ModelFacts(
        name=name, arch=arch, n_layer_all=n_all, n_nextn=int(_key(meta, arch, "nextn_predict_layers", 0) or 0),
        n_embd=int(_key(meta, arch, "embedding_length", 0)), n_vocab=int(vocab),
        n_head=max(heads) if isinstance(heads, list) else int(heads or 1),
        n_ctx_train=int(_key(meta, arch, "context_length", 4096) or 4096), tensors=dict(sizes),
        layout=kv_layout(meta, shapes, arch))


# ----------------------------------------------------------------------------- one server


@dataclass(frozen=True)
class ServerSpec:
    """One llama-server as the plan sees it: its model, whether it drafts (loads the MTP block,
    runs a draft context and keeps rollback states), and the settings every arm shares."""

    role: Role
    model: ModelFacts
    mtp: bool
    gpu_layers: int | str | None = None
    offload: Offload = field(default_factory=Offload)
    ctx_size: int | None = 4096
    parallel: int = 1
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    draft_n_max: int = 0
    ubatch: int = DEFAULT_UBATCH
    # the MTP draft context's KV types: llama-server's -ctkd/-ctvd (f16 by default), not -ctk/-ctv
    draft_cache_type_k: str | None = None
    draft_cache_type_v: str | None = None
    # the arm's own llama-server flags (--server-arg & co.): their sizing ones reach llama-fit-params
    args: tuple[str, ...] = ()

    @property
    def n_gpu_layers(self) -> int:
        """llama.cpp's layer count on the GPU (``n_layer_all + 1`` = every layer and the output):
        no ``-ngl`` (``--fit off``), ``all`` and ``auto`` offload everything."""
        g = self.gpu_layers
        if g is None or (isinstance(g, str) and not g.lstrip("-").isdigit()) or int(g) < 0:
            return self.model.n_layer_all + 1
        return min(int(g), self.model.n_layer_all + 1)

    @property
    def streams(self) -> int:
        """The caches' streams: one per slot (llama-server does not unify the KV cache under an
        explicit ``--parallel``)."""
        return max(1, self.parallel)

    @property
    def n_ctx_seq(self) -> int:
        """A slot's context: ``pad256(pad256(ctx) / slots)`` (``llama-context.cpp``; no ``-c``: the
        training context)."""
        return _pad(_pad(self.ctx_size or self.model.n_ctx_train, 256) // self.streams, 256)

    @property
    def cells(self) -> int:
        """The context's KV cells in total (the compute graph's attention width)."""
        return self.n_ctx_seq * self.streams


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _row_bytes(type_name: str | None, width: int) -> int:
    qt = GGMLQuantizationType[(type_name or "f16").upper()]
    block, size = GGML_QUANT_SIZES[qt]
    return width // block * size


def _layer_gpus(n_all: int, ngl: int, free: Sequence[int]) -> list[int | None]:
    """The GPU of each layer 0..n_all (n_all: the output layer), or None (host), as
    ``load_tensors`` assigns them: the last ``ngl`` layers, split by the GPUs' free memory."""
    total = sum(free)
    cum, acc = [], 0.0
    for f in free:
        acc += f / total if total else 1 / len(free)
        cum.append(acc)
    start, act = max(n_all + 1 - ngl, 0), min(ngl, n_all + 1)
    out: list[int | None] = []
    for il in range(n_all + 1):
        if il < start or il - start >= act:
            out.append(None)
        else:
            x = (il - start) / act
            out.append(min(next((i for i, c in enumerate(cum) if c > x), len(cum) - 1), len(free) - 1))
    return out


def _weights(s: ServerSpec, devs: list[int | None]) -> dict[int | None, int]:
    """Weight bytes per device (None: host) of the server ``s``."""
    m, rules = s.model, s.offload.rules()
    out: dict[int | None, int] = {}
    placed = list(m.tensors.items())
    if "output.weight" not in m.tensors and "token_embd.weight" in m.tensors:
        placed.append(("token_embd.weight#output", m.tensors["token_embd.weight"]))  # TENSOR_DUPLICATED
    for name, nbytes in placed:
        blk = _BLOCK.match(name)
        if blk and int(blk.group(1)) >= m.n_layer_all - m.n_nextn and not s.mtp:
            continue  # the MTP block is not loaded without --spec-type draft-mtp
        dev = (devs[int(blk.group(1))] if blk else None if name.startswith(_INPUT_TENSORS) and "#" not in name
               else devs[m.n_layer_all])
        real = name.split("#", 1)[0]
        dev = next((target for pattern, target in rules if pattern.search(real)), dev)
        out[dev] = out.get(dev, 0) + nbytes
    return out


def server_memory(s: ServerSpec, free: Sequence[int], draft: ModelFacts | None = None,
                  projected: Projected | None = None) -> ServerMemory:
    """The memory of the server ``s`` when it starts with ``free`` bytes free per GPU (the split of
    its layers follows them); ``draft``: an MTP-only sidecar it drafts with (``-md``);
    ``projected``: llama.cpp's projection of its main context (:func:`fit_flags`), whose compute
    figure replaces the estimate's (:mod:`~ggufmtp.runtime.compute`)."""
    m, n_gpus = s.model, max(1, len(free))
    devs = _layer_gpus(m.n_layer_all, s.n_gpu_layers, free or [1])
    usage = [Usage() for _ in range(n_gpus)]
    weights = _weights(s, devs)
    for dev, b in weights.items():
        if dev is not None:
            usage[dev] = usage[dev].plus(weights=b)
    head = draft or m  # the model whose MTP layers the draft context holds
    types = (s.cache_type_k, s.cache_type_v)
    caches = [(c, m.layout.n_swa, devs[c.layer], types) for c in m.layout.target]
    if s.mtp:  # the draft context has its own KV types; an MTP-only sidecar's layers go with the output layer
        caches += [(c, head.layout.n_swa, devs[m.n_layer_all] if draft else devs[min(c.layer, m.n_layer_all)],
                    (s.draft_cache_type_k, s.draft_cache_type_v)) for c in head.layout.draft]
    for c, n_swa, dev, (tk, tv) in caches:
        if dev is not None:
            usage[dev] = usage[dev].plus(kv=s.streams * cells_per_stream(c.cells, s.n_ctx_seq, n_swa, s.ubatch)
                                         * (_row_bytes(tk, c.k) + _row_bytes(tv, c.v)))
    rollback = s.draft_n_max if s.mtp and m.arch in _RS_ROLLBACK else 0
    for st in m.layout.states:
        if (gpu := devs[st.layer]) is not None:
            usage[gpu] = usage[gpu].plus(recurrent=s.streams * (1 + rollback) * st.width * 4)
    out = devs[m.n_layer_all]
    main, figures = main_compute(s, draft or m, projected, n_gpus, out)
    for g, b in enumerate(main):
        usage[g] = usage[g].plus(compute=b)
    if out is not None:
        usage[out] = usage[out].plus(compute=figures.draft)
    if draft is not None and out is not None:
        usage[out] = usage[out].plus(weights=draft.weight_bytes)
    overhead = (GPU_PROCESS_OVERHEAD_MIB + (HOST_WEIGHTS_OVERHEAD_MIB if weights.get(None, 0) else 0)) * MIB
    usage = [u.plus(overhead=overhead) if u.total else u for u in usage]
    return ServerMemory(s.role, m.name, tuple(usage), weights.get(None, 0), figures, projected)


def fit_flags(s: ServerSpec) -> list[str]:
    """The flags llama-fit-params projects ``s``'s main context with: those ggufmtp gives every
    server (``build_command``: ``-c``, ``-np``, ``-ngl``, ``-ctk``/``-ctv``, ``--no-repack``; the
    arms' base ``--fit off`` and partial offload), then the sizing flags of the arm's own (a later
    flag wins in llama.cpp's parser, as on the server's command line)."""
    out = ["--fit", "off", "--no-repack", "-np", str(s.parallel), "-ub", str(s.ubatch)]
    out += ["-c", str(s.ctx_size)] if s.ctx_size is not None else []
    out += ["-ngl", str(s.gpu_layers)] if s.gpu_layers is not None else []
    out += [a for flag, t in (("-ctk", s.cache_type_k), ("-ctv", s.cache_type_v)) if t for a in (flag, t)]
    return out + s.offload.args() + sizing_flags(s.args)


def main_compute(s: ServerSpec, head: ModelFacts, projected: Projected | None, n_gpus: int,
                 out: int | None) -> tuple[list[int], ComputeFigures]:
    """(the main context's compute bytes per GPU, the server's compute figures): the estimates of
    both contexts (the MTP draft context's of ``head``'s MTP layers) on the output layer's GPU
    ``out``, and llama.cpp's projection where the estimate is low, as
    :func:`~ggufmtp.runtime.compute.planned_compute` decides."""
    cells, slots = s.cells, max(1, s.parallel)
    ub = min(s.ubatch, cells)
    draft = compute_estimate(head, ub, cells, slots, draft=True) if s.mtp and out is not None else 0
    est = compute_estimate(s.model, ub, cells, slots * (1 + s.draft_n_max if s.mtp else 1)) if out is not None else 0
    return planned_compute(s.model.arch, est, draft, projected, n_gpus, out)


def projector(offload: Offload, llama_cpp_bin: str | os.PathLike | None) -> Callable[[ServerSpec], Projected]:
    """llama-fit-params' projection of a server's main context, at the user's own ``offload``: the
    plan's advice tries other offloads (``--n-cpu-moe N``) with it, each not asked again (moving
    experts to host memory changes the weights' placement, which ggufmtp computes, more than the
    graph)."""
    def project(s: ServerSpec) -> Projected:
        if s.model.path is None:
            return Projected(None, "no model file to project")
        return project_memory(s.model.path, fit_flags(dataclasses.replace(s, offload=offload)), llama_cpp_bin)
    return project


# ----------------------------------------------------------------------------- phases and the plan


def gpu_free(env: Mapping[str, str] | None = None) -> tuple[tuple[int, ...] | None, str]:
    """(free bytes per GPU, where that came from): ``$GGUFMTP_GPU_FREE_MIB`` (comma-separated MiB
    per GPU; for tests and for planning another machine), else ``nvidia-smi``'s GPUs that
    ``CUDA_VISIBLE_DEVICES`` leaves the servers (:func:`~ggufmtp.runtime.hardware.nvidia_gpus`); (None, ...)
    without."""
    raw = (env if env is not None else os.environ).get(FREE_MEMORY_ENV, "").strip()
    if raw:
        try:
            mib = [float(x) for x in raw.split(",")]
        except ValueError:
            mib = []
        if not mib or any(not math.isfinite(x) or x < 0 for x in mib):
            raise VerifyError(f"${FREE_MEMORY_ENV}={raw!r}: expected MiB per GPU, comma-separated (e.g. 81920)")
        return tuple(int(x * MIB) for x in mib), f"${FREE_MEMORY_ENV}"
    gpus = nvidia_gpus(env)
    free = tuple(g.free_mib * MIB for g in gpus if g.free_mib is not None)
    return (free, "nvidia-smi") if free and len(free) == len(gpus) else (None, "no GPU found")


@dataclass(frozen=True)
class PlanInputs:
    """What a verification will start: the variant (and an MTP-only sidecar it drafts with), the
    reference, whether a default vanilla arm runs, and the settings every arm shares."""

    variant: ModelFacts
    reference: ModelFacts | None = None
    sidecar: ModelFacts | None = None
    default_vanilla: bool = False
    gpu_layers: int | str | None = None
    offload: Offload = field(default_factory=Offload)
    ctx_size: int | None = 4096
    slots: int = 1  # --parallel N > 1: the slot study's largest servers
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    draft_n_max: int = 4  # the largest window measured
    args: ArmFlags = field(default_factory=lambda: ArmFlags())
    # llama.cpp's projection of a server's main context (plan_for_verify: llama-fit-params); None: estimates only
    projector: Callable[[ServerSpec], Projected] | None = None


@dataclass(frozen=True)
class ArmFlags:
    """The user's llama-server flags by the arms that get them (``extra_args`` of every arm, then
    ``--server-arg`` and the one-arm flags; the default vanilla arm gets ``base`` only)."""

    base: tuple[str, ...] = ()
    vanilla: tuple[str, ...] = ()
    mtp: tuple[str, ...] = ()

    def of(self, role: Role) -> tuple[str, ...]:
        extra = {Role.VANILLA: self.vanilla, Role.MTP: self.mtp, Role.REFERENCE: self.mtp}.get(role, ())
        return self.base + extra


def _phases(i: PlanInputs, free: Sequence[int]) -> tuple[PhaseMemory, ...]:
    """The verification's phases: "reference" (the reference's MTP server alone), "main" (vanilla,
    MTP, default vanilla) and, with ``--parallel N``, "slots" (vanilla and MTP at N slots)."""
    def spec(role: Role, model: ModelFacts, mtp: bool, slots: int = 1) -> ServerSpec:
        args = i.args.of(role)
        return ServerSpec(role, model, mtp, i.gpu_layers, i.offload, i.ctx_size and i.ctx_size * slots, slots,
                          i.cache_type_k, i.cache_type_v, i.draft_n_max if mtp else 0, ubatch_of(args), args=args)

    groups: list[tuple[str, list[tuple[ServerSpec, ModelFacts | None]]]] = []
    if i.reference is not None:  # the artifact's trunk drafting with the reference's head (measure.verify.reference)
        groups.append(("reference", [(spec(Role.REFERENCE, i.variant, True), head_of(i.reference))]))
    main = [(spec(Role.VANILLA, i.variant, False), None), (spec(Role.MTP, i.variant, True), i.sidecar)]
    if i.default_vanilla:
        main.append((spec(Role.DEFAULT_VANILLA, i.variant, False), None))
    groups.append(("main", main))
    if i.slots > 1:
        groups.append(("slots", [(spec(Role.VANILLA, i.variant, False, i.slots), None),
                                 (spec(Role.MTP, i.variant, True, i.slots), i.sidecar)]))
    out = []
    for name, servers in groups:
        left, mems = list(free), []
        for s, draft in servers:  # each server's layers split by what is free when it starts
            asked = i.projector(s) if i.projector and s.model.arch in COMPUTE_UNCALIBRATED else None  # else not used
            mem = server_memory(s, [max(f, 0) for f in left], draft, asked)
            left = [f - (mem.gpus[g].total if g < len(mem.gpus) else 0) for g, f in enumerate(left)]
            mems.append(mem)
        out.append(PhaseMemory(name, tuple(mems), None))
    return tuple(out)


def plan_memory(i: PlanInputs, free: Sequence[int] | None = None, free_source: str = "given") -> MemoryPlan:
    """The memory plan of the verification ``i`` against ``free`` bytes per GPU (None: informational,
    laid out as on one GPU), with the advice of :func:`_advice` when a phase does not fit."""
    phases = tuple(dataclasses.replace(p, free=tuple(free) if free else None) for p in _phases(i, free or [1]))
    plan = MemoryPlan(phases, tuple(free) if free else None, free_source)
    if plan.fits is False:
        plan = dataclasses.replace(plan, advice=tuple(_advice(i, free or [])))
    return plan


def _fits(i: PlanInputs, free: Sequence[int]) -> bool:
    return all(p.need[g] <= free[g] for p in _phases(i, free) for g in range(min(len(p.need), len(free))))


def _advice(i: PlanInputs, free: Sequence[int]) -> list[str]:
    """What would fit, each alone: fewer MoE layers' experts on the GPU (the smallest
    ``--n-cpu-moe``), no default vanilla arm, a Q8_0 reference."""
    out: list[str] = []
    trunk = i.variant.n_layer_all - i.variant.n_nextn
    if any(re.search(r"_(ch|)exps", t) for t in i.variant.tensors):
        if i.offload.override_tensor or i.offload.cpu_moe:
            pass  # the user's own placement: not second-guessed
        else:
            n = next((n for n in range(i.offload.n_cpu_moe or 0, i.variant.n_layer_all + 1)
                      if _fits(dataclasses.replace(i, offload=Offload(n_cpu_moe=n)), free)), None)
            if n is not None:
                out.append(f"--n-cpu-moe {n} (the experts of layers 0-{n - 1} in host memory)"
                           if n <= trunk else "--cpu-moe (every expert in host memory)")
    if i.default_vanilla and _fits(dataclasses.replace(i, default_vanilla=False), free):
        out.append("no default-vanilla arm (it runs only with --server-arg, --vanilla-server-arg or --tuned-from)")
    if i.reference is not None:
        q8 = _as_q8_0(i.reference)
        if q8.weight_bytes < i.reference.weight_bytes and _fits(dataclasses.replace(i, reference=q8), free):
            out.append("a Q8_0 reference (--reference a Q8_0 variant of the source)")
        elif _fits(dataclasses.replace(i, reference=None), free):
            out.append("--no-reference (the head judged by the recipe's absolute minimum acceptance)")
    return out


def head_of(m: ModelFacts) -> ModelFacts:
    """``m``'s MTP head as an MTP-only sidecar (verify's reference arm): MTP blocks, token_embd, output."""
    trunk = m.n_layer_all - m.n_nextn
    kept = {k: v for k, v in m.tensors.items() if (b := _BLOCK.match(k)) is None or int(b.group(1)) >= trunk}
    return dataclasses.replace(m, name=f"{m.name}'s head", tensors=kept)


def _as_q8_0(m: ModelFacts) -> ModelFacts:
    """``m`` with its 16- and 32-bit matrices at Q8_0 (34 bytes per 32 values); norms stay F32."""
    def q8(name: str, nbytes: int) -> int:
        n = m.elements.get(name, 0)
        return n // 32 * 34 if n and n >= 1024 and nbytes >= 2 * n else nbytes
    return dataclasses.replace(m, name=f"{m.name} as Q8_0", tensors={k: q8(k, b) for k, b in m.tensors.items()})


def plan_for_verify(model: str | os.PathLike, options: Any, *, tensor_bytes: Mapping[str, int] | None = None,
                    free: tuple[tuple[int, ...] | None, str] | None = None) -> MemoryPlan:
    """The memory plan of ``verify(model, options)`` (a :class:`~ggufmtp.measure.core.options.VerifyOptions`);
    ``tensor_bytes``: the model's planned bytes per tensor (before quantizing it); ``free``: (bytes
    per GPU, source), default :func:`gpu_free`."""
    o = options
    srv = o.server
    free_bytes, source = free if free is not None else gpu_free()
    arms = o.arm_args()
    inputs = PlanInputs(
        variant=ModelFacts.read(model, tensor_bytes),
        reference=ModelFacts.read(o.reference) if o.reference is not None else None,
        sidecar=ModelFacts.read(o.sidecar) if o.sidecar is not None else None,
        default_vanilla=o.arm_args().differs_from_default, gpu_layers=srv.gpu_layers, offload=srv.offload,
        ctx_size=o.ctx_size, slots=o.parallel or 1, cache_type_k=o.cache_type_k, cache_type_v=o.cache_type_v,
        draft_n_max=max(o.windows),
        args=ArmFlags(tuple(srv.extra_args), arms.both + arms.vanilla, arms.both + arms.mtp),
        projector=projector(srv.offload, srv.llama_cpp_bin))
    return plan_memory(inputs, free_bytes, source)

