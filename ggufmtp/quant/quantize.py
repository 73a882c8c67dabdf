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
from ..runtime.libllama import llama_cpp_module, run_quantize
from ..gguf.model import GGUFModel, check_mtp
from ..quant.plan import Plan, make_plan
from ..quant.recipe import Recipe

_TENSOR_START = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)\s+-")


@dataclasses.dataclass
class AuditCheck:
    name: str
    ok: bool
    detail: str = ""


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
                "mtp": self.plan.mtp_summary(), "started_at": self.started_at, "finished_at": self.finished_at,
                "checks": [dataclasses.asdict(c) for c in self.checks], "warnings": self.plan.warnings}


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
    if plan.errors:
        raise PlanError(f"{model}: pre-flight checks failed:\n  " + "\n  ".join(plan.errors), plan.errors)
    if out.exists() and out.is_dir():
        raise QuantizeError(f"{out}: is a directory")
    if out.resolve() == model.resolve():
        raise QuantizeError(f"{out}: output would overwrite the input")
    out.parent.mkdir(parents=True, exist_ok=True)
    source = GGUFModel(model)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    params = dataclasses.replace(plan.params, nthread=threads, dry_run=False)
    bar = _Progress(source, progress)
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["rc"], result["log"] = run_quantize(str(source.shards[0]), str(tmp), params, bar.on_line)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            result["exc"] = e

    started, t0 = _now(), time.perf_counter()
    # The C call cannot be interrupted; running it in a worker keeps Ctrl-C responsive here.
    llama_cpp_module().llama_backend_init()
    worker = threading.Thread(target=work, name="ggufmtp-quantize", daemon=True)
    ok = False
    try:
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
        if "exc" in result:
            raise QuantizeError(f"{model}: quantization failed: {result['exc']}")
        if result.get("rc") != 0:
            tail = [line for line in result.get("log", []) if line.strip()][-12:]
            raise QuantizeError(f"{model}: llama_model_quantize failed (status {result.get('rc')}):\n  "
                                + "\n  ".join(tail))
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
            _unlink(tmp)
    return QuantizeResult(output=out, plan=plan, checks=checks, seconds=time.perf_counter() - t0,
                          size_bytes=out.stat().st_size, started_at=started, finished_at=_now(),
                          log_tail=result.get("log", [])[-20:])


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except FileNotFoundError:
        pass
