"""``ggufmtp quantize``: plan, quantize in-process with libllama, audit, then rename into place.

The output is written into a hidden partial folder beside ``OUT`` and renamed only after the
audit (and the caller's receipt) passed: Ctrl-C, a libllama failure, an audit mismatch or a
kill -9 leave no ``OUT`` behind.

With a receipt to write (``before_publish``), the sha256 digests it needs are computed off the
critical path: the input's in a low-priority thread during the quantization (or taken from the
local digest cache when ggufmtp already hashed that very file: ``pull``, an earlier quantize), the
output's in a thread while the file is fsynced and audited. ``QuantizeResult.stages`` says where
the time went.

An output larger than the split size (``split``, default 48G: under the Hub's 50 GB file limit) is
split into shards by the pinned ``llama-gguf-split`` in the partial folder (:mod:`.split`), the set
audited against the plan again (the MTP block may land in any shard), each shard hashed, and all of
them renamed into place after the receipt, the first shard last: ``OUT`` less ``.gguf``, then
``-00001-of-0000N.gguf``. Splitting needs the output's size again in free space, briefly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import re
import resource
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..checks import Check
from ..errors import PlanError, QuantizeError
from ..files.digest_cache import DigestCache
from ..files.fsutil import fsync_dir, fsync_path
from ..files.hashing import sha256_file
from ..files.records import read_conversion_record
from ..gguf.model import SPLIT_RE, GGUFModel, check_mtp, format_blocks
from ..jsontypes import JsonObject
from .output_header import predict_output_header
from .plan import Plan, make_plan
from .recipe import Recipe
from .split import DEFAULT_SPLIT_MAX_SIZE, SplitSize, split_gguf
from .stream_hash import OutputDigest
from .worker import BackgroundHash, WorkerRun, run_quantize_interruptible, thread_read_bytes

_TENSOR_START = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)\s+-")


@dataclasses.dataclass
class StageTime:
    """One stage of a quantize: ``seconds`` of its own work; ``waited``: how long the command
    waited for it (less than ``seconds`` when it ran alongside other work); ``peak_rss_mib``: the
    process's peak RSS so far when it ended (monotonic: the first stage where it jumps is where the
    peak happened); ``read_mib``: bytes its thread read with read(2); ``mapped_mib``: pages the
    whole process faulted in meanwhile (libllama and the header reader read through mmap)."""

    seconds: float
    waited: float
    peak_rss_mib: float
    read_mib: float = 0.0
    mapped_mib: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in dataclasses.asdict(self).items()}


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _faulted_mib() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_minflt + r.ru_majflt) * resource.getpagesize() / 2**20


@dataclasses.dataclass
class StageTimes:
    """Where a quantize's time went, stage by stage, in the order they ended: ``plan`` (libllama's
    dry run; absent when a plan was given), ``predict_header`` (the output's header, so its sha256
    can be computed while libllama writes it), ``quantize``, ``hash_input`` (concurrent),
    ``hash_output`` (concurrent: streamed during the quantization, else after it), ``fsync``, ``audit``, ``receipt`` (the caller's
    ``before_publish``: writing the receipt, signing) and ``publish`` (rename, fsync of the folder)."""

    stages: dict[str, StageTime] = dataclasses.field(default_factory=dict)

    @contextlib.contextmanager
    def measure(self, name: str) -> Iterator[None]:
        """Time the block as stage ``name`` (run in this thread, so waited == seconds)."""
        t0, r0, m0 = time.perf_counter(), thread_read_bytes(), _faulted_mib()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.stages[name] = StageTime(dt, dt, _peak_rss_mib(), (thread_read_bytes() - r0) / 2**20,
                                          _faulted_mib() - m0)

    def collect(self, name: str, job: BackgroundHash | OutputDigest) -> dict[str, str]:
        """Wait for a background hash and record it as stage ``name``; returns its digests."""
        t0 = time.perf_counter()
        digests = job.result()
        self.stages[name] = StageTime(job.seconds, time.perf_counter() - t0, _peak_rss_mib(),
                                      job.read_bytes / 2**20)
        return digests

    @property
    def critical_seconds(self) -> float:
        """Sum of what the command waited for: its wall time, less interpreter start and argument parsing."""
        return sum(s.waited for s in self.stages.values())

    def to_dict(self) -> JsonObject:
        return {**{k: v.to_dict() for k, v in self.stages.items()},
                "critical_path_seconds": round(self.critical_seconds, 3)}


@dataclasses.dataclass
class QuantizeResult:
    """What :func:`quantize` made: the artifact, its plan and the post-quantization audit."""

    output: Path
    plan: Plan
    checks: list[Check]
    seconds: float
    size_bytes: int
    started_at: str
    finished_at: str
    log_tail: list[str] = dataclasses.field(default_factory=list, repr=False)
    #: sha256 of the output's bytes (None when no receipt was asked for, so nothing was hashed)
    output_sha256: str | None = None
    #: sha256 of each input file, by resolved path (same condition)
    input_sha256: dict[str, str] = dataclasses.field(default_factory=dict)
    #: how the output's digest was computed: "streamed" (while libllama wrote it, header predicted
    #: and checked) or "after the write (...why)"; None when nothing was hashed
    output_hashed: str | None = None
    stages: StageTimes = dataclasses.field(default_factory=StageTimes)
    #: a split output's shards in order (``output`` is the first); empty when it is one file
    shards: list[Path] = dataclasses.field(default_factory=list)
    #: sha256 of each shard, by str(path) as in ``shards`` (same condition as ``output_sha256``)
    shard_sha256: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the split size a split output was made with (``--split-max-size``, e.g. "48G")
    split_max_size: str | None = None
    #: where ``output`` is published: during ``before_publish`` ``output`` is still the staged file,
    #: and a split output's name is known only now (write the receipt beside this)
    destination: Path | None = None
    #: the receipt and the artifact's signature written before publishing (:func:`ggufmtp.quantize`), else None
    receipt: Path | None = None
    signature: Path | None = None

    @property
    def files(self) -> list[Path]:
        """Every file of the artifact: the shards of a split output, else the output."""
        return list(self.shards) or [self.output]

    def to_dict(self) -> JsonObject:
        return {"output": str(self.output), "shards": [str(p) for p in self.shards],
                "recipe": self.plan.recipe, "ftype": self.plan.ftype,
                "size_bytes": self.size_bytes, "bpw": round(self.plan.bpw, 4), "seconds": round(self.seconds, 3),
                "sha256": self.output_sha256, "output_hashed": self.output_hashed,
                "mtp": self.plan.mtp_summary().to_dict(), "started_at": self.started_at, "finished_at": self.finished_at,
                "checks": [c.to_dict() for c in self.checks], "warnings": self.plan.warnings,
                "stages": self.stages.to_dict(),
                **{k: str(v) for k, v in (("receipt", self.receipt), ("signature", self.signature)) if v is not None}}

    def summary(self) -> str:
        """One line: what was written, how big, how fast, and what became of the MTP block."""
        m = self.plan.mtp_summary()
        return (f"wrote {self.output} ({self.size_bytes} bytes, {self.plan.bpw:.3f} bpw) in {self.seconds:.1f}s; "
                f"MTP {m.where} {m.status}, eh_proj {m.eh_proj}")


def check_quantize_threads(value: Any) -> int:
    """``quantize_threads`` (``--quantize-threads``) checked: a whole number, 0 for all cores."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise QuantizeError(f"quantize_threads {value!r}: must be a whole number of at least 0 (0: all cores)")
    return value


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class _Progress:
    """A tqdm bar over source bytes, advanced as llama.cpp logs each tensor it starts."""

    def __init__(self, gm: GGUFModel, enabled: bool):
        self.sizes = {name: t.n_bytes for name, t in gm.tensors.items()}
        self.current: str | None = None
        self.bar = None
        if enabled:
            from ..progress import bar

            self.bar = bar(sum(self.sizes.values()), "quantize", "B", unit_scale=True, unit_divisor=1024)

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


