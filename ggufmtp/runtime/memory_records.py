"""The records of the memory plan (:mod:`ggufmtp.runtime.memory`): the servers a verification
starts (:class:`Role`), one server's bytes per GPU by kind (:class:`Usage`, :class:`ServerMemory`),
the servers resident at once (:class:`PhaseMemory`) and the plan against the GPUs' free memory
(:class:`MemoryPlan`: its table, its JSON form, its refusal)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from ..errors import MemoryPlanError
from ..fmt import human_bytes
from .compute import ComputeFigures, Source
from .fit_params import Projected

__all__ = ["MIB", "GPU_PROCESS_OVERHEAD_MIB", "Role", "Usage", "ServerMemory", "PhaseMemory", "MemoryPlan"]

MIB = 1024 * 1024
#: Memory a llama-server process holds on a GPU beyond the buffers llama.cpp reports (the CUDA
#: context, cuBLAS workspace, CUDA graphs). Not measurable on CPU; calibrated on one H200 on
#: 2026-11-29 (benchmarks/README.md, "The publisher's GPU"): against nvidia-smi, the formulas here
#: with 512 MiB a server came out 0.5 GiB short for the 35B BF16 reference alone and 0.7 GiB short
#: for vanilla + MTP; 1 GiB a server covers both.
GPU_PROCESS_OVERHEAD_MIB = 1024


class Role(enum.StrEnum):
    """The servers a verification starts (the arms of :mod:`ggufmtp.measure.core.arms`)."""

    VANILLA = "vanilla"
    MTP = "mtp"
    DEFAULT_VANILLA = "vanilla-default"  # verify's third arm: vanilla with llama-server's defaults
    REFERENCE = "reference"  # verify --reference: the reference head on the artifact's trunk


@dataclass(frozen=True)
class Usage:
    """One server's bytes on one GPU, by kind."""

    weights: int = 0
    kv: int = 0
    recurrent: int = 0
    compute: int = 0
    overhead: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.overhead

    def plus(self, **kw: int) -> Usage:
        return dataclasses.replace(self, **{k: getattr(self, k) + v for k, v in kw.items()})

    def to_dict(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "total": self.total}


@dataclass(frozen=True)
class ServerMemory:
    """What one server holds: per GPU (:class:`Usage`), and the weights left in host memory."""

    role: Role
    model: str
    gpus: tuple[Usage, ...]
    host_weights: int
    compute: ComputeFigures = ComputeFigures(0, 0, Source.ESTIMATE)
    projected: Projected | None = None  # llama.cpp's projection of the main context, as asked

    @property
    def gpu_total(self) -> int:
        return sum(u.total for u in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        p = self.projected.projection if self.projected is not None else None
        return {"role": str(self.role), "model": self.model, "gpus": [u.to_dict() for u in self.gpus],
                "gpu_bytes": self.gpu_total, "host_weight_bytes": self.host_weights, "compute": self.compute.to_dict(),
                "llama_cpp_projection": p.to_dict() if p is not None else None}


@dataclass(frozen=True)
class PhaseMemory:
    """The servers resident at the same time, and what they need per GPU together."""

    name: str
    servers: tuple[ServerMemory, ...]
    free: tuple[int, ...] | None

    @property
    def need(self) -> tuple[int, ...]:
        n = max((len(s.gpus) for s in self.servers), default=1)
        return tuple(sum(s.gpus[i].total for s in self.servers if i < len(s.gpus)) for i in range(n))

    @property
    def fits(self) -> bool | None:
        """Whether every GPU has room (None: no free memory known)."""
        return None if self.free is None else all(n <= f for n, f in zip(self.need, self.free, strict=False))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "servers": [s.to_dict() for s in self.servers], "need_bytes": list(self.need),
                "free_bytes": list(self.free) if self.free is not None else None, "fits": self.fits}


@dataclass(frozen=True)
class MemoryPlan:
    """Every phase of a verification against the GPUs' free memory (``free``: bytes per GPU, None
    without a GPU: the plan is then informational), and what would fit when a phase does not."""

    phases: tuple[PhaseMemory, ...]
    free: tuple[int, ...] | None
    free_source: str
    advice: tuple[str, ...] = ()

    @property
    def fits(self) -> bool | None:
        return None if self.free is None else all(p.fits for p in self.phases)

    def to_dict(self) -> dict[str, Any]:
        return {"phases": [p.to_dict() for p in self.phases], "free_bytes": list(self.free) if self.free else None,
                "free_source": self.free_source, "fits": self.fits, "advice": list(self.advice),
                "gpu_process_overhead_bytes": GPU_PROCESS_OVERHEAD_MIB * MIB}

    def format(self) -> str:
        """The plan as a table: one row per server, one per phase total (binary units)."""
        rows: list[tuple[str, ...]] = [("phase", "server", "model", "weights", "KV", "recurrent", "compute",
                                        "GPU total", "host weights")]
        for p in self.phases:
            for s in p.servers:
                u = [sum(getattr(g, k) for g in s.gpus) for k in ("weights", "kv", "recurrent", "compute")]
                rows.append((p.name, str(s.role), s.model, *map(human_bytes, u), human_bytes(s.gpu_total),
                             human_bytes(s.host_weights)))
            verdict = {True: "fits", False: "DOES NOT FIT", None: "no GPU: informational"}[p.fits]
            free = " + ".join(human_bytes(f) for f in p.free) if p.free else "n/a"
            rows.append((p.name, "= phase", "", "", "", "", "", " + ".join(human_bytes(n) for n in p.need),
                         f"free {free}: {verdict}"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["GPU memory plan (free memory: " + self.free_source + ")"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines += [f"  would fit: {a}" for a in self.advice]
        return "\n".join(lines + self._sources())

    def _sources(self) -> list[str]:
        """Where the compute column comes from, once per distinct answer (the draft context's only
        on a server that has one)."""
        def said(src: Source) -> str:
            return "llama.cpp's projection (llama-fit-params, MiB + 1)" if src is Source.LLAMA_CPP else "estimated"
        c = [s.compute for p in self.phases for s in p.servers]
        seen = dict.fromkeys((f.source, f.draft_source if f.draft else None, f.note) for f in c)
        return [f"  compute: main context {said(src)}" + (f", MTP draft context {said(d)}" if d else "")
                + (f" ({note})" if note else "") for src, d, note in seen]

    def refuse_unless_fits(self, what: str) -> None:
        """MemoryPlanError naming the phase that does not fit and what would, before ``what``."""
        bad = [p for p in self.phases if p.fits is False]
        if not bad:
            return
        p = bad[0]
        need = " + ".join(human_bytes(n) for n in p.need)
        free = " + ".join(human_bytes(f) for f in p.free or ())
        hint = "; ".join(self.advice) if self.advice else "nothing ggufmtp can configure: use a GPU with more memory"
        raise MemoryPlanError(f"GPU memory: the {p.name} phase ({', '.join(str(s.role) for s in p.servers)}) needs "
                              f"{need} but {free} is free ({self.free_source}); refused before {what}. Would fit: "
                              f"{hint}")
