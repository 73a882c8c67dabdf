"""Where a ladder's variants run: in sequence here, or on a Dask cluster.

Each variant is two tasks: *build* (plan, quantize, audit: CPU cores) and *measure* (verify, the
receipt's verification, eval and card: one GPU each when the model is offloaded, else one CPU slot), the second
depending on the first (in the sidecar layout *measure* cuts the trunk and verifies the pair: :mod:`.pairs`).
Both call :func:`ggufmtp.pipeline.run` on the variant's folder; its stage
cache makes *measure* reuse what *build* did, and makes a rerun of the ladder resume each variant
where it stopped (a failed variant does not redo the others). Each task's time is recorded in the
outcome (:class:`TaskTime`: start, wall seconds, CPU seconds), so the ladder's JSON says where its
wall time went (``benchmarks/ladder_bound.py`` bounds a concurrent run with a sequential one's).

Engines:

- :class:`Sequential` (the default, and what runs when Dask is not installed): variant after variant.
- :class:`DaskEngine`: Dask distributed, the engine the Python data ecosystem schedules with. With no
  address it starts a ``LocalCluster`` of ``workers`` processes on this host; with an address
  (``tcp://host:8786``, e.g. a ``dask-jobqueue`` Slurm cluster's scheduler) it uses that cluster.
  Tasks declare resources (``CPU`` for build, ``GPU`` for measure when offloaded), so a worker never
  runs two GPU tasks at once; local workers declare ``{"CPU": 1, "GPU": 1}`` with GPUs (each pinned to
  its own card through ``CUDA_VISIBLE_DEVICES``) and ``{"CPU": 1}`` without. Dask is an optional
  dependency (``pip install 'ggufmtp[ladder]'``): about 2.5 MB of wheels, small enough to carry to
  machines without a package index.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, Protocol, TypedDict

from ..errors import GgufmtpError, LadderError
from ..jsontypes import JsonObject
from .spec import VariantJob

__all__ = ["TaskTime", "VariantOutcome", "Engine", "Sequential", "DaskEngine", "build_variant", "measure_variant", "task_result"]


class TaskTimeDict(TypedDict):
    start: float
    seconds: float
    cpu_seconds: float
    pid: int


@dataclass(frozen=True)
class TaskTime:
    """One task of a variant (build or measure): when it started (Unix time), its wall seconds, and
    the CPU seconds of its process and of the children it waited for (llama-server, llama-quantize)
    meanwhile. The CPU figure is the task's own where nothing else runs in its process (in sequence);
    on a Dask worker running two tasks at once it includes the other's."""

    start: float
    seconds: float
    cpu_seconds: float
    pid: int

    def to_dict(self) -> TaskTimeDict:
        return {"start": round(self.start, 3), "seconds": round(self.seconds, 3),
                "cpu_seconds": round(self.cpu_seconds, 3), "pid": self.pid}


def _cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of its waited-for children, so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass(frozen=True)
class VariantOutcome:
    """What one variant's task gave: the run's summary (``ggufmtp run --json``), or the error."""

    recipe: str  # as the ladder was given it: a recipe name or a TOML file
    ok: bool
    summary: JsonObject = field(default_factory=dict)  # RunResult.summary(): the run's JSON
    error: str | None = None
    host: str = ""
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES of the worker that measured it
    variant: str = ""  # the recipe's release tag: the variant's folder
    tasks: Mapping[str, TaskTime] = field(default_factory=dict)  # "build", "measure": when each ran, its cost

    def to_dict(self) -> JsonObject:
        return {"recipe": self.recipe, "variant": self.variant, "ok": self.ok, "summary": self.summary, "error": self.error,
                "host": self.host, "gpu": self.gpu, "tasks": {k: t.to_dict() for k, t in self.tasks.items()}}