def audit_against_plan(path: Path, plan: Plan, source: GGUFModel) -> list[Check]:
    """Every tensor's type equals the plan; every MTP block is intact (the same blocks as the
    source's, each as complete); nextn_predict_layers kept."""
    out = GGUFModel(path)
    checks: list[Check] = []
    actual = out.type_table()
    planned = plan.type_table()
    mismatches = [f"{n}: plan {t}, file {actual.get(n, 'absent')}" for n, t in planned.items() if actual.get(n) != t]
    extra = sorted(set(actual) - set(planned))
    mismatches += [f"{n}: not in the plan" for n in extra]
    checks.append(Check("tensor types match the plan", not mismatches,
                             "; ".join(mismatches[:5]) or f"{len(planned)} tensors"))
    src_mtp, out_mtp = check_mtp(source), check_mtp(out)
    if src_mtp.status != "absent":
        same_blocks = out_mtp.blocks == src_mtp.blocks
        checks.append(Check("MTP block present and complete", out_mtp.status == src_mtp.status and same_blocks,
                                 f"source {src_mtp.status}, output {out_mtp.status}"
                                 + ("" if same_blocks and len(src_mtp.blocks) <= 1 else
                                    f"; blocks: source {format_blocks(src_mtp.blocks) or 'none'}, "
                                    f"output {format_blocks(out_mtp.blocks) or 'none'}")
                                 + (f"; missing {', '.join(out_mtp.missing)}" if out_mtp.missing else "")))
    checks.append(Check("nextn_predict_layers unchanged", out.nextn_predict_layers == source.nextn_predict_layers,
                             f"source {source.nextn_predict_layers}, output {out.nextn_predict_layers}"))
    return checks


