"""Where a verification's weights lived (:class:`Placement`), which decides whether its speed is
judged: a speedup threshold is a claim about the model on a GPU. Off it, or with weights kept in host
memory by partial offload, the speed is reported, not judged (``--enforce-speedup`` judges it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..runtime.offload import Offload

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    """Where a verification's weights lived, which decides whether its speed is judged: on the GPU
    (``offloaded``) with none kept in host memory. ``host_weights``: the partial-offload flags
    that kept weights in host memory (``--n-cpu-moe 30``; empty for none). There the expert
    matmuls run on the CPU, where a verification batch of k+1 tokens reads up to k+1 times the
    experts one token reads, so MTP is expected to gain little or lose, as on a CPU run: the speed
    is reported, not judged (``--enforce-speedup`` judges it)."""

    offloaded: bool
    host_weights: str = ""

    @property
    def gpu_resident(self) -> bool:
        return self.offloaded and not self.host_weights

    @property
    def short(self) -> str:
        """Where the weights lived, in a table cell's words."""
        return "GPU" if self.gpu_resident else "weights in host memory" if self.offloaded else "no GPU offload"

    def why_unjudged(self) -> str:
        """Why the speed threshold does not apply here (for a GPU-resident run: nothing)."""
        if not self.offloaded:
            return "the model ran on CPU without GPU offload, where a small model is compute-bound and MTP is expected to be slower"
        if self.host_weights:
            return (f"weights were kept in host memory ({self.host_weights}), where their matmuls run on the CPU and a "
                    "verification batch of k+1 tokens reads up to k+1 times the experts one token reads, so MTP is "
                    "expected to gain little or lose")
        return ""

    @classmethod
    def of(cls, offloaded: bool, offload: Offload | None) -> Placement:
        host = " ".join(offload.args()) if offload is not None and offload.keeps_host_weights else ""
        return cls(bool(offloaded), host)

    @classmethod
    def of_record(cls, v: Mapping[str, Any]) -> Placement:
        """The placement a recorded verification states (``hardware.offloaded``, ``settings.offload``)."""
        hw, st = v.get("hardware"), v.get("settings")
        offloaded = bool(hw.get("offloaded")) if isinstance(hw, Mapping) else False
        return cls.of(offloaded, Offload.of_record(st.get("offload")) if isinstance(st, Mapping) else None)