def _run_variant(job: VariantJob, measure: bool, before: Mapping[str, TaskTime] | None = None) -> VariantOutcome:
    """The task (build, or measure with ``before`` the build's times), timed into the outcome's ``tasks``."""
    start, t0, c0 = time.time(), time.monotonic(), _cpu_seconds()
    outcome = _variant_task(job, measure)
    took = TaskTime(start, time.monotonic() - t0, _cpu_seconds() - c0, os.getpid())
    return dataclasses.replace(outcome, tasks={**(before or {}), "measure" if measure else "build": took})


def _variant_task(job: VariantJob, measure: bool) -> VariantOutcome:
    from ..pipeline import run
    from ..run_options import RunOptions
    from .pairs import trunk_variant

    trunk = job.sidecar is not None  # layout sidecar: the full variant is built, the trunk measured (.pairs)
    try:
        # a trunk is cut from one file (quant/sidecar.py): its unpublished full variant is never split
        options = RunOptions(imatrix=job.imatrix, quantize_threads=job.threads, split_max_size=None if trunk else job.split,
                             verify=job.verify,
                             verify_options=job.verify_options,  # building: the memory plan before quantizing
                             reference_base=job.reference_base,
                             token=job.token, signing_key=job.signing_key, eval_options=job.eval_options,
                             base_dir=job.base_dir, until=None if measure and not trunk else "audit",
                             reuse_failed=True,  # a failing verdict of the same bytes and settings: reused
                             quantized_by=job.quantized_by, base_model=job.base_model)
        res = run(job.model, job.recipe, options, out_dir=job.build_dir, progress=False)
        summary = trunk_variant(job, res) if measure and trunk else res.summary()
    except GgufmtpError as e:  # the variant's failure is reported; the other variants go on
        return VariantOutcome(job.recipe, False, error=str(e), host=os.uname().nodename, variant=job.out_dir.name)
    except OSError as e:  # its folder or a file of it cannot be written (a disk full, a permission)
        return VariantOutcome(job.recipe, False, error=f"{e.filename or job.out_dir}: {e.strerror or e}",
                              host=os.uname().nodename, variant=job.out_dir.name)
    return VariantOutcome(job.recipe, True, summary, host=os.uname().nodename,
                          gpu=os.environ.get("CUDA_VISIBLE_DEVICES"), variant=job.out_dir.name)


def build_variant(job: VariantJob) -> VariantOutcome:
    """Plan, quantize and audit (no llama-server); its receipt without a verification yet."""
    return _run_variant(job, measure=False)


def measure_variant(built: VariantOutcome, job: VariantJob) -> VariantOutcome:
    """Verify, receipt, eval and card of a built variant (the stages before come from its stage cache;
    the summary's ``ran_because`` keeps why the build ran its stages, which the measure found cached)."""
    if not built.ok:
        return built
    measured = _run_variant(job, measure=True, before=built.tasks)
    why = {**built.summary.get("ran_because", {}), **measured.summary.get("ran_because", {})}
    return dataclasses.replace(measured, summary={**measured.summary, "ran_because": why}) if measured.ok else measured


class EngineInfo(TypedDict):
    """How a ladder ran (``LadderResult.engine``): the engine, its workers, and Dask's address and GPUs."""

    engine: str
    workers: int
    address: NotRequired[str]
    gpus: NotRequired[int]


class Engine(Protocol):
    def run(self, jobs: Sequence[VariantJob]) -> Iterator[VariantOutcome]:
        """Every job's final outcome, in the order they finish."""
        ...

    def describe(self) -> EngineInfo: ...


class Sequential:
    """Variant after variant, in this process."""

    def run(self, jobs: Sequence[VariantJob]) -> Iterator[VariantOutcome]:
        for job in jobs:
            yield measure_variant(build_variant(job), job)

    def describe(self) -> EngineInfo:
        return {"engine": "sequential", "workers": 1}


