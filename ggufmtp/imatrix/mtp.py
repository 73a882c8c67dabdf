"""Importance statistics for the MTP (NextN) block, collected by the pinned llama.cpp itself.

``llama-imatrix`` never runs the MTP graph, so its files have no ``blk.<mtp>.*`` entries.
``collect_mtp_statistics`` runs ggufmtp's own C++ tool ``ggufmtp-mtp-imatrix`` (source
``ggufmtp/runtime/native/mtp_imatrix.cpp``, compiled by the runtime build against the same
llama.cpp commit): it runs the trunk over the corpus exactly as llama-imatrix does (tokens, chunks
of ``ctx_size``, BOS), feeds an MTP context the (hidden state h_p, next token x_{p+1}) pairs the
way llama-server's draft-mtp does (the first token of a chunk with a zero state), and keeps, for
every matrix of the MTP block (per expert for ``_exps``), the sums of squared activations and
token counts llama-imatrix keeps. The result is an :class:`~ggufmtp.imatrix.entries.Imatrix`
whose entries can be merged into a llama-imatrix file unchanged.

``mode=CollectMode.TRUNK`` runs the same collector on the trunk's layers instead: its numbers equal
llama-imatrix's (tests/test_imatrix_mtp.py checks it), the proof that collection, chunking and
counts are llama-imatrix's. ``CollectMode.BOTH`` collects both in one pass (trunk entries from the
trunk context, the MTP block from the MTP context): the whole imatrix, with the trunk run once
instead of once by llama-imatrix and once more for the head. ``dump_hidden`` also writes the trunk hidden states and
tokens (GGUF: ``tokens`` I32 [N], ``hidden`` F32 [n_embd, N], chunk-major) for an independent check.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
from pathlib import Path

from ..errors import CorpusError, ImatrixError
from ..files.fsutil import not_a_regular_file
from ..runtime.build import MTP_IMATRIX_TOOL, find_binary
from ..runtime.process import describe_exit, die_with_parent, stop_process
from .corpus import Corpus, check_corpus_text, min_tokens_for, resolve_corpus
from .entries import Imatrix
from .format import read_imatrix
from .settings import CollectMode, ImatrixSettings

__all__ = ["MTP_IMATRIX_TOOL", "CollectMode", "ImatrixSettings", "collect_mtp_statistics", "mtp_imatrix_command"]

# Exit codes of the tool (enum exit_code in mtp_imatrix.cpp).
_EXIT_BAD_CORPUS = 2
_EXIT_NO_MTP = 3

# Searched, not matched at the line's start: a log line of llama.cpp's logger thread may precede ours.
_PROGRESS_RE = re.compile(rf"{re.escape(MTP_IMATRIX_TOOL)}: chunk (\d+)/(\d+)$")
_ERROR_PREFIX = f"{MTP_IMATRIX_TOOL}: error: "
_TAIL_LINES = 40


def llama_imatrix_command(binary: Path, model: Path, corpus: Path, out: Path, settings: ImatrixSettings) -> list[str]:
    """The ``llama-imatrix`` command line (the MTP tool takes the same options). ``--no-repack``: the
    CPU AMX repack path crashes on these VMs for quantized models (llama-cpp-facts.md), and
    repacking changes nothing that is collected."""
    s = settings
    cmd = [str(binary), "-m", str(model), "-f", str(corpus), "-o", str(out), "-c", str(s.ctx_size), "--no-repack"]
    if s.chunks is not None:
        cmd += ["--chunks", str(s.chunks)]
    if s.gpu_layers is not None:
        cmd += ["-ngl", str(s.gpu_layers)]
    if s.threads is not None:
        cmd += ["-t", str(s.threads)]
    return cmd


_MODE_FLAGS: dict[CollectMode, tuple[str, ...]] = {CollectMode.HEAD: (), CollectMode.TRUNK: ("--trunk",),
                                                   CollectMode.BOTH: ("--with-trunk",)}


def mtp_imatrix_command(binary: Path, model: Path, corpus: Path, out: Path, settings: ImatrixSettings, *,
                        mode: CollectMode = CollectMode.HEAD, dump_hidden: Path | None = None) -> list[str]:
    """The tool's command line: llama-imatrix's options plus its own ``--trunk`` / ``--with-trunk``
    (from ``mode``) and ``--dump-hidden``."""
    cmd = [*llama_imatrix_command(binary, model, corpus, out, settings), *_MODE_FLAGS[CollectMode(mode)]]
    if dump_hidden is not None:
        cmd += ["--dump-hidden", str(dump_hidden)]
    return cmd


@dataclasses.dataclass
class _ToolRun:
    """What one tool process printed: exit status, chunk progress, its error line and a log tail."""

    rc: int = 0
    done: int = 0
    total: int | None = None
    error: str | None = None
    tail: list[str] = dataclasses.field(default_factory=list)


def _pump(proc: subprocess.Popen, run: _ToolRun, bar) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        run.tail = (run.tail + [line])[-_TAIL_LINES:]
        m = _PROGRESS_RE.search(line)
        if m:
            run.done, run.total = int(m.group(1)), int(m.group(2))
            if bar.total != run.total:
                bar.total = run.total
            bar.update(run.done - bar.n)
        elif _ERROR_PREFIX in line:
            run.error = line[line.index(_ERROR_PREFIX) + len(_ERROR_PREFIX):]


def _run_tool(cmd: list[str], progress: bool, chunks: int | None, desc: str) -> _ToolRun:
    """Run the tool with a tqdm bar over chunks; the process never outlives this call (errors, Ctrl-C)."""
    from ..progress import bar as progress_bar

    run = _ToolRun()
    bar = progress_bar(chunks, desc, "chunk", enabled=progress)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
    try:
        _pump(proc, run, bar)
        run.rc = proc.wait()
    finally:
        stop_process(proc)
        bar.close()
    return run


def _failure(run: _ToolRun, model: Path, corpus: Corpus) -> Exception:
    """The tool's failure as one clear error (the corpus's fault where it is)."""
    if run.rc == _EXIT_BAD_CORPUS:
        detail = _without_prefix(run.error, corpus.path) or "unusable for the MTP collector"
        return CorpusError(f"corpus file {corpus.path}: {detail}")
    if run.rc == _EXIT_NO_MTP:
        return ImatrixError(f"model {model}: {_without_prefix(run.error, model) or 'no MTP block'}; "
                            f"there is nothing for the MTP collector to do")
    detail = run.error or "; ".join(ln.strip() for ln in run.tail[-3:]) or "no output"
    return ImatrixError(f"{MTP_IMATRIX_TOOL} failed on {model} ({describe_exit(run.rc)}): {detail}")


def _without_prefix(message: str | None, path: Path) -> str | None:
    """The tool's message without the ``PATH: `` it starts with (the Python error names the file)."""
    if message is None:
        return None
    return message.removeprefix(f"{path}: ")


