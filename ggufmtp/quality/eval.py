"""``ggufmtp eval``: perplexity and KL-divergence of a quantized model against its base (BF16).

:func:`evaluate` checks first, then runs: the two models must be one model (architecture and
vocabulary from the GGUF headers), the corpus must make at least two chunks with the base's
tokenizer, and the base logits must fit on the disk (their exact size is said before writing). The
base pass (``llama-perplexity --kl-divergence-base``) runs once per (base sha256, corpus sha256,
context, chunks, llama.cpp commit) and is cached under ``cache_root()/kld``; a cached file is
size-checked against its own header before use. The quant pass (``--kl-divergence``) then gives
PPL(Q), PPL(base), ln(PPL(Q)/PPL(base)), mean KLD ± its uncertainty, KLD percentiles, RMS Δp and
Same top p (fractions here, percent in llama.cpp's printout).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import QualityError
from ..files.digest_cache import DigestCache
from ..files.fsutil import atomic_write_json
from ..files.hashing import sha256_cached
from ..imatrix.corpus import Corpus, check_corpus_text, min_tokens_for, resolve_corpus
from ..jsontypes import JsonObject
from ..progress import bar as progress_bar
from ..runtime.build import binary_version, cache_root, find_binary
from .logits import CacheKey, LogitsHeader, cached_paths, check_logits_file, logits_file_bytes, refuse_without_room, tokens_memo
from .models import count_tokens, model_identity, refuse_different_models
from .options import EvalOptions
from .perplexity import KLDStats, chunk_kld_means, parse_base_ppl, parse_kld_output, perplexity_argv, run_perplexity

# the public functions (tests/test_public_api.py holds them to at most ten parameters each)
__all__ = ["BaseLogits", "QualityResult", "base_logits", "evaluate", "format_quality"]


@dataclasses.dataclass(frozen=True)
class BaseLogits:
    """The base pass: where its logits are, whether they came from the cache, and what it cost."""

    path: Path
    header: LogitsHeader
    bytes: int
    cached: bool
    seconds: float
    ppl: float | None
    base_sha256: str


@dataclasses.dataclass(frozen=True)
class QualityResult:
    """What ``eval`` measured (``to_dict`` is the JSON and the receipt's ``quality`` section)."""

    base: Path
    quant: Path
    corpus: Corpus
    ctx_size: int
    chunks: int
    n_tokens: int
    commit: str | None
    stats: KLDStats
    base_logits: BaseLogits
    quant_seconds: float
    quant_sha256: str | None = None
    chunk_kld: tuple[float, ...] = ()  # each chunk's mean KLD (perplexity.chunk_kld_means; not in to_dict)

    def to_dict(self, *, names: bool = False) -> JsonObject:
        """The result as JSON; ``names``: every file by its name alone, as a receipt holds it (files
        beside the artifact, never a local path, relative ones included)."""
        file = _file_name if names else str
        corpus = self.corpus.to_dict()
        return {**dataclasses.asdict(self.stats), "corpus": {**corpus, "path": file(corpus["path"])},
                "ctx_size": self.ctx_size, "chunks": self.chunks, "n_tokens": self.n_tokens, "commit": self.commit,
                "tool": "llama-perplexity --kl-divergence",
                "base": {"path": file(self.base), "sha256": self.base_logits.base_sha256},
                "quant": {"path": file(self.quant), "sha256": self.quant_sha256},
                "base_logits": {"bytes": self.base_logits.bytes, "cached": self.base_logits.cached,
                                "seconds": round(self.base_logits.seconds, 3)},
                "seconds": round(self.base_logits.seconds + self.quant_seconds, 3)}


def _file_name(path: str | Path) -> str:
    return Path(path).name


def _bar(total: int, desc: str, enabled: bool) -> Any:
    return progress_bar(total, desc, "chunk", enabled=enabled)


def _tokens_key(base_sha: str | None, corpus: Corpus, commit: str | None) -> str | None:
    return f"{base_sha}:{corpus.sha256}:{commit}" if base_sha and commit else None


def _corpus_tokens(corpus: Corpus, base: Path, commit: str | None) -> int:
    """Tokens the corpus makes with the base's tokenizer. Counting loads libllama and the base's
    vocabulary (with a CUDA build, a device initialization: about a second), so :func:`evaluate`
    keeps the count in ``tokens.json`` of the logits cache, keyed by the base's and the corpus's
    sha256 and the llama.cpp commit; it is looked up only for a base whose digest ggufmtp already
    knows (the base is never hashed for this: a corpus too short is an error before any hashing)."""
    text = check_corpus_text(corpus)
    key = _tokens_key(DigestCache.under(cache_root()).lookup(base), corpus, commit)
    known = tokens_memo().get(key) if key else None
    if isinstance(known, int) and known >= 0:
        return known
    return count_tokens(base, text)


def _remember_tokens(key: str | None, n_tokens: int) -> None:
    memo = tokens_memo()
    if key and memo.get(key) != n_tokens:
        memo.put(key, n_tokens)


def _plan_chunks(corpus: Corpus, base: Path, ctx_size: int, chunks: int | None, commit: str | None
                 ) -> tuple[int, int]:
    """(tokens, chunks to run): CorpusError when the corpus makes fewer than two chunks."""
    n_tokens = _corpus_tokens(corpus, base, commit)
    check_corpus_text(corpus, min_tokens=min_tokens_for(ctx_size), n_tokens=n_tokens)
    available = n_tokens // ctx_size
    return n_tokens, min(chunks, available) if chunks and chunks > 0 else available


def base_logits(base: Path, corpus: Corpus, n_chunk: int, n_vocab: int, options: EvalOptions, *,
                commit: str | None = None, progress: bool = True, log: Callable[[str], None] = lambda m: None
                ) -> BaseLogits:
    """The base pass over ``n_chunk`` chunks (``evaluate`` plans them from ``options.chunks`` and the
    corpus) with ``options``' context size and llama-perplexity settings, from the cache when an
    intact file for the same inputs is there."""
    ctx_size = options.ctx_size
    base_sha = _sha256(base, progress)
    key = CacheKey(base_sha, corpus.sha256, ctx_size, n_chunk, commit or "unknown")
    path, record = cached_paths(key)
    if path.is_file() and record.is_file():
        head = check_logits_file(path, n_vocab)  # a truncated cache file is an error, never silently reused
        log(f"base logits: cached {path} ({path.stat().st_size / 2**30:.2f} GiB)")
        return BaseLogits(path, head, path.stat().st_size, True, 0.0, _cached_ppl(record), base_sha)
    need = logits_file_bytes(ctx_size, n_vocab, n_chunk)
    log(f"base logits: {n_chunk} chunks x {ctx_size} tokens x {n_vocab} vocabulary -> {need:,} bytes "
        f"({need / 2**30:.2f} GiB) in {path}")
    refuse_without_room(path.parent, need)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    argv = perplexity_argv(base, corpus.path, ctx_size, n_chunk, options.gpu_layers, options.threads,
                           ["--kl-divergence-base", str(partial)], options.llama_cpp_bin)
    try:
        with _bar(n_chunk, "base logits", progress) as bar:
            run = run_perplexity(argv, path.with_suffix(".base.log"), lambda d: bar.update(d - bar.n), True)
        head = check_logits_file(partial, n_vocab)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    ppl, _ = parse_base_ppl(run.output)
    atomic_write_json(record, {"key": dataclasses.asdict(key), "bytes": need, "n_chunk": head.n_chunk,
                               "ppl": ppl, "seconds": run.seconds, "argv": run.argv})
    return BaseLogits(path, head, need, False, run.seconds, ppl, base_sha)


def _cached_ppl(record: Path) -> float | None:
    import json

    try:
        return json.loads(record.read_text()).get("ppl")
    except (OSError, ValueError):
        return None


def _sha256(path: Path, progress: bool) -> str:
    """The file's sha256 through ggufmtp's digest cache (dev, inode, size, mtime, ctime): a base that
    quantize, pull or an earlier eval hashed is not read again (tens of GB for a real BF16 model)."""
    return sha256_cached(path, DigestCache.under(cache_root()), progress=progress)[0]


def _kld_stats(argv: list[str], bl: Any, quant: Path, progress: bool, attempts: int = 6
               ) -> tuple[KLDStats, tuple[float, ...]]:
    """Run the quant's KL-divergence pass and parse its statistics. A run that exits 0 without them
    is run again, up to ``attempts`` runs: llama.cpp's logger (common/log.cpp) is a leaked singleton
    whose worker thread is never flushed at exit (upstream issue 22142), so on a loaded machine the
    final lines can be lost (CI on 2 busy cores once lost them twice in a row, later three times:
    since then the two statistics printed last are also read from the per-chunk table's last row,
    see :func:`~ggufmtp.quality.perplexity.parse_kld_output`). Measured 2026-11-28 on a 2-core machine,
    a 2-chunk run of a tiny model: 0 of 41 runs lost the block alone, 5 of 31 beside two busy loops
    (``--poll 0`` made it worse); a clean-clone CI run lost it three times in a row, so up to six runs.
    With the statistics, each chunk's mean KLD."""
    for attempt in range(1, attempts + 1):
        with _bar(bl.header.n_chunk, "KL-divergence", progress) as bar:
            run = run_perplexity(argv, bl.path.with_name(f"{bl.path.stem}.{quant.name}.kld.log"),
                                 lambda d: bar.update(d - bar.n), False)
        try:
            return parse_kld_output(run.output, str(quant)), chunk_kld_means(run.output)
        except QualityError:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def evaluate(base: str | Path, quant: str | Path, options: EvalOptions | None = None, *, progress: bool = True,
             log: Callable[[str], None] = lambda m: None, hash_quant: bool = True) -> QualityResult:
    """KL-divergence of ``quant`` against ``base`` with ``options`` (an :class:`EvalOptions`: the
    corpus, a path or ``builtin:NAME``, the context, the chunks, llama-perplexity's settings;
    default: ``ggufmtp eval``'s). ``hash_quant``: record the quant's sha256 in the result.

    Raises ModelMismatchError (different architecture or vocabulary), CorpusError (fewer than two
    chunks of ``ctx_size`` tokens), LogitsFileError (no room, or a truncated cached file) before any
    llama-perplexity process starts, QualityError when llama-perplexity fails."""
    o = options if options is not None else EvalOptions()
    base, quant = Path(base), Path(quant)
    ident = model_identity(base)
    refuse_different_models(ident, model_identity(quant))
    corp = resolve_corpus(o.corpus)
    commit = binary_version(find_binary("llama-perplexity", o.llama_cpp_bin)).get("commit")
    n_tokens, n_chunk = _plan_chunks(corp, base, o.ctx_size, o.chunks, commit)
    bl = base_logits(base, corp, n_chunk, ident.n_vocab, o, commit=commit, progress=progress, log=log)
    _remember_tokens(_tokens_key(bl.base_sha256, corp, commit), n_tokens)
    argv = perplexity_argv(quant, corp.path, o.ctx_size, None, o.gpu_layers, o.threads,
                           ["--kl-divergence-base", str(bl.path), "--kl-divergence"], o.llama_cpp_bin)
    t0 = time.perf_counter()
    stats, chunk_kld = _kld_stats(argv, bl, quant, progress)
    return QualityResult(base=base, quant=quant, corpus=corp, ctx_size=o.ctx_size, chunks=bl.header.n_chunk,
                         n_tokens=n_tokens, commit=commit, stats=stats, base_logits=bl,
                         quant_seconds=time.perf_counter() - t0,
                         quant_sha256=_sha256(quant, False) if hash_quant else None, chunk_kld=chunk_kld)


def format_quality(r: QualityResult) -> str:
    """The result for people: one line per figure."""
    s = r.stats

    def pm(x: float | None, e: float | None, scale: float = 1.0, nd: int = 6, unit: str = "") -> str:
        if x is None:
            return "n/a"
        return f"{x * scale:.{nd}f}" + (f" ± {e * scale:.{nd}f}" if e is not None else "") + unit

    rows = [("PPL(Q)", pm(s.ppl, s.ppl_err, nd=4)), ("PPL(base)", pm(s.ppl_base, s.ppl_base_err, nd=4)),
            ("ln(PPL(Q)/PPL(base))", pm(s.ln_ppl_ratio, s.ln_ppl_ratio_err)),
            ("mean KLD", pm(s.kld_mean, s.kld_mean_err)),
            ("KLD 99.9% / 99% / 95% / median", " / ".join(pm(x, None) for x in
                                                        (s.kld_p99_9, s.kld_p99, s.kld_p95, s.kld_median))),
            ("RMS Δp", pm(s.rms_dp, s.rms_dp_err, 100, 3, " %")),
            ("Same top p", pm(s.same_top_p, s.same_top_p_err, 100, 3, " %")),
            ("corpus", f"{r.corpus.name} ({r.n_tokens} tokens), {r.chunks} chunks of {r.ctx_size}"),
            ("base logits", f"{r.base_logits.bytes:,} bytes, " + ("cached" if r.base_logits.cached else
                                                                 f"computed in {r.base_logits.seconds:.1f} s")),
            ("llama.cpp", r.commit or "unknown")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
