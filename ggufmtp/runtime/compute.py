"""The compute buffers of a server in the memory plan (:mod:`ggufmtp.runtime.memory`), and where
each figure comes from (:class:`Source`).

- **The main context's**: llama.cpp's own projection (:mod:`ggufmtp.runtime.fit_params`,
  ``llama-fit-params --fit-print on`` with the server's sizing flags), per device. Its figures are
  MiB floored, so the buffer lies in ``[n, n + 1)`` MiB: the plan takes ``n + 1`` MiB on every
  device that holds any of the server, an upper bound by less than 1 MiB a device. Two ways the
  server's own buffer can differ, as llama-fit-params cannot configure speculative decoding:
  it reserves the graph with every token of the physical batch an output (llama-server: slots x
  (1 + draft window) outputs), so its figure can be higher, by at most ``(ubatch - outputs) x
  n_vocab x 4`` bytes where the logits are the graph's peak; and it keeps no recurrent rollback
  states, which the MTP server's main context of a rollback architecture adds on ``--parallel``
  > 1 (tiny-qwen35moe, ``-np 2 -ub 256``: 5.78 MiB against 4.52 projected; equal at ``-np 1``).
- **The MTP draft context's**, and every main context llama-fit-params could not project (not
  built, failed): :func:`compute_estimate`, ggufmtp's formula (low for MLA, DSA and DeepSeek-V4
  graphs: :data:`COMPUTE_UNCALIBRATED`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from .fit_params import Projection
from .kv_layout import KVLayout

__all__ = ["Source", "ComputeFigures", "COMPUTE_ROWS", "COMPUTE_ROWS_DRAFT", "COMPUTE_TOLERANCE",
           "COMPUTE_UNCALIBRATED", "compute_estimate", "projected_compute"]

MIB = 1024 * 1024


class Source(enum.StrEnum):
    """Where a figure of the plan comes from."""

    LLAMA_CPP = "llama.cpp"  # llama-fit-params' projection
    ESTIMATE = "estimate"  # ggufmtp's own formula


@dataclass(frozen=True)
class ComputeFigures:
    """One server's compute buffers in bytes, over all its devices: the main context's (from
    ``source``) and the MTP draft context's (always the estimate); ``note``: why the main one is an
    estimate, when it is."""

    main: int
    draft: int
    source: Source
    note: str = ""

    def to_dict(self) -> dict[str, int | str]:
        return {"main_bytes": self.main, "source": str(self.source), "draft_bytes": self.draft,
                "draft_source": str(Source.ESTIMATE), "note": self.note}


#: Calibration of :func:`compute_estimate`: F32 activation rows of ``n_embd`` per token of the
#: physical batch, of a whole model's graph and of the MTP draft context's one-layer graph. Fitted
#: to the pinned llama-server's ``compute buffer size`` on CPU (flash attention ``auto``, i.e. on;
#: ``-c 4096/8192``, ``-ub 256/512``): tiny-qwen35moe 9.03 MiB (draft context 7.02), tiny-qwen35
#: 8.53 (7.02), tiny-glm4moe 8.01 (6.01); the estimates are within 8 % of each.
COMPUTE_ROWS = 9
COMPUTE_ROWS_DRAFT = 5
#: relative error of :func:`compute_estimate` against the server's report that the tests allow
COMPUTE_TOLERANCE = 0.15
#: Graphs the calibration does not cover, with the pinned llama-server's CPU report over the
#: estimate on the tiny models (main context, draft context; -c 4096, -ub 512): MLA (deepseek2,
#: bailingmoe3) 1.4-1.5x and 1.7x, DeepSeek-V4 1.7x, DSA (its indexer's score matrix: deepseek32,
#: glm-dsa) 5.6-7.5x and 1.7x; GLM5-Next (MLA and an indexer) is not measured. The main context's
#: buffer comes from llama.cpp's projection where it runs; the draft context's and a fallback's
#: under-count these graphs by that much.
COMPUTE_UNCALIBRATED = frozenset({"deepseek2", "bailingmoe3", "deepseek4", "deepseek32", "glm-dsa", "glm5-next"})


class GraphShape(Protocol):
    """What :func:`compute_estimate` reads of a model (:class:`~ggufmtp.runtime.memory.ModelFacts`)."""

    @property
    def n_vocab(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def layout(self) -> KVLayout: ...


def compute_estimate(m: GraphShape, ubatch: int, cells: int, outputs: int, draft: bool = False) -> int:
    """Bytes of one context's compute buffer: the worst-case graph llama.cpp reserves for
    ``ubatch`` tokens against ``cells`` KV cells with ``outputs`` logits rows (the server's
    ``n_outputs_max``: slots x (1 + draft window) on the MTP server, slots elsewhere). Three terms,
    calibrated as :data:`COMPUTE_ROWS` says: the F16 attention mask (``ubatch x cells x 2``; with
    flash attention, llama-server's default, there is no score matrix), the logits (``outputs x
    n_vocab x 4``) and ``COMPUTE_ROWS`` F32 rows of ``n_embd`` per token (``COMPUTE_ROWS_DRAFT``
    for the draft context's one-layer graph, ``draft=True``). Calibrated on CPU only: a CUDA
    build's buffer also holds its kernels' scratch, which the plan's per-server overhead allows for."""
    mask = 2 * ubatch * cells if (m.layout.target or m.layout.draft) else 0
    rows = COMPUTE_ROWS_DRAFT if draft else COMPUTE_ROWS
    return mask + 4 * outputs * m.n_vocab + 4 * ubatch * rows * m.n_embd


def projected_compute(p: Projection, n_gpus: int, out: int | None) -> list[int]:
    """The main context's compute bytes per GPU of the plan from llama.cpp's projection ``p``, each
    device's floored MiB plus 1 (see the module docstring). A projection of as many GPUs as the
    plan has is taken device by device; one of another machine (a CPU build: only ``Host``; or
    planning another GPU count with ``$GGUFMTP_GPU_FREE_MIB``) puts its whole compute figure on
    ``out``, the output layer's GPU (None: host memory, nothing on a GPU), as the estimate does
    (the CPU graph's buffer standing in for the GPU's)."""
    if p.gpus and len(p.gpus) == n_gpus:  # a device holding nothing of the server (-ts 1,0) gets nothing
        return [(g.compute_mib + 1) * MIB if g.model_mib or g.context_mib or g.compute_mib else 0 for g in p.gpus]
    total = sum(g.compute_mib for g in p.gpus) if p.gpus else p.host.compute_mib
    return [(total + 1) * MIB if g == out else 0 for g in range(n_gpus)]

