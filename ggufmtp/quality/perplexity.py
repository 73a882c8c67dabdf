"""Running ``llama-perplexity`` (the pinned one) and reading what it prints.

Two modes are used: ``--kl-divergence-base FILE`` on the base model (writes the base logits and
prints ``[i]ppl,`` per chunk and ``Final estimate: PPL = x +/- y``) and ``--kl-divergence`` on the
quantized model (prints one row per chunk, then the "Perplexity statistics", "KL divergence
statistics" and "Token probability statistics" blocks parsed here). The process's output drives a
progress bar over chunks; its whole log is kept next to the cache for error messages.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import CorpusError, QualityError
from ..runtime.build import find_binary
from ..runtime.process import describe_exit, die_with_parent

_NUM = r"(-?(?:nan|inf|[0-9.]+(?:e[-+]?\d+)?))"
_BASE_CHUNK = re.compile(r"\[(\d+)\]" + _NUM + ",", re.I)
_KLD_CHUNK = re.compile(r"^\s*(\d+)\s+" + _NUM + r"\s+±", re.M | re.I)
_SHORT = re.compile(r"tokenizes to only (\d+) tokens")
_NEED = re.compile(r"you need at least (\d+) tokens")


_LABELS = {
    "ppl": "Mean PPL(Q)", "ppl_base": "Mean PPL(base)", "ln_ppl_ratio": "Mean ln(PPL(Q)/PPL(base))",
    "ppl_ratio": "Mean PPL(Q)/PPL(base)", "kld_mean": "Mean    KLD", "kld_max": "Maximum KLD",
    "kld_p99_9": "99.9%   KLD", "kld_p99": "99.0%   KLD", "kld_p95": "95.0%   KLD", "kld_p90": "90.0%   KLD",
    "kld_median": "Median  KLD", "rms_dp": "RMS Δp", "same_top_p": "Same top p",
}
_STATS = {key: re.compile(re.escape(label) + r"\s*:\s*" + _NUM + r"(?:\s*±\s*" + _NUM + ")?", re.I)
          for key, label in _LABELS.items()}
_PERCENT = {"rms_dp", "same_top_p"}  # printed in %; stored as fractions
_PM = _NUM + r"\s*±\s*" + _NUM
#: A row of the per-chunk table: chunk, PPL, ln ratio, KLD, Δp RMS %, Same top p % (running values)
_KLD_ROW = re.compile(r"^\s*(\d+)\s+" + r"\s+".join([_PM] * 3) + r"\s+" + _PM + r"\s*%\s+" + _PM + r"\s*%\s*$",
                      re.M | re.I)
#: The two statistics printed last, which the last table row also carries (same formula, same 3
#: decimals): llama.cpp's logger can lose a process's final lines at exit (upstream 22142)
_FROM_LAST_ROW = {"rms_dp": (8, 9), "same_top_p": (10, 11)}  # groups after chunk, PPL, ln ratio, KLD
_FINAL = re.compile(r"Final estimate: PPL = " + _NUM + r" \+/- " + _NUM, re.I)


def _f(text: str | None) -> float | None:
    if text is None:
        return None
    x = float(text)
    return x if math.isfinite(x) else None


@dataclasses.dataclass(frozen=True)
class KLDStats:
    """The statistics ``llama-perplexity --kl-divergence`` prints (fractions, not percent)."""

    ppl: float | None
    ppl_err: float | None
    ppl_base: float | None
    ppl_base_err: float | None
    ln_ppl_ratio: float | None
    ln_ppl_ratio_err: float | None
    kld_mean: float | None
    kld_mean_err: float | None
    kld_max: float | None
    kld_p99_9: float | None
    kld_p99: float | None
    kld_p95: float | None
    kld_p90: float | None
    kld_median: float | None
    rms_dp: float | None
    rms_dp_err: float | None
    same_top_p: float | None
    same_top_p_err: float | None


def parse_kld_output(text: str, where: str) -> KLDStats:
    """The final statistics of a ``--kl-divergence`` run; QualityError when they are missing.
    RMS Δp and Same top p, printed last, come from the per-chunk table's last row when the
    logger lost them (the table is whole once the KLD percentiles after it were printed)."""
    values: dict[str, float | None] = {}
    rows = list(_KLD_ROW.finditer(text))
    for key, pat in _STATS.items():
        m = pat.search(text)
        if m is None and key in _FROM_LAST_ROW and rows and "kld_median" in values:
            m = _LastRow(rows[-1], _FROM_LAST_ROW[key])  # the table was complete: the block after it began
        if m is None:
            raise QualityError(f"{where}: llama-perplexity printed no '{_LABELS[key].split()[-1]}' statistic "
                               "(fewer than 100 scored tokens, or the run failed); see its log")
        scale = 0.01 if key in _PERCENT else 1.0
        val, err = _f(m.group(1)), _f(m.group(2))
        values[key] = None if val is None else val * scale
        values[key + "_err"] = None if err is None else err * scale
    fields = {f.name for f in dataclasses.fields(KLDStats)}
    return KLDStats(**{k: v for k, v in values.items() if k in fields})


def chunk_kld_means(text: str) -> tuple[float, ...]:
    """Each chunk's own mean KLD (the search pairs two costs by chunk), from the per-chunk table's
    running means: every chunk scores the same number of tokens, so chunk i's mean is
    ``i * r_i - (i - 1) * r_(i-1)``. The table prints 5 decimals, so chunk i's figure is within
    ``(i - 1/2) * 1e-5`` of the exact one (a rounding below zero reads 0). Empty when the table is not
    whole (rows missing or out of order)."""
    rows = [(int(m.group(1)), float(m.group(6))) for m in _KLD_ROW.finditer(text)]
    if [i for i, _ in rows] != list(range(1, len(rows) + 1)):
        return ()
    out, prev = [], 0.0
    for i, running in rows:
        out.append(max(0.0, i * running - (i - 1) * prev))
        prev = running
    return tuple(out)


class _LastRow:
    """Two groups of a table row, read like a statistic's match (value, uncertainty)."""

    def __init__(self, row: re.Match[str], groups: tuple[int, int]):
        self.row, self.groups = row, groups

    def group(self, i: int) -> str:
        return self.row.group(self.groups[i - 1])


