"""The compute buffers of a server in the memory plan (:mod:`ggufmtp.runtime.memory`), and where
each figure comes from (:class:`Source`): :func:`planned_compute` decides, per architecture.

- **Graphs the estimate is calibrated for** (every architecture but :data:`COMPUTE_UNCALIBRATED`:
  plain GQA and hybrid ones, qwen35moe, glm4moe, ...): both contexts' buffers are
  :func:`compute_estimate`'s, ggufmtp's formula (within :data:`COMPUTE_TOLERANCE` of the server's
  report on the tiny models; 42.8 GiB planned against 42.0 measured on an H200 at the 35B-A3B
  shape). llama.cpp's projection is not asked: it would over-state these by far (below).
- **Graphs it is known to be low for** (:data:`COMPUTE_UNCALIBRATED`: MLA, DSA, DeepSeek-V4,
  GLM5-Next): the larger of the estimate and llama.cpp's own projection of the main context
  (:mod:`ggufmtp.runtime.fit_params`, ``llama-fit-params --fit-print on`` with the server's sizing
  flags), per device, each device's floored MiB + 1 (the buffer lies in ``[n, n + 1)`` MiB). That
  projection is a safe upper bound, not an exact figure: llama-fit-params' context reserves the
  graph with every token of the physical batch an output (``graph_reserve`` with ``n_outputs_pp =
  min(n_tokens, n_outputs_max)``, and the tool leaves ``n_outputs_max`` at ``n_batch``), where
  llama-server reserves slots x (1 + draft window) outputs. It over-states by up to ``(ubatch -
  outputs) x n_vocab x 4`` bytes, one logits tensor: nothing on the tiny models (739 tokens:
  1.4 MiB), but on a 4-layer Qwen3.6-35B-A3B-shaped model (248,320 tokens, ``-c 4096 -np 1``) it
  projected 501 MiB where llama-server reported 76.02 MiB (65.02 in the MTP server's contexts):
  which is why the calibrated graphs keep the estimate. The MTP draft context's buffer, which the
  tool cannot configure (it takes no speculative flags), is the larger of its estimate (1.7x low on
  these graphs) and the same projection: the draft graph is one block of the model's kind with
  fewer outputs, and the tiny models' draft buffers (5.5-11.3 MiB) lie below their main
  projections (6-63 MiB). Where the tool is missing (a runtime built before ggufmtp used it) or
  fails, the estimate stands, with a note that it is low.

Each server's :class:`ComputeFigures` record which (``source``, ``draft_source``) and why (``note``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from .fit_params import Projected, Projection
from .kv_layout import KVLayout

__all__ = ["Source", "ComputeFigures", "COMPUTE_ROWS", "COMPUTE_ROWS_DRAFT", "COMPUTE_TOLERANCE",
           "COMPUTE_UNCALIBRATED", "compute_estimate", "projected_compute", "planned_compute"]

MIB = 1024 * 1024


class Source(enum.StrEnum):
    """Where a figure of the plan comes from."""

    LLAMA_CPP = "llama.cpp"  # llama-fit-params' projection
    ESTIMATE = "estimate"  # ggufmtp's own formula


@dataclass(frozen=True)
class ComputeFigures:
    """One server's compute buffers in bytes, over all its devices: the main context's (from
    ``source``) and the MTP draft context's (from ``draft_source``); ``note``: why those sources."""

    main: int
    draft: int
    source: Source
    draft_source: Source = Source.ESTIMATE
    note: str = ""

    def to_dict(self) -> dict[str, int | str]:
        return {"main_bytes": self.main, "source": str(self.source), "draft_bytes": self.draft,
                "draft_source": str(self.draft_source), "note": self.note}


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
#: glm-dsa) 5.6-7.5x and 1.7x; GLM5-Next (MLA and an indexer) 2.6x. :func:`planned_compute` takes
#: the larger of the estimate and llama.cpp's projection for these; a fallback to the estimate
#: alone under-counts them by that much.
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


def planned_compute(arch: str, main_est: int, draft_est: int, projected: Projected | None, n_gpus: int,
                    out: int | None) -> tuple[list[int], ComputeFigures]:
    """(the main context's compute bytes per GPU, the server's figures) under the policy of the
    module docstring: ``main_est`` and ``draft_est`` are :func:`compute_estimate`'s (on the output
    layer's GPU ``out``; 0 when nothing is there or no draft context runs), ``projected`` llama.cpp's
    answer for the main context (None: not asked, as for a calibrated ``arch``)."""
    est = [main_est if g == out else 0 for g in range(n_gpus)]
    if arch not in COMPUTE_UNCALIBRATED:
        return est, ComputeFigures(main_est, draft_est, Source.ESTIMATE, note=f"calibrated for {arch} graphs")
    low = f"the estimate is low for {arch} graphs"
    if projected is None or projected.projection is None:
        why = projected.note if projected is not None else "no projection asked"
        return est, ComputeFigures(main_est, draft_est, Source.ESTIMATE, note=f"{why}; {low}")
    proj = projected_compute(projected.projection, n_gpus, out)
    main = [max(e, p) for e, p in zip(est, proj, strict=True)]
    bound = max(proj, default=0) if draft_est else 0  # the draft context's, on the output layer's GPU
    figures = ComputeFigures(
        sum(main), max(draft_est, bound), Source.LLAMA_CPP if sum(proj) > main_est else Source.ESTIMATE,
        Source.LLAMA_CPP if bound > draft_est else Source.ESTIMATE,
        f"{low}: the larger of it and llama.cpp's projection (an upper bound: it reserves every token of the "
        "physical batch as an output)")
    return main, figures