def quantize(model: str | Path, recipe: Recipe | str | Path, out: str | Path, imatrix: str | Path | None = None,
             *, threads: int = 0, progress: bool = True, plan: Plan | None = None, mtp_optional: bool = False,
             before_publish: Callable[[QuantizeResult], Any] | None = None,
             split: SplitSize | None = DEFAULT_SPLIT_MAX_SIZE) -> QuantizeResult:
    """Quantize ``model`` with ``recipe`` into ``out`` (atomically), then audit the result.

    The file is made in a hidden partial folder beside ``out`` (``.OUT.partial-<pid>/OUT``), fsynced,
    audited, handed to ``before_publish`` (the result's ``output`` is then the staged file, under
    its final name: write the receipt there, with an explicit receipt path) and only then renamed
    into place: an artifact never appears before its receipt, and an interrupt, a failure or a
    ``kill -9`` at any point leaves no ``out`` (the next run removes partials of dead processes).
    With ``before_publish`` the result it gets carries ``output_sha256`` and ``input_sha256``,
    hashed off the critical path (module docstring), so the receipt reads neither file again.
    ``split``: the largest file to write (:class:`~ggufmtp.quant.split.SplitSize`); a larger output
    becomes shards and the result's ``output`` its first (``shards``: all); None: always one file.

    Raises :class:`PlanError` if pre-flight checks fail (before any work), :class:`QuantizeError`
    if libllama fails or the result differs from the plan."""
    model, out, clock = Path(model), Path(out), StageTimes()
    if plan is None:
        with clock.measure("plan"):
            plan = make_plan(model, recipe, imatrix, threads=threads, mtp_optional=mtp_optional)
    _refuse_before_work(model, out, plan)
    _refuse_changed_imatrix(plan)
    _make_folder(out.parent, out)
    remove_stale_partials(out)
    source = GGUFModel(model)
    work = out.with_name(f".{out.name}{PARTIAL_MARK}{os.getpid()}")
    staged = work / out.name
    params = dataclasses.replace(plan.params, nthread=threads, dry_run=False)
    bar = _Progress(source, progress)
    started, t0 = _now(), time.perf_counter()
    ok = False
    jobs: list[BackgroundHash | OutputDigest] = []
    try:
        _make_folder(work, out)
        if before_publish is not None:  # the receipt names the input's digests: hash it meanwhile
            jobs.append(BackgroundHash(source.shards, cache=input_digest_cache(), background=True))
            with clock.measure("predict_header"):  # and the output's, as libllama writes it
                jobs.append(OutputDigest(staged, predict_output_header(model, plan, params), input_digest_cache()))
        with clock.measure("quantize"):
            run = run_quantize_interruptible(str(source.shards[0]), str(staged), params, bar.on_line)
        _raise_for_run(run, model, out)
        if before_publish is not None:
            jobs[0].hurry()
            jobs[1].writer_finished()
        checks = _durable_and_audited(staged, plan, source, out, clock)
        files = _split_if_larger(staged, split, plan, source, clock)
        result = QuantizeResult(output=files[0], plan=plan, checks=checks, seconds=time.perf_counter() - t0,
                                size_bytes=sum(f.stat().st_size for f in files), started_at=started,
                                finished_at=_now(), log_tail=run.log[-20:], stages=clock,
                                shards=files if len(files) > 1 else [],
                                split_max_size=str(split) if len(files) > 1 else None,
                                destination=out.parent / files[0].name if len(files) > 1 else out)
        if before_publish is not None:
            result.input_sha256 = clock.collect("hash_input", jobs[0])
            _output_digests(result, jobs[1], clock)
            with clock.measure("receipt"):
                before_publish(result)
        with clock.measure("publish"):
            published = _publish(result, out, jobs[1] if before_publish is not None else None)
        ok = True
    finally:
        for job in jobs:
            job.cancel()
        bar.close(ok)
        _remove_partial(work)
    return dataclasses.replace(result, output=published[0], shards=published if result.shards else [],
                               destination=published[0],
                               shard_sha256={str(out.parent / Path(k).name): v for k, v in result.shard_sha256.items()})


