"""``ggufmtp imatrix compute``: run the pinned ``llama-imatrix`` over a corpus, optionally add the
MTP block's statistics, and write one GGUF imatrix that records how it was made.

``llama-imatrix`` writes its output file every ``--output-frequency`` chunks while it runs, so it
writes into a private temporary folder (``$TMPDIR``); the final file is written once,
atomically, with the provenance below added as extra GGUF metadata (``common_imatrix_load`` reads
only the three ``imatrix.*`` keys, so ``llama-quantize`` accepts the file unchanged; the test
suite checks this). A failure or Ctrl-C leaves neither a half-written file nor a running process.

Recorded under ``ggufmtp.imatrix.*``: the corpus name, sha256 and size, chunks, context size, the
runtime commit, whether MTP statistics were merged and how many entries they added. The dataset
name is the corpus name (``builtin:calib-v1`` or the file's name), not a local path.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType

from ..errors import CorpusError, ImatrixError
from ..gguf.model import GGUFModel
from ..runtime.build import binary_is_ggufmtp_build, binary_version, find_binary
from ..runtime.process import describe_exit, die_with_parent, stop_process
from .corpus import Corpus, check_corpus_text, min_tokens_for, resolve_corpus
from .entries import DEFAULT_CHUNK_SIZE, STANDARD_KEYS, Imatrix, name_order
from .format import read_imatrix, write_imatrix
from .mtp import llama_imatrix_command
from .settings import CollectMode, ImatrixSettings

__all__ = ["ComputeResult", "ImatrixProvenance", "RunImatrix", "compute_imatrix", "imatrix_for_run",
           "llama_imatrix_command", "merge_entries"]

KEY_PREFIX = "ggufmtp.imatrix."
_TEMP_PREFIX = ".ggufmtp-imatrix-"
_LOG_TAIL = 4000


@dataclasses.dataclass(frozen=True)
class ImatrixProvenance:
    """How an imatrix was computed; stored in its GGUF metadata, so any later quantize sees it."""

    corpus_name: str
    corpus_sha256: str
    corpus_bytes: int
    chunks: int
    ctx_size: int
    runtime_commit: str
    mtp: bool
    mtp_entries: int = 0

    _KINDS = {"corpus_name": "str", "corpus_sha256": "str", "corpus_bytes": "u64", "chunks": "u32",
              "ctx_size": "u32", "runtime_commit": "str", "mtp": "bool", "mtp_entries": "u32"}

    def to_dict(self) -> dict[str, Any]:
        return {"corpus": {"name": self.corpus_name, "sha256": self.corpus_sha256, "bytes": self.corpus_bytes},
                "chunks": self.chunks, "ctx_size": self.ctx_size, "runtime_commit": self.runtime_commit,
                "mtp": self.mtp, "mtp_entries": self.mtp_entries}

    def to_kv(self) -> dict[str, bytes]:
        """``{key: GGUF type + value bytes}`` as :attr:`Imatrix.gguf_extra_kv` holds them."""
        return {KEY_PREFIX + f: _encode(self._KINDS[f], getattr(self, f)) for f in self._KINDS}

    @classmethod
    def from_imatrix(cls, im: Imatrix) -> ImatrixProvenance | None:
        """The provenance ggufmtp recorded in ``im`` (None for files made otherwise, or damaged keys)."""
        values = {}
        for f in cls._KINDS:
            raw = im.gguf_extra_kv.get(KEY_PREFIX + f)
            value = _decode(raw, cls._KINDS[f]) if raw is not None else None
            if value is None:
                return None
            values[f] = value
        try:
            return cls(**values)
        except TypeError:
            return None


_TYPE_IDS = {"str": GGUFValueType.STRING, "u32": GGUFValueType.UINT32, "u64": GGUFValueType.UINT64,
             "bool": GGUFValueType.BOOL}


def _encode(kind: str, value: Any) -> bytes:
    head = struct.pack("<i", _TYPE_IDS[kind])
    if kind == "str":
        b = str(value).encode("utf-8")
        return head + struct.pack("<Q", len(b)) + b
    return head + struct.pack({"u32": "<I", "u64": "<Q", "bool": "<?"}[kind], value)


def _decode(raw: bytes, kind: str) -> str | int | bool | None:
    """The value of one GGUF KV written by :func:`_encode` as ``kind``; None for anything else."""
    try:
        (tid,) = struct.unpack_from("<i", raw)
        if tid != _TYPE_IDS[kind]:
            return None
        if kind == "str":
            (n,) = struct.unpack_from("<Q", raw, 4)
            return bytes(raw[12:12 + n]).decode("utf-8") if len(raw) == 12 + n else None
        fmt = {"u32": "<I", "u64": "<Q", "bool": "<?"}[kind]
        return struct.unpack_from(fmt, raw, 4)[0] if len(raw) == 4 + struct.calcsize(fmt) else None
    except (struct.error, UnicodeDecodeError):
        return None


@dataclasses.dataclass(frozen=True)
class ComputeResult:
    """What ``compute_imatrix`` wrote and measured."""

    path: Path
    sha256: str
    model: Path
    entries: int
    provenance: ImatrixProvenance
    perplexity: float | None
    llama_imatrix_s: float
    mtp_s: float
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "model": str(self.model), "entries": self.entries,
                **self.provenance.to_dict(), "perplexity": self.perplexity,
                "llama_imatrix_s": round(self.llama_imatrix_s, 3), "mtp_s": round(self.mtp_s, 3),
                "notes": list(self.notes)}


# ------------------------------------------------------------------------------------------------
# running llama-imatrix
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Run:
    """What one llama-imatrix process printed: its exit status, the chunk count it announced, the
    last chunk it reported and the final perplexity."""

    rc: int = 0
    total_chunks: int | None = None
    done_chunks: int = 0
    perplexity: float | None = None
    stderr: list[str] = dataclasses.field(default_factory=list)
    stdout: str = ""


_CHUNKS_RE = re.compile(r"computing over (\d+) chunks")
_DONE_RE = re.compile(r"\[(\d+)\]")
_PPL_RE = re.compile(r"Final estimate: PPL = ([0-9.eE+-]+|inf|nan)")


def _pump_stderr(proc: subprocess.Popen, run: _Run, on_total: Callable[[int], None]) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        run.stderr.append(line)
        m = _CHUNKS_RE.search(line)
        if m:
            run.total_chunks = int(m.group(1))
            on_total(run.total_chunks)


def _pump_stdout(proc: subprocess.Popen, run: _Run, on_done: Callable[[int], None]) -> None:
    """Chunk progress is printed as ``[N]ppl,`` with no newline until the end: read raw bytes."""
    assert proc.stdout is not None
    while True:
        data = proc.stdout.read1(4096)  # type: ignore[attr-defined]
        if not data:
            break
        run.stdout += data.decode("utf-8", "replace")
        done = [int(n) for n in _DONE_RE.findall(run.stdout[-8192:])]
        if done and max(done) > run.done_chunks:
            run.done_chunks = max(done)
            on_done(run.done_chunks)
    m = _PPL_RE.search(run.stdout)  # absent when llama-imatrix finds a negative variance
    try:
        run.perplexity = float(m.group(1)) if m else None
    except ValueError:
        run.perplexity = None


def _run_llama_imatrix(cmd: list[str], progress: bool, requested: int | None) -> _Run:
    """Run ``cmd`` with a tqdm bar over chunks; the process never outlives this call."""
    from ..progress import bar as progress_bar

    run = _Run()
    bar = progress_bar(requested, "llama-imatrix", "chunk", enabled=progress)

    def on_total(n: int) -> None:
        bar.total = n
        bar.refresh()

    def on_done(n: int) -> None:
        bar.update(n - bar.n)

    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=die_with_parent)
    pumps = [threading.Thread(target=_pump_stderr, args=(proc, run, on_total), daemon=True),
             threading.Thread(target=_pump_stdout, args=(proc, run, on_done), daemon=True)]
    try:
        for t in pumps:
            t.start()
        run.rc = proc.wait()
        for t in pumps:
            t.join()
    finally:
        stop_process(proc)
        bar.close()
    return run


_SHORT_RE = re.compile(r"you need at least (\d+) tokens.*?tokenizes to only (\d+) tokens", re.S)


def _failure(run: _Run, model: Path, corpus: Corpus, ctx_size: int) -> Exception:
    """llama-imatrix's failure as one clear error (the corpus's fault where it is)."""
    text = "\n".join(run.stderr)
    m = _SHORT_RE.search(text)
    if m:
        return CorpusError(f"corpus file {corpus.path} is too short for --ctx-size {ctx_size}: it tokenizes to "
                           f"{m.group(2)} tokens, llama-imatrix needs at least {m.group(1)} (two chunks)")
    errors = [ln for ln in run.stderr if " E " in ln or "error" in ln.lower() or "failed" in ln.lower()]
    if not errors and run.total_chunks is None and run.rc > 0:
        # llama.cpp logs from a thread that a quick exit can cut off (common/log.cpp leaks the
        # logger on purpose), so the "you need at least N tokens" line is sometimes lost
        return ImatrixError(f"llama-imatrix failed on {model} ({describe_exit(run.rc)}) before computing any chunk "
                            f"and its log was cut short; corpus file {corpus.path} may be too short: it needs at "
                            f"least {min_tokens_for(ctx_size)} tokens for --ctx-size {ctx_size}")
    detail = "; ".join(ln.split(" E ", 1)[-1].strip() for ln in errors[-3:]) or text[-300:].strip()
    return ImatrixError(f"llama-imatrix failed on {model} ({describe_exit(run.rc)}): {detail}")


def runtime_commit(binary: Path) -> str:
    """The llama.cpp commit ``binary`` was built from (the ggufmtp runtime record, else --version)."""
    info = binary_is_ggufmtp_build(binary)
    if info is not None:
        return info.commit
    return binary_version(binary).get("commit") or "unknown"


# ------------------------------------------------------------------------------------------------
# merging and writing
# ------------------------------------------------------------------------------------------------


def merge_entries(base: Imatrix, extra: Imatrix) -> Imatrix:
    """``base`` with ``extra``'s entries added, in llama-imatrix's name order. An entry in both is
    refused: the MTP collector and llama-imatrix never see the same weights."""
    both = sorted(set(base.entries) & set(extra.entries))
    if both:
        raise ImatrixError(f"cannot merge imatrices: both hold {len(both)} entries, e.g. {both[0]!r}")
    if extra.entries and any(e.kind != base.format for e in extra.entries.values()):
        raise ImatrixError(f"cannot merge a {next(iter(extra.entries.values())).kind} imatrix into a {base.format} one")
    merged = dict(sorted({**base.entries, **extra.entries}.items(), key=lambda kv: name_order(kv[0])))
    return dataclasses.replace(base, entries=merged, path=None, sha256=None)


def _with_provenance(im: Imatrix, corpus: Corpus, prov: ImatrixProvenance) -> Imatrix:
    kv = prov.to_kv()
    extra = {k: v for k, v in im.gguf_extra_kv.items() if not k.startswith(KEY_PREFIX)}
    order = [k for k in (im.gguf_kv_order or list(STANDARD_KEYS)) if not k.startswith(KEY_PREFIX)]
    return dataclasses.replace(im, datasets=[corpus.name], gguf_extra_kv={**extra, **kv},
                               gguf_kv_order=order + list(kv), path=None, sha256=None)


def _settings(chunks: int | None, ctx_size: int, gpu_layers: int | str | None, threads: int | None) -> ImatrixSettings:
    """The settings, a bad one named as the command line's option (``--ctx-size``, not ``ctx_size``)."""
    try:
        return ImatrixSettings(chunks, ctx_size, gpu_layers, threads)
    except ImatrixError as e:
        name, rest = str(e).split(" ", 1)
        raise ImatrixError(f"--{name.replace('_', '-')} {rest}") from None