def parse_base_ppl(text: str) -> tuple[float | None, float | None]:
    """(PPL, its uncertainty) of a base run's ``Final estimate`` line (None when absent)."""
    m = _FINAL.search(text)
    return (_f(m.group(1)), _f(m.group(2))) if m else (None, None)


@dataclasses.dataclass(frozen=True)
class PerplexityRun:
    """One finished llama-perplexity process."""

    argv: list[str]
    output: str
    seconds: float
    log: Path


def perplexity_argv(model: Path, corpus: Path, ctx_size: int, chunks: int | None, gpu_layers: int | str | None,
                    threads: int | None, mode: Sequence[str], llama_cpp_bin: str | os.PathLike | None = None) -> list[str]:
    """The llama-perplexity command. ``--no-repack``: the CPU AMX repack path crashes on quantized
    models on some VMs (and costs nothing elsewhere: it only concerns CPU weight buffers)."""
    argv = [str(find_binary("llama-perplexity", llama_cpp_bin)), "-m", str(model), "-f", str(corpus),
            "-c", str(ctx_size), "--no-repack", *mode]
    if chunks is not None and chunks > 0:
        argv += ["--chunks", str(chunks)]
    if gpu_layers is not None:
        argv += ["-ngl", str(gpu_layers)]
    if threads:
        argv += ["-t", str(threads)]
    return argv


def run_perplexity(argv: list[str], log: Path, on_chunk: Callable[[int], None], base_mode: bool) -> PerplexityRun:
    """Run llama-perplexity, calling ``on_chunk(done)`` as chunks finish; QualityError (CorpusError
    for a too-short corpus) when it fails. The process never outlives this call."""
    chunk_re = _BASE_CHUNK if base_mode else _KLD_CHUNK
    t0 = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    done = 0
    # Output goes to a file, read as it grows: through a pipe, llama-perplexity's last lines (the
    # final statistics) were lost at exit on this build.
    with open(log, "wb") as out, open(log, "rb") as tail:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=die_with_parent)
        try:
            window = ""
            while True:
                rc = proc.poll()
                window = (window + tail.read().decode("utf-8", "replace"))[-8192:]
                seen = [int(m.group(1)) for m in chunk_re.finditer(window)]
                if seen and max(seen) > done:
                    done = max(seen)
                    on_chunk(done)
                if rc is not None:
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):  # back at once when it exits
                    proc.wait(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text(errors="replace")
    _raise_for_failure(text, rc, argv, log)
    return PerplexityRun(argv, text, time.perf_counter() - t0, log)


def _raise_for_failure(text: str, rc: int, argv: list[str], log: Path) -> None:
    short = _SHORT.search(text)
    if short:
        need = _NEED.search(text)
        raise CorpusError(f"corpus file {argv[argv.index('-f') + 1]} is too short: it tokenizes to {short.group(1)} "
                          f"tokens, {need.group(1) if need else 'two chunks'} are needed for two chunks of "
                          f"{argv[argv.index('-c') + 1]} tokens")
    if rc != 0:
        raise QualityError(f"{argv[argv.index('-m') + 1]}: llama-perplexity failed ({describe_exit(rc)}); "
                           f"log: {log}")
    for bad in ("failed reading log-probs", "failed to decode", "inconsistent vocabulary",
                "failed reading evaluation tokens", "does not look like a file"):
        if bad in text:
            raise QualityError(f"{argv[argv.index('-m') + 1]}: llama-perplexity reported '{bad}'; log: {log}")