def _split_if_larger(staged: Path, split: SplitSize | None, plan: Plan, source: GGUFModel, clock: StageTimes
                     ) -> list[Path]:
    """``[staged]``, or its shards when it is larger than ``split`` (the unsplit file removed, the set
    audited against the plan: every tensor's type, the MTP block found across the shards)."""
    if split is None or staged.stat().st_size <= split.n_bytes:
        return [staged]
    with clock.measure("split"):
        shards = split_gguf(staged, staged, split)
        staged.unlink()
        bad = [c for c in audit_against_plan(shards[0], plan, source) if not c.ok]
    if bad:
        raise QuantizeError(f"{staged.name}: audit after splitting failed: "
                            + "; ".join(f"{c.name}: {c.detail}" for c in bad))
    return shards


def remove_replaced(out: Path, published: list[Path]) -> None:
    """Remove what an earlier quantize to ``out`` left that the new artifact replaces, as writing
    ``out`` replaces ``out``: ``out`` itself or shards of another split of it, with their
    ``.receipt.json`` and ``.sig`` (a stale shard beside a set is an extra shard to the audit)."""
    stem = out.name.removesuffix(".gguf")
    family = [out, *(p for p in out.parent.glob("*-of-*.gguf") if (m := SPLIT_RE.match(p.name)) and m["stem"] == stem)]
    for p in family:
        if p not in published and p.is_file():
            for f in (p, p.with_name(p.name + ".receipt.json"), p.with_name(p.name + ".sig")):
                f.unlink(missing_ok=True)


def _output_digests(result: QuantizeResult, streamed: BackgroundHash | OutputDigest, clock: StageTimes) -> None:
    """The output's sha256 into ``result``: the digest streamed as libllama wrote it, or, for a
    split output, each shard's (the streamed digest is of the unsplit file, which is gone)."""
    if not result.shards:
        result.output_sha256 = clock.collect("hash_output", streamed)[str(result.output.resolve())]
        result.output_hashed = streamed.how if isinstance(streamed, OutputDigest) else "after the write"
        return
    streamed.cancel()
    digests = clock.collect("hash_output", BackgroundHash(result.shards, cache=input_digest_cache()))
    result.shard_sha256 = {str(p): digests[str(p.resolve())] for p in result.shards}
    result.output_sha256 = result.shard_sha256[str(result.output)]
    result.output_hashed = f"after the split (each of {len(result.shards)} shards)"


def _publish(result: QuantizeResult, out: Path, streamed: BackgroundHash | OutputDigest | None) -> list[Path]:
    """Rename the staged file(s) into ``out``'s folder (a split set's first shard last, the file a
    server is given), then fsync the folder; returns the published paths."""
    files = result.files
    if streamed is not None and not result.shards and isinstance(streamed, OutputDigest):
        streamed.remember()
    stats = [f.stat() for f in files]
    finals = [out] if not result.shards else [out.parent / f.name for f in files]
    for staged, final in reversed(list(zip(files, finals, strict=True))):
        os.replace(staged, final)
    remove_replaced(out, finals)
    fsync_dir(out.parent)
    if streamed is not None:  # eval or run --eval need not read the output again
        for st, final in zip(stats, finals, strict=True):
            input_digest_cache().follow_rename(st, final)
    return finals