def _pin_gpu_plugin(n_gpus: int) -> Any:
    """A worker plugin giving local worker ``i`` the GPU ``i mod n_gpus`` (before any task starts
    a llama-server, which inherits the environment)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class PinGpu(WorkerPlugin):
        name = "ggufmtp-pin-gpu"

        def setup(self, worker: Any) -> None:
            try:
                index = int(str(worker.name).rsplit("-", 1)[-1])
            except ValueError:
                return
            os.environ["CUDA_VISIBLE_DEVICES"] = str(index % n_gpus)

    return PinGpu()


def _require_dask() -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise LadderError("--workers and --scheduler need Dask: pip install 'ggufmtp[ladder]' "
                          "(or leave them out to run the variants in sequence)") from None


def check_scheduler(address: str | None, error: type[GgufmtpError] = LadderError) -> None:
    """``error`` naming ``--scheduler`` for an address Dask's client cannot read (a host without its
    port, ``tcp://host:x``): said before any work, not as distributed's ValueError traceback when the
    engine connects after the shared stages."""
    if not address:
        return
    _require_dask()
    from distributed.comm.addressing import get_address_host_port, parse_address

    try:
        if parse_address(address)[0] in ("tcp", "tls"):  # another scheme's (ucx://, inproc://) its own reader's
            get_address_host_port(address)
    except ValueError as e:
        raise error(f"--scheduler {address!r}: {e} (a Dask scheduler's address, e.g. tcp://host:8786)") from None


def task_result(future: Any, what: str, error: type[GgufmtpError] = LadderError) -> Any:
    """A Dask task's result. A task whose worker process died on every try (llama.cpp aborts its
    process on a failed assertion, where a Python error would have been raised) is one ``error``
    naming ``what``, not Dask's ``KilledWorker`` traceback."""
    from distributed.scheduler import KilledWorker

    try:
        return future.result()
    except KilledWorker:
        raise error(f"{what}: its worker process died on every try (a crash inside llama.cpp, such as a "
                    "failed assertion, or too little memory); the log above shows the worker's last words") from None


@dataclass
class DaskEngine:
    """Variants as Dask tasks: on a local cluster of ``workers`` processes, or on ``address``'s cluster."""

    workers: int = 2
    gpus: int = 0
    address: str | None = None
    on_start: Callable[[str], None] = lambda m: None

    def __post_init__(self) -> None:
        check_scheduler(self.address)

    def _client(self) -> Any:
        _require_dask()
        from distributed import Client, LocalCluster

        if self.address:
            try:
                return Client(self.address)
            except (OSError, ValueError, TypeError) as e:  # nothing listening, a scheme whose package is missing
                raise LadderError(f"--scheduler {self.address}: cannot connect ({type(e).__name__}: {e})") from None
        res = {"CPU": 1, "GPU": 1} if self.gpus else {"CPU": 1}
        cluster = LocalCluster(n_workers=self.workers, threads_per_worker=2 if self.gpus else 1, processes=True,
                               resources=res, dashboard_address=None, silence_logs=40)
        client = Client(cluster)
        if self.gpus:
            client.register_plugin(_pin_gpu_plugin(self.gpus))
        return client

    def run(self, jobs: Sequence[VariantJob]) -> Iterator[VariantOutcome]:
        from distributed import as_completed

        client = self._client()
        try:
            self.on_start(f"dask: {len(client.scheduler_info()['workers'])} workers ({client.scheduler.address})")
            finals = []
            for job in jobs:
                built = client.submit(build_variant, job, key=f"build-{job.recipe}", pure=False, resources={"CPU": 1})
                finals.append(client.submit(measure_variant, built, job, key=f"measure-{job.recipe}", pure=False,
                                            resources={"GPU": 1} if job.uses_gpu and self.gpus else {"CPU": 1}))
            for fut in as_completed(finals):
                yield task_result(fut, f"variant {fut.key.removeprefix('measure-')}")
        finally:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None and not self.address:
                cluster.close()

    def describe(self) -> EngineInfo:
        return {"engine": "dask", "address": self.address or "local", "workers": self.workers, "gpus": self.gpus}
