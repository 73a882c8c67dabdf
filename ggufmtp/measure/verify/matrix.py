"""``ggufmtp verify --matrix "kv=f16,q8_0,q4_0 draft-kv=f16,q8_0 depth=0,8192"``: verify once per
cell of KV-cache type x the draft's KV-cache type x context depth, and one table of what MTP buys in each.

Every cell is a full :func:`ggufmtp.measure.verify.run.verify` run with the same suite, seeds, draft
window and server settings; only the cell's KV-cache type (``--cache-type-k`` and
``--cache-type-v``, both arms), the MTP draft context's own KV-cache type (``--spec-draft-type-k``
and ``--spec-draft-type-v``, ``-ctkd``/``-ctvd``: the MTP arm only, the vanilla arm has no draft)
and context depth (``context_fill``: the neutral prefix of
:mod:`ggufmtp.measure.verify.kvdepth`) change. A cell's servers are started for it and stopped after it,
so cells never share a cache. Every cell's settings are checked (the KV types against
llama-server's ``--help``, the deepest depth against the context size) before the first server
starts. The matrix passes when every cell's verdict does.

Spec grammar: space- or ``;``-separated ``key=v1,v2,...`` with the keys ``kv`` (KV-cache types, for
K and V alike), ``draft-kv`` (the draft's, K and V alike) and ``depth`` (tokens; ``8k`` = 8192). A
missing key is one cell of the default (llama-server's KV types; depth 0). Cells run in the order
kv-major, then draft-kv, depth-minor.

Why the draft's own axis: at 0c1e570 the MTP draft context takes its KV-cache types from
``params.speculative.draft.cache_type_k/v`` (``common_base_params_to_speculative`` in
``common/speculative.cpp``), not from ``--cache-type-k/v``; both default to f16. So ``kv=q4_0``
quantizes the target's cache only, and the head's cache stays f16 unless ``draft-kv`` says otherwise.

The result (:class:`MatrixResult`) is typed; :meth:`MatrixResult.to_receipt` is the receipt's
``verification.matrix`` section (kept by later ``verify --receipt`` runs).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import VerifyError
from ...fmt import ci_text, num, pct, times
from ...provenance.verdict import Verdict
from ..core.options import VerifyOptions
from ..core.records import ModelInfo
from ..core.suite import as_suite
from .kvdepth import check_kv_depth
from .report import VerifyResult
from .run import verify

__all__ = ["MatrixSpec", "MatrixCell", "MatrixResult", "parse_matrix", "verify_matrix", "format_matrix",
           "MATRIX_KIND"]

MATRIX_KIND = "ggufmtp verify --matrix"
_CELL_ARGS = ("cache_type_k", "cache_type_v", "context_fill")
_ARG_LISTS = ("extra_args", "server_args", "mtp_server_args", "vanilla_server_args")  # verify's server arguments


# ----------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class MatrixSpec:
    """The cells to run: every KV-cache type (None: llama-server's default) at every depth."""

    kv_types: tuple[str | None, ...]
    depths: tuple[int, ...]
    draft_kv_types: tuple[str | None, ...] = (None,)

    @property
    def cells(self) -> list[tuple[str | None, str | None, int]]:
        """(KV type, draft KV type, depth) of every cell, in run order."""
        return [(kv, dkv, d) for kv in self.kv_types for dkv in self.draft_kv_types for d in self.depths]


def _depth(text: str) -> int:
    m = re.fullmatch(r"(\d+)([kK]?)", text.strip())
    if not m:
        raise VerifyError(f"--matrix depth {text!r}: not a whole number of tokens (e.g. 8192 or 8k)")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def _values(key: str, text: str) -> list[str]:
    vals = [v.strip() for v in text.split(",")]
    if not all(vals):
        raise VerifyError(f"--matrix {key}={text}: an empty value")
    dup = sorted({v for v in vals if vals.count(v) > 1})
    if dup:
        raise VerifyError(f"--matrix {key}={text}: {', '.join(dup)} given twice")
    return vals


def parse_matrix(spec: str) -> MatrixSpec:
    """The cells of a ``--matrix`` spec (VerifyError naming the bad part). The KV types are only
    lower-cased here; :func:`verify_matrix` checks them against llama-server before running."""
    found: dict[str, list[str]] = {}
    for part in re.split(r"[\s;]+", spec.strip()):
        if not part:
            continue
        key, eq, val = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in ("kv", "draft-kv", "depth"):
            raise VerifyError(f"--matrix {part!r}: expected kv=TYPE,..., draft-kv=TYPE,... or depth=N,... "
                              f"(e.g. \"kv=f16,q8_0,q4_0 depth=0,8192\")")
        if key in found:
            raise VerifyError(f"--matrix: {key}= given twice")
        found[key] = _values(key, val)
    if not found:
        raise VerifyError("--matrix: empty; e.g. \"kv=f16,q8_0,q4_0 depth=0,8192\"")
    kv = tuple(v.lower() for v in found.get("kv", [])) or (None,)
    depths = [_depth(d) for d in found.get("depth", ["0"])]
    if len(set(depths)) != len(depths):
        raise VerifyError(f"--matrix depth={','.join(found['depth'])}: a depth given twice")
    draft_kv = tuple(v.lower() for v in found.get("draft-kv", [])) or (None,)
    return MatrixSpec(kv, tuple(depths), draft_kv)


# ----------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class MatrixCell:
    """One cell: its KV type and depth, and its verification's headline numbers (chat arm, shipped
    window, first mode; ``identical_output_fraction`` and ``mismatch_count`` over every comparison
    of the cell's run). ``speedup`` is against the equally configured vanilla arm."""

    kv_type: str | None
    depth: int
    acceptance: float | None
    acceptance_ci95: list[float | None]
    speedup: float | None
    speedup_ci95: list[float | None]
    mean_acceptance_length: float | None
    identical_output_fraction: float | None
    verdict: Verdict
    mismatch_count: int = 0
    mtp_tokens_per_second: float | None = None
    vanilla_tokens_per_second: float | None = None
    context_tokens: int = 0  # the prefix's tokens by /tokenize (0 at depth 0)
    mean_prompt_tokens: float | None = None  # the requests' mean prompt_n, as the server counted it
    vanilla_server_args: list[str] = field(default_factory=list)
    mtp_server_args: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    speedup_vs_default_vanilla: float | None = None
    speedup_vs_default_vanilla_ci95: list[float | None] | None = None  # None: no default vanilla arm ran
    draft_kv_type: str | None = None  # the draft context's KV type (None: llama-server's default, f16)

    @classmethod
    def of(cls, kv_type: str | None, depth: int, res: VerifyResult, draft_kv_type: str | None = None) -> MatrixCell:
        c = res.main
        fill = res.settings.context_fill
        prompt_ns = [r.prompt_n for r in res.records if r.prompt_n is not None]
        return cls(
            kv_type=kv_type, depth=depth, acceptance=c.acceptance, acceptance_ci95=list(c.acceptance_ci95),
            speedup=c.speedup, speedup_ci95=list(c.speedup_ci95), mean_acceptance_length=c.mean_acceptance_length,
            identical_output_fraction=_fraction(res), verdict=res.verdict,
            mismatch_count=sum(x.mismatch_count for x in res.comparisons),
            mtp_tokens_per_second=c.mtp_tokens_per_second, vanilla_tokens_per_second=c.vanilla_tokens_per_second,
            context_tokens=fill.tokens if fill is not None else 0,
            mean_prompt_tokens=sum(prompt_ns) / len(prompt_ns) if prompt_ns else None,
            vanilla_server_args=list(res.server.flags.vanilla),
            mtp_server_args=list(res.server.flags.mtp.get(str(res.draft_n_max), [])), reasons=list(res.reasons),
            speedup_vs_default_vanilla=c.speedup_vs_default_vanilla if c.has_default_vanilla else None,
            speedup_vs_default_vanilla_ci95=list(c.speedup_vs_default_vanilla_ci95) if c.has_default_vanilla else None,
            draft_kv_type=draft_kv_type)

    @property
    def label(self) -> str:
        draft = f" draft-kv={self.draft_kv_type}" if self.draft_kv_type else ""
        return f"kv={self.kv_type or 'default'}{draft} depth={self.depth}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kv_type": self.kv_type, "draft_kv_type": self.draft_kv_type, "depth": self.depth, "acceptance": self.acceptance,
            "acceptance_ci95": list(self.acceptance_ci95), "speedup": self.speedup,
            "speedup_ci95": list(self.speedup_ci95), "mean_acceptance_length": self.mean_acceptance_length,
            "identical_output_fraction": self.identical_output_fraction, "mismatch_count": self.mismatch_count,
            "verdict": self.verdict.value, "reasons": list(self.reasons),
            "mtp_tokens_per_second": self.mtp_tokens_per_second,
            "vanilla_tokens_per_second": self.vanilla_tokens_per_second,
            "context_tokens": self.context_tokens, "mean_prompt_tokens": self.mean_prompt_tokens,
            "vanilla_server_args": list(self.vanilla_server_args), "mtp_server_args": list(self.mtp_server_args)}
        if self.speedup_vs_default_vanilla_ci95 is not None:  # only when a default vanilla arm ran
            d["speedup_vs_default_vanilla"] = self.speedup_vs_default_vanilla
            d["speedup_vs_default_vanilla_ci95"] = list(self.speedup_vs_default_vanilla_ci95)
        return d