def input_digest_cache() -> DigestCache:
    """The local digest cache quantize reuses input digests from, and records its output's digest
    in: ``<ggufmtp cache>/digests``."""
    from ..runtime.build import cache_root

    return DigestCache.under(cache_root())


def _durable_and_audited(staged: Path, plan: Plan, source: GGUFModel, out: Path, clock: StageTimes
                         ) -> list[Check]:
    """fsync the staged output (libllama closes it without one: durable before the rename), then
    audit it against the plan; QuantizeError when the audit fails."""
    with clock.measure("fsync"):
        fsync_path(staged)
    with clock.measure("audit"):
        checks = audit_against_plan(staged, plan, source)
    bad = [c for c in checks if not c.ok]
    if bad:
        raise QuantizeError(f"{out}: audit after quantization failed: "
                            + "; ".join(f"{c.name}: {c.detail}" for c in bad))
    return checks


PARTIAL_MARK = ".partial-"


def _make_folder(folder: Path, out: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise QuantizeError(f"{out}: cannot create folder {folder} ({e.strerror or e})") from None


def _remove_partial(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_partials(out: str | Path) -> list[Path]:
    """Remove ``.OUT.partial-<pid>`` files and folders beside ``out`` whose process is gone
    (left by a kill -9 or a crash); returns what was removed. Called before this process makes its own."""
    out = Path(out)
    prefix = f".{out.name}{PARTIAL_MARK}"
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for p in out.parent.iterdir():
            pid = p.name[len(prefix):]
            # our own pid: a leftover of an earlier process that had it (ours is made after this)
            if p.name.startswith(prefix) and pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid))):
                _remove_partial(p)
                removed.append(p)
    return removed


def _raise_for_run(run: WorkerRun, model: Path, out: Path) -> None:
    """libllama's failure as a QuantizeError that blames the right file: a write error (disk full,
    output folder gone) names the output, anything else the model."""
    if run.exc is not None:
        raise QuantizeError(f"{model}: quantization failed: {run.exc}")
    if run.rc == 0:
        return
    tail = [line for line in run.log if line.strip()][-12:]
    if any("iostream error" in line or "basic_ios" in line for line in tail):
        raise QuantizeError(f"{out}: cannot write the output: {_write_failure(out.parent)}")
    raise QuantizeError(f"{model}: llama_model_quantize failed (status {run.rc}):\n  " + "\n  ".join(tail))


def _write_failure(folder: Path) -> str:
    try:
        st = os.statvfs(folder)
    except OSError as e:
        return f"write error ({e.strerror or e})"
    free = st.f_bavail * st.f_frsize
    if free < 1 << 20:
        return f"no space left on device ({free} bytes free in {folder})"
    return f"write error (llama.cpp reported an iostream error; {free} bytes free in {folder})"


def _refuse_before_work(model: Path, out: Path, plan: Plan) -> None:
    if plan.errors:
        raise PlanError(f"{model}: pre-flight checks failed:\n  " + "\n  ".join(plan.errors), plan.errors)
    if out.exists() and out.is_dir():
        raise QuantizeError(f"{out}: is a directory")
    if out.resolve() == model.resolve():
        raise QuantizeError(f"{out}: output would overwrite the input")
    m = SPLIT_RE.match(model.name)
    if m and m["stem"] == out.name.removesuffix(".gguf") and model.parent.resolve() == out.parent.resolve():
        raise QuantizeError(f"{out}: the input's shards are {m['stem']}-NNNNN-of-{m['n']}.gguf, the names a split "
                            f"output would replace; give the output another name")
    read_conversion_record(model)  # the receipt copies the conversion record: a bad one is refused before any work


def _refuse_changed_imatrix(plan: Plan) -> None:
    """The imatrix must still be the bytes the plan read: the receipt names that digest."""
    if not plan.imatrix or not plan.imatrix_sha256:
        return
    try:
        now = sha256_file(plan.imatrix)
    except OSError as e:
        raise QuantizeError(f"{plan.imatrix}: cannot read the imatrix ({e.strerror or e})") from None
    if now != plan.imatrix_sha256:
        raise QuantizeError(f"{plan.imatrix}: the imatrix changed after the plan read it (sha256 "
                            f"{plan.imatrix_sha256} when planned, {now} now); plan again")