def _check_output(out: Path) -> None:
    if not out.parent.is_dir():  # like write_imatrix: never creates folders
        raise ImatrixError(f"cannot write imatrix file {out}: folder {out.parent} does not exist")
    if out.is_dir():
        raise ImatrixError(f"cannot write imatrix file {out}: it is a directory")
    try:  # a read-only folder is found now, not after the whole computation
        with tempfile.NamedTemporaryFile(prefix=_TEMP_PREFIX, dir=out.parent):
            pass
    except OSError as e:
        raise ImatrixError(f"cannot write imatrix file {out}: {e.strerror or e}") from None


def _one_pass(model: Path, corpus: Corpus, s: ImatrixSettings, progress: bool) -> Imatrix:
    """The trunk's statistics and the MTP block's from one model load and one run of the trunk: the
    collector (:mod:`ggufmtp.imatrix.mtp`) in ``CollectMode.BOTH``, whose trunk entries are
    llama-imatrix's (``tests/test_imatrix_mtp.py``) and whose head entries are the head-only run's."""
    from .mtp import collect_mtp_statistics

    return collect_mtp_statistics(model, corpus, s, mode=CollectMode.BOTH, progress=progress)


def _trunk_imatrix(binary: Path, model: Path, corpus: Corpus, s: ImatrixSettings, work: Path,
                   progress: bool) -> tuple[Imatrix, _Run]:
    tmp_out = work / "imatrix.gguf"
    cmd = llama_imatrix_command(binary, model, corpus.path, tmp_out, s)
    run = _run_llama_imatrix(cmd, progress, s.chunks)
    if run.rc != 0 or not tmp_out.is_file():
        raise _failure(run, model, corpus, s.ctx_size)
    return read_imatrix(tmp_out), run


