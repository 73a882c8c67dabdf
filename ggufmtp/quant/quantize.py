"""``ggufmtp quantize``: plan, quantize in-process with libllama, audit, then rename into place.

The output is written to a hidden temporary file beside ``OUT`` and renamed only after the
audit passes: Ctrl-C, a libllama failure or an audit mismatch leave no ``OUT`` behind.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import PlanError, QuantizeError
from ..gguf.model import GGUFModel, check_mtp
from ..runtime.libllama import QuantizeParams, llama_cpp_module, run_quantize
from .plan import Plan, make_plan
from .recipe import Recipe

_TENSOR_START = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)\s+-")


@dataclasses.dataclass
class AuditCheck:
    """One post-quantization check: what was checked, whether it held, and the evidence."""

    name: str
    ok: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class QuantizeResult:
    """What :func:`quantize` made: the artifact, its plan and the post-quantization audit."""

    output: Path
    plan: Plan
    checks: list[AuditCheck]
    seconds: float
    size_bytes: int
    started_at: str
    finished_at: str
    log_tail: list[str] = dataclasses.field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"output": str(self.output), "recipe": self.plan.recipe, "ftype": self.plan.ftype,
                "size_bytes": self.size_bytes, "bpw": round(self.plan.bpw, 4), "seconds": round(self.seconds, 3),
                "mtp": self.plan.mtp_summary().to_dict(), "started_at": self.started_at, "finished_at": self.finished_at,
                "checks": [c.to_dict() for c in self.checks], "warnings": self.plan.warnings}

    def summary(self) -> str:
        """One line: what was written, how big, how fast, and what became of the MTP block."""
        m = self.plan.mtp_summary()
        return (f"wrote {self.output} ({self.size_bytes} bytes, {self.plan.bpw:.3f} bpw) in {self.seconds:.1f}s; "
                f"MTP blk.{m.block} {m.status}, eh_proj {m.eh_proj}")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class _Progress:
    """A tqdm bar over source bytes, advanced as llama.cpp logs each tensor it starts."""

    def __init__(self, gm: GGUFModel, enabled: bool):
        self.sizes = {name: t.n_bytes for name, t in gm.tensors.items()}
        self.current: str | None = None
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=sum(self.sizes.values()), unit="B", unit_scale=True, unit_divisor=1024, disable=None,
                            desc="quantize", dynamic_ncols=True)

    def on_line(self, level: int, line: str) -> None:  # noqa: ARG002
        m = _TENSOR_START.match(line)
        if m:
            self._finish_current()
            self.current = m.group(3)
            if self.bar is not None:
                self.bar.set_postfix_str(self.current, refresh=False)

    def _finish_current(self) -> None:
        if self.current is not None and self.bar is not None:
            self.bar.update(self.sizes.get(self.current, 0))
        self.current = None

    def close(self, ok: bool) -> None:
        if ok:
            self._finish_current()
        if self.bar is not None:
            self.bar.close()


def audit_against_plan(path: Path, plan: Plan, source: GGUFModel) -> list[AuditCheck]:
    """Every tensor's type equals the plan; the MTP block is intact; nextn_predict_layers kept."""
    out = GGUFModel(path)
    checks: list[AuditCheck] = []
    actual = out.type_table()
    planned = plan.type_table()
    mismatches = [f"{n}: plan {t}, file {actual.get(n, 'absent')}" for n, t in planned.items() if actual.get(n) != t]
    extra = sorted(set(actual) - set(planned))
    mismatches += [f"{n}: not in the plan" for n in extra]
    checks.append(AuditCheck("tensor types match the plan", not mismatches,
                             "; ".join(mismatches[:5]) or f"{len(planned)} tensors"))
    src_mtp, out_mtp = check_mtp(source), check_mtp(out)
    if src_mtp.status != "absent":
        checks.append(AuditCheck("MTP block present and complete", out_mtp.status == src_mtp.status,
                                 f"source {src_mtp.status}, output {out_mtp.status}"
                                 + (f"; missing {', '.join(out_mtp.missing)}" if out_mtp.missing else "")))
    checks.append(AuditCheck("nextn_predict_layers unchanged", out.nextn_predict_layers == source.nextn_predict_layers,
                             f"source {source.nextn_predict_layers}, output {out.nextn_predict_layers}"))
    return checks


def quantize(model: str | Path, recipe: Recipe | str | Path, out: str | Path, imatrix: str | Path | None = None,
             threads: int = 0, progress: bool = True, plan: Plan | None = None,
             mtp_optional: bool = False) -> QuantizeResult:
    """Quantize ``model`` with ``recipe`` into ``out`` (atomically), then audit the result.

    Raises :class:`PlanError` if pre-flight checks fail (before any work), :class:`QuantizeError`
    if libllama fails or the result differs from the plan."""
    model = Path(model)
    out = Path(out)
    if plan is None:
        plan = make_plan(model, recipe, imatrix, threads, mtp_optional=mtp_optional)
    _refuse_before_work(model, out, plan)
    out.parent.mkdir(parents=True, exist_ok=True)
    source = GGUFModel(model)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    params = dataclasses.replace(plan.params, nthread=threads, dry_run=False)
    bar = _Progress(source, progress)
    started, t0 = _now(), time.perf_counter()
    ok = False
    try:
        run = _quantize_in_worker(str(source.shards[0]), str(tmp), params, bar)
        if run.exc is not None:
            raise QuantizeError(f"{model}: quantization failed: {run.exc}")
        if run.rc != 0:
            tail = [line for line in run.log if line.strip()][-12:]
            raise QuantizeError(f"{model}: llama_model_quantize failed (status {run.rc}):\n  " + "\n  ".join(tail))
        checks = audit_against_plan(tmp, plan, source)
        bad = [c for c in checks if not c.ok]
        if bad:
            raise QuantizeError(f"{out}: audit after quantization failed: "
                                + "; ".join(f"{c.name}: {c.detail}" for c in bad))
        os.replace(tmp, out)
        ok = True
    finally:
        bar.close(ok)
        if not ok:
            tmp.unlink(missing_ok=True)
    return QuantizeResult(output=out, plan=plan, checks=checks, seconds=time.perf_counter() - t0,
                          size_bytes=out.stat().st_size, started_at=started, finished_at=_now(),
                          log_tail=run.log[-20:])


def _refuse_before_work(model: Path, out: Path, plan: Plan) -> None:
    if plan.errors:
        raise PlanError(f"{model}: pre-flight checks failed:\n  " + "\n  ".join(plan.errors), plan.errors)
    if out.exists() and out.is_dir():
        raise QuantizeError(f"{out}: is a directory")
    if out.resolve() == model.resolve():
        raise QuantizeError(f"{out}: output would overwrite the input")


@dataclasses.dataclass
class _WorkerRun:
    """What the quantization thread hands back: libllama's status and log, or what it raised."""

    rc: int | None = None
    log: list[str] = dataclasses.field(default_factory=list)
    exc: BaseException | None = None


def _quantize_in_worker(src: str, dst: str, params: QuantizeParams, bar: _Progress) -> _WorkerRun:
    """``llama_model_quantize`` in a worker thread: the C call cannot be interrupted, and waiting for
    it here in short joins keeps Ctrl-C responsive."""
    run = _WorkerRun()

    def work() -> None:
        try:
            run.rc, run.log = run_quantize(src, dst, params, bar.on_line)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            run.exc = e

    llama_cpp_module().llama_backend_init()
    worker = threading.Thread(target=work, name="ggufmtp-quantize", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
    return run