def _fraction(res: VerifyResult) -> float | None:
    """Identical output over every pair of every comparison of a run."""
    pairs = sum(c.n_pairs for c in res.comparisons)
    return sum(c.identical for c in res.comparisons) / pairs if pairs else None


@dataclass
class MatrixResult:
    """Every cell of a matrix run, in run order, with each cell's full :class:`VerifyResult`
    (``results``, same order; not in the JSON summary)."""

    model: ModelInfo
    spec: MatrixSpec
    cells: list[MatrixCell]
    results: list[VerifyResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def verdict(self) -> Verdict:
        return Verdict.PASS if all(c.verdict == Verdict.PASS for c in self.cells) else Verdict.FAIL

    @property
    def ok(self) -> bool:
        return self.verdict == Verdict.PASS

    def cell(self, kv_type: str | None, depth: int, draft_kv_type: str | None = None) -> MatrixCell | None:
        return next((c for c in self.cells if (c.kv_type, c.depth, c.draft_kv_type) == (kv_type, depth, draft_kv_type)),
                    None)

    def _settings(self) -> dict[str, Any]:
        if not self.results:
            return {}
        s, r0 = self.results[0].settings, self.results[0]
        return {"draft_n_max": r0.draft_n_max, "seeds": list(s.seeds), "max_tokens": s.max_tokens,
                "ctx_size": s.ctx_size, "gpu_layers": s.gpu_layers, "threads": s.threads, "limit": s.limit,
                "modes": list(s.modes), "cache_prompt": s.cache_prompt}

    def to_receipt(self) -> dict[str, Any]:
        """The receipt's ``verification.matrix`` section."""
        r0 = self.results[0] if self.results else None
        return {"kind": MATRIX_KIND, "verdict": self.verdict.value,
                "model": {"path": self.model.path, "size_bytes": self.model.size_bytes, "sha256": self.model.sha256},
                "suite": ({"name": r0.suite.name, "sha256": r0.suite.sha256, "n_prompts": r0.suite.n_prompts}
                          if r0 else None),
                "hardware": r0.hardware.to_dict() if r0 else None, "settings": self._settings(),
                "kv_types": list(self.spec.kv_types), "draft_kv_types": list(self.spec.draft_kv_types),
                "depths": list(self.spec.depths),
                "cells": [c.to_dict() for c in self.cells]}

    def to_dict(self, full: bool = False) -> dict[str, Any]:
        """The JSON form: the receipt section plus the run time; ``full`` adds every cell's whole
        verification (with its requests)."""
        d = {**self.to_receipt(), "seconds": round(self.seconds, 2)}
        if full:
            d["verifications"] = [r.to_dict(requests=True) for r in self.results]
        return d

    def table(self) -> str:
        return format_matrix(self)


# ----------------------------------------------------------------------------- the run


def _check_cells(model: str | os.PathLike, spec: MatrixSpec, o: VerifyOptions) -> None:
    """Every cell's KV type and the deepest depth checked before any server starts."""
    bad = [a for a in _CELL_ARGS if getattr(o, a)]
    if bad:
        raise VerifyError(f"{', '.join(bad)}: set by the matrix's cells; give them in the spec (kv=..., depth=...)")
    st = as_suite(o.suite).limit(o.limit)
    args = [a for name in _ARG_LISTS for a in getattr(o.server, name)]
    deepest = max(spec.depths)
    llama_cpp_bin = o.server.llama_cpp_bin
    for kv in spec.kv_types:
        check_kv_depth(kv, kv, deepest, model, o.ctx_size, o.parallel, o.max_tokens, st, llama_cpp_bin, args)
    for kv in spec.draft_kv_types:  # the draft's types are checked as the target's are, and named as the draft's
        try:
            check_kv_depth(kv, kv, 0, model, o.ctx_size, o.parallel, o.max_tokens, st, llama_cpp_bin, args)
        except VerifyError as e:
            raise VerifyError(f"--matrix draft-kv={kv}: {e}".replace("--cache-type-k ", "", 1)) from None


def _draft_kv_args(draft_kv: str | None) -> list[str]:
    return [] if draft_kv is None else ["--spec-draft-type-k", draft_kv, "--spec-draft-type-v", draft_kv]


def _cell_options(o: VerifyOptions, kv: str | None, draft_kv: str | None, depth: int) -> VerifyOptions:
    """The options of one cell: its KV types and depth, its draft KV type added to the MTP arm's flags."""
    server = dataclasses.replace(o.server, mtp_server_args=(*o.server.mtp_server_args, *_draft_kv_args(draft_kv)))
    return dataclasses.replace(o, cache_type_k=kv, cache_type_v=kv, context_fill=depth, server=server)


def verify_matrix(model: str | os.PathLike, kv_types: Sequence[str | None], depths: Sequence[int],
                  options: VerifyOptions | None = None, *, draft_kv_types: Sequence[str | None] = (None,),
                  on_cell: Callable[[MatrixCell], None] | None = None, progress: bool = True) -> MatrixResult:
    """:func:`~ggufmtp.measure.verify.run.verify` once per (KV type, draft KV type, depth), the same
    ``options`` for every cell (which set no ``cache_type_k``/``cache_type_v``/``context_fill``: the
    cells set them; a draft KV type is added to the MTP arm's flags).
    ``on_cell`` is called after each cell. Raises VerifyError before any server starts when a KV
    type or depth cannot run, and whatever a cell's verify raises."""
    o = options if options is not None else VerifyOptions()
    t0 = time.monotonic()
    norm = lambda types: tuple(None if k is None else str(k).strip().lower() for k in types)  # noqa: E731
    spec = MatrixSpec(norm(kv_types), tuple(int(d) for d in depths), norm(draft_kv_types))
    if not spec.kv_types or not spec.depths or not spec.draft_kv_types:
        raise VerifyError("a matrix needs at least one KV type and one depth")
    if len(set(spec.cells)) != len(spec.cells):
        raise VerifyError("a matrix cell given twice (a KV type or a depth repeated)")
    _check_cells(model, spec, o)
    cells, results = [], []
    for kv, draft_kv, depth in spec.cells:
        res = verify(Path(model), _cell_options(o, kv, draft_kv, depth), progress=progress)
        cell = MatrixCell.of(kv, depth, res, draft_kv)
        cells.append(cell)
        results.append(res)
        if on_cell is not None:
            on_cell(cell)
    return MatrixResult(results[0].model, spec, cells, results, time.monotonic() - t0)


# ----------------------------------------------------------------------------- the table


def format_matrix(m: MatrixResult) -> str:
    """The matrix as one text table (speedup against the equally configured vanilla arm)."""
    s = m._settings()
    r0 = m.results[0] if m.results else None
    head = (f"ggufmtp verify --matrix {Path(m.model.path).name}  (k={s.get('draft_n_max')}; "
            + (f"suite {r0.suite.name}, {r0.suite.n_prompts} prompts; " if r0 else "")
            + f"seeds {', '.join(map(str, s.get('seeds', [])))}; max_tokens {s.get('max_tokens')}; "
            f"ctx-size {s.get('ctx_size')})")
    lines = [head, "speedup: MTP over vanilla with the same KV cache, depth and server settings; "
             "decode tok/s at depth (prompt processing excluded)", "",
             f"{'kv':<8} {'draft kv':<8} {'depth':>6} {'acceptance (95% CI)':<26} {'accept len':>10} {'mtp tok/s':>10} "
             f"{'vanilla tok/s':>14}  {'speedup (95% CI)':<24} {'identical':>9}  verdict"]
    for c in m.cells:
        lines.append(f"{c.kv_type or 'default':<8} {c.draft_kv_type or 'default':<8} {c.depth:>6} "
                     f"{pct(c.acceptance, 2) + ' ' + ci_text(c.acceptance_ci95, scale=100, digits=2):<26} "
                     f"{num(c.mean_acceptance_length):>10} {num(c.mtp_tokens_per_second):>10} "
                     f"{num(c.vanilla_tokens_per_second):>14}  "
                     f"{times(c.speedup) + ' ' + ci_text(c.speedup_ci95):<24} "
                     f"{pct(c.identical_output_fraction):>9}  {c.verdict.value.upper()}")
    lines += ["", f"matrix verdict: {m.verdict.value.upper()} ({sum(c.verdict == Verdict.PASS for c in m.cells)}"
              f"/{len(m.cells)} cells pass)"]
    lines += [f"  FAIL {c.label}: {r}" for c in m.cells for r in c.reasons]
    return "\n".join(lines)