def _as_corpus(corpus: str | os.PathLike | Corpus) -> Corpus:
    return corpus if isinstance(corpus, Corpus) else resolve_corpus(corpus)


def collect_mtp_statistics(model: str | os.PathLike, corpus: str | os.PathLike | Corpus,
                           settings: ImatrixSettings | None = None, *, mode: CollectMode = CollectMode.HEAD,
                           progress: bool = False, dump_hidden: str | os.PathLike | None = None,
                           binary: str | os.PathLike | None = None) -> Imatrix:
    """Statistics for every matrix of the MTP block of ``model`` over ``corpus`` (a path,
    ``builtin:NAME`` or a resolved :class:`Corpus`), as a GGUF-kind :class:`Imatrix`
    (``chunk_size = ctx_size``, ``chunk_count`` = chunks processed, ``datasets`` = the corpus path).

    ``settings``: chunks, context size, GPU layers, threads (None: llama-imatrix's defaults over the
    whole corpus). ``mode``: :class:`CollectMode` (``TRUNK``: the trunk layers instead, the proof
    mode; ``BOTH``: the trunk layers and the MTP block in one pass, llama-imatrix's file plus the
    head's entries). ``binary``: the tool, a directory holding it, or None for the built runtime's
    (compiled on first use). Raises CorpusError for an unusable corpus, ImatrixError for a model
    without an MTP block or a failed run.
    """
    s = settings if settings is not None else ImatrixSettings()
    mode = CollectMode(mode)
    model = Path(model)
    problem = not_a_regular_file(model)
    if problem is not None:
        raise ImatrixError(f"model {model}: {problem}")
    corp = _as_corpus(corpus)
    check_corpus_text(corp, min_tokens=min_tokens_for(s.ctx_size))
    exe = find_binary(MTP_IMATRIX_TOOL, binary)
    with tempfile.TemporaryDirectory(prefix="ggufmtp-mtp-imatrix-") as work:
        out = Path(work) / "mtp-imatrix.gguf"
        cmd = mtp_imatrix_command(exe, model, corp.path, out, s, mode=mode,
                                  dump_hidden=Path(dump_hidden) if dump_hidden is not None else None)
        run = _run_tool(cmd, progress, s.chunks, "trunk imatrix" if mode is CollectMode.TRUNK else "MTP imatrix")
        if run.rc != 0 or not out.is_file():
            raise _failure(run, model, corp)
        im = read_imatrix(out)
    return dataclasses.replace(im, path=None, sha256=None)