@dataclasses.dataclass(frozen=True)
class _Outcome:
    im: Imatrix
    run: _Run | None  # llama-imatrix's, when it ran (the trunk-only imatrix)
    llama_s: float
    mtp_s: float
    mtp_entries: int


def _compute(binary: Path, model: Path, corpus: Corpus, s: ImatrixSettings, mtp: bool, work: Path,
             progress: bool) -> _Outcome:
    """``mtp``: one pass of the collector (trunk and head); else llama-imatrix itself."""
    t0 = time.monotonic()
    if mtp:
        im = _one_pass(model, corpus, s, progress)
        heads = tuple(f"blk.{b}." for b in GGUFModel(model).mtp_blocks)
        n_mtp = sum(1 for n in im.entries if n.startswith(heads))
        return _Outcome(im, None, 0.0, time.monotonic() - t0, n_mtp)
    im, run = _trunk_imatrix(binary, model, corpus, s, work, progress)
    return _Outcome(im, run, time.monotonic() - t0, 0.0, 0)


def compute_imatrix(model: str | os.PathLike, corpus: str | os.PathLike | Corpus, out: str | os.PathLike, *,
                    chunks: int | None = None, ctx_size: int = DEFAULT_CHUNK_SIZE, gpu_layers: int | str | None = None,
                    threads: int | None = None, mtp: bool = False, progress: bool = True,
                    binary: str | os.PathLike | None = None) -> ComputeResult:
    """Compute the imatrix of ``model`` over ``corpus`` (a path, ``builtin:NAME`` or a Corpus) and
    write it to ``out`` (GGUF) atomically. ``chunks``: at most this many chunks of ``ctx_size``
    tokens (default: the whole corpus). ``mtp``: also the MTP block's statistics, in the same file
    and the same pass: the collector of :mod:`ggufmtp.imatrix.mtp` loads the model once and gives
    the trunk's entries (llama-imatrix's) and the head's from the same forward passes."""
    model, out = Path(model), Path(out)
    if not model.is_file():
        raise ImatrixError(f"model file {model} does not exist" if not model.exists()
                           else f"model {model} is not a regular file")
    s = _settings(chunks, ctx_size, gpu_layers, threads)
    _check_output(out)
    corp = corpus if isinstance(corpus, Corpus) else resolve_corpus(corpus)
    check_corpus_text(corp, min_tokens=min_tokens_for(ctx_size))
    exe = find_binary("llama-imatrix", binary)
    work = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX))  # llama-imatrix's own periodic saves land here
    try:
        got = _compute(exe, model, corp, s, mtp, work, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    done = got.im.chunk_count
    prov = ImatrixProvenance(corp.name, corp.sha256, corp.bytes, done, ctx_size, runtime_commit(exe), mtp,
                             got.mtp_entries)
    final = _with_provenance(got.im, corp, prov)
    digest = write_imatrix(final, out)
    return ComputeResult(out, digest, model, len(final.entries), prov, got.run.perplexity if got.run else None,
                         got.llama_s, got.mtp_s, tuple(_notes(chunks, done)))


def _notes(requested: int | None, done: int | None) -> Iterator[str]:
    if requested is not None and done is not None and done < requested:
        yield f"the corpus holds only {done} chunks; {requested} were asked for (all {done} were used)"


# ------------------------------------------------------------------------------------------------
# `ggufmtp run --imatrix-corpus`
# ------------------------------------------------------------------------------------------------

RUN_IMATRIX_NAME = "imatrix.gguf"


@dataclasses.dataclass(frozen=True)
class RunImatrix:
    """The imatrix a pipeline run computes: over ``corpus``, with the MTP block's statistics when
    the model has one, into ``out``. :meth:`key` is what the result depends on besides the model and
    the runtime (which the pipeline's key already holds): the corpus's content, not its name."""

    corpus: Corpus
    out: Path
    chunks: int | None
    ctx_size: int
    mtp: bool

    def key(self) -> dict[str, Any]:
        return {"corpus_sha256": self.corpus.sha256, "chunks": self.chunks, "ctx_size": self.ctx_size, "mtp": self.mtp}

    def compute(self, model: Path, *, threads: int | None, gpu_layers: int | str | None, progress: bool) -> dict[str, Any]:
        """Compute it; the stage record: ``{"imatrix": {"path", "sha256"}, "result": ComputeResult}``."""
        res = compute_imatrix(model, self.corpus, self.out, chunks=self.chunks, ctx_size=self.ctx_size,
                              gpu_layers=gpu_layers, threads=threads, mtp=self.mtp, progress=progress)
        return {"imatrix": {"path": str(res.path), "sha256": res.sha256}, "result": res.to_dict()}


def imatrix_for_run(model: Path, corpus_ref: str | os.PathLike, out_dir: Path, *, chunks: int | None = None,
                    ctx_size: int = DEFAULT_CHUNK_SIZE) -> RunImatrix:
    """What ``ggufmtp run --imatrix-corpus`` computes for ``model`` (the corpus is resolved and
    checked here, before any work)."""
    from .check import read_model_tensors

    corpus = resolve_corpus(corpus_ref)
    check_corpus_text(corpus, min_tokens=min_tokens_for(ctx_size))
    has_mtp = bool(read_model_tensors(model).mtp_blocks)
    return RunImatrix(corpus, out_dir / RUN_IMATRIX_NAME, chunks, ctx_size, has_mtp)
