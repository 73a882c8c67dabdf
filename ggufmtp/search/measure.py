"""Measure each candidate's cost (issue #43): one group at one type, every other tensor at the baseline.

For a candidate, the model is quantized with the baseline recipe (default ``Q8_0``: ggufmtp's
``Recipe.for_type``, the head's defaults included) plus ONE rule ahead of all of the recipe's, putting
the group at the type (:func:`~.groups.group_rule`), into a temporary folder that is always removed;
its KL divergence against the source model (the BF16 file) is measured on the held-out corpus with
``ggufmtp eval``'s path (:func:`ggufmtp.quality.eval.evaluate`: llama-perplexity ``--kl-divergence``
against base logits computed once and cached), with each chunk's own mean
(:func:`~ggufmtp.quality.perplexity.chunk_kld_means`) so two costs can be paired by chunk. For the
head's groups (and the trunk groups named in ``acceptance_groups``), with ``acceptance=True``, the
quantized file is also verified against the source as the reference (:func:`ggufmtp.verify` with
``reference``: the MTP arm and the reference arm in one rotation, paired by prompt and seed) and the
paired acceptance difference and its 95 % CI are kept (the worst mode's: the one whose interval
reaches lowest). That starts llama-servers, so it is off by default. The imatrix (with the head's
statistics: ``ggufmtp imatrix compute --mtp``) is used for every quantization when given. A candidate
the baseline already is (every tensor of its group planned at that type: Q8_0 under Q8_0) is not
quantized again: it gets the baseline's measurement.

Every measurement is cached by content in ``cache_root()/search/measurements.json`` (a
:class:`~ggufmtp.files.memo.JsonMemo`): the key hashes the model's sha256, the candidate recipe's
digest (its TOML), the corpus's sha256, the evaluation's settings, the imatrix's sha256, the pinned
llama.cpp's commit and ggufmtp's version (and the verification's settings for an acceptance), so a
rerun resumes where the last stopped and a finished one is instant: no llama.cpp process starts.

:func:`measure_candidate` is a top-level function of picklable arguments (a model path, a rule, the
options), so :func:`measure_sensitivity` submits each candidate as a task to a Dask client when one
is given (the baseline first, which computes the base logits every task then shares), and runs them
in sequence here otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from .._version import __version__
from ..errors import SearchError
from ..files.digest_cache import DigestCache
from ..files.hashing import sha256_cached
from ..files.memo import JsonMemo
from ..imatrix.corpus import resolve_corpus
from ..ladder.engine import task_result
from ..measure.core.options import VerifyOptions
from ..measure.verify.run import verify
from ..progress import bar as progress_bar
from ..quality.eval import evaluate
from ..quality.options import EvalOptions
from ..quant.plan import make_plan
from ..quant.quantize import quantize
from ..quant.recipe import QuantizeFlags, Recipe, Rule
from ..runtime.build import binary_version, cache_root, find_binary
from .groups import candidates, group_rule, imatrix_covers
from .records import Candidate, Cost, SensitivityTable, TensorGroup

__all__ = ["MeasureOptions", "Measurement", "baseline_types", "candidate_recipe", "measure_candidate",
           "measure_sensitivity", "measurement_memo"]

MEMO_VERSION = 1
Z95 = 1.959964  # the normal quantile of a two-sided 95 % interval (llama-perplexity's ± is one standard error)


@dataclass(frozen=True)
class MeasureOptions:
    """How costs are measured. ``eval``: the corpus, context, chunks and llama-perplexity settings
    (:class:`~ggufmtp.quality.options.EvalOptions`); ``baseline``: the recipe every other tensor
    follows (a recipe name, file or llama-quantize type; default ``Q8_0``); ``imatrix``: given to
    every quantization; ``acceptance``: also measure the head's groups' (and ``acceptance_groups``')
    paired acceptance against the source (starts llama-servers), with ``verify``'s settings (its
    ``reference`` is the model, set here); ``quantize_threads``: quantization threads (``--quantize-threads``; 0: all cores);
    ``cache``: read the measurement cache (a measurement is always stored); ``cache_dir``: where it is
    (default: ``cache_root()/search``; a folder a cluster's workers share); ``progress``: a bar over
    the candidates; ``work_dir``: where the temporary quantized files go (default: the system's)."""

    eval: EvalOptions = field(default_factory=EvalOptions)
    baseline: str = "Q8_0"
    imatrix: str | os.PathLike | None = None
    acceptance: bool = False
    acceptance_groups: tuple[str, ...] = ()
    verify: VerifyOptions | None = None
    quantize_threads: int = 0
    cache: bool = True
    cache_dir: str | os.PathLike | None = None
    progress: bool = True
    work_dir: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "acceptance_groups", tuple(self.acceptance_groups))
        if self.verify is not None and self.verify.reference is not None:
            raise SearchError("measure options: verify.reference is set by the search (the source model); leave it out")
        if isinstance(self.quantize_threads, bool) or not isinstance(self.quantize_threads, int) \
                or self.quantize_threads < 0:
            raise SearchError(f"measure options: quantize_threads {self.quantize_threads!r}: must be an integer of at "
                              "least 0")
        Recipe.load(self.baseline)  # RecipeError naming a baseline that is no recipe, before any work

    def measures_acceptance(self, group: TensorGroup) -> bool:
        return self.acceptance and (group.drafts or group.name in self.acceptance_groups)


@dataclass(frozen=True)
class Measurement:
    """One quantized file measured: mean KLD and its standard error, each chunk's mean, Same top p,
    and (when asked) the paired acceptance difference against the reference with its 95 % CI.
    ``seconds``: the wall time this call took; ``cached``: nothing was measured (all from the cache)."""

    kld: float
    kld_err: float
    chunk_kld: tuple[float, ...]
    same_top_p: float | None = None
    acceptance_diff: float | None = None
    acceptance_ci: tuple[float, float] | None = None
    seconds: float = 0.0
    cached: bool = False

    @property
    def kld_ci(self) -> tuple[float, float]:
        return (self.kld - Z95 * self.kld_err, self.kld + Z95 * self.kld_err)

    def cost(self, candidate: Candidate) -> Cost:
        return Cost(candidate=candidate, kld=self.kld, kld_ci=self.kld_ci, chunk_kld=self.chunk_kld,
                    same_top_p=self.same_top_p, acceptance_diff=self.acceptance_diff,
                    acceptance_ci=self.acceptance_ci)


def measurement_memo(cache_dir: str | os.PathLike | None = None) -> JsonMemo:
    """The measurement cache in ``cache_dir`` (default: ``cache_root()/search``; see the module doc)."""
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / "search"
    return JsonMemo(folder / "measurements.json", version=MEMO_VERSION, max_entries=100_000)


def candidate_recipe(baseline: str, rule: Rule | None) -> Recipe:
    """The baseline recipe with ``rule`` ahead of every rule of it (first match wins, as
    llama-quantize's ``--tensor-type``); the baseline itself for ``None``."""
    recipe = Recipe.load(baseline)
    return recipe if rule is None else recipe.with_flags(QuantizeFlags(tensor_types=(rule,)))


class _Inputs(TypedDict):
    """What a measurement depends on, every file by its content (no local path)."""

    model: str
    recipe: str
    corpus: str
    ctx_size: int
    chunks: int | None
    imatrix: str | None
    llama_cpp: str | None
    ggufmtp: str


class _KldEntry(TypedDict):
    """A KLD measurement as the cache keeps it."""

    kld: float
    kld_err: float
    chunk_kld: list[float]
    same_top_p: float | None


class _AcceptanceEntry(TypedDict):
    """An acceptance measurement as the cache keeps it."""

    acceptance_diff: float | None
    acceptance_ci: list[float] | None


def _digest(doc: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _sha256(path: str | os.PathLike) -> str:
    return sha256_cached(path, DigestCache.under(cache_root()))[0]


def _inputs(model: Path, recipe: Recipe, o: MeasureOptions) -> _Inputs:
    ev = o.eval
    return _Inputs(model=_sha256(model), recipe=hashlib.sha256(recipe.to_toml().encode()).hexdigest(),
                   corpus=resolve_corpus(ev.corpus).sha256, ctx_size=ev.ctx_size, chunks=ev.chunks,
                   imatrix=_sha256(o.imatrix) if o.imatrix is not None else None,
                   llama_cpp=binary_version(find_binary("llama-perplexity", ev.llama_cpp_bin)).get("commit"),
                   ggufmtp=__version__)


def _cached_kld(value: object) -> _KldEntry | None:
    """A cached KLD entry, or None when it is missing or not one (a damaged cache is measured again)."""
    if not isinstance(value, Mapping) or not {"kld", "kld_err", "chunk_kld", "same_top_p"} <= set(value):
        return None
    return _KldEntry(kld=float(value["kld"]), kld_err=float(value["kld_err"]),
                     chunk_kld=[float(x) for x in value["chunk_kld"]], same_top_p=value["same_top_p"])


def _cached_acceptance(value: object) -> _AcceptanceEntry | None:
    if not isinstance(value, Mapping) or not {"acceptance_diff", "acceptance_ci"} <= set(value):
        return None
    ci = value["acceptance_ci"]
    return _AcceptanceEntry(acceptance_diff=value["acceptance_diff"],
                            acceptance_ci=[float(ci[0]), float(ci[1])] if ci else None)


def _kld(model: Path, quant: Path, o: MeasureOptions) -> _KldEntry:
    r = evaluate(model, quant, o.eval, progress=False, hash_quant=False)
    if r.stats.kld_mean is None:
        raise SearchError(f"{quant.name}: llama-perplexity gave no mean KLD")
    return _KldEntry(kld=r.stats.kld_mean, kld_err=r.stats.kld_mean_err or 0.0, chunk_kld=list(r.chunk_kld),
                     same_top_p=r.stats.same_top_p)


def _acceptance(model: Path, quant: Path, o: MeasureOptions) -> _AcceptanceEntry:
    """The paired acceptance difference against the source, the worst mode's (lowest CI bound)."""
    res = verify(quant, dataclasses.replace(o.verify or VerifyOptions(), reference=model), progress=False)
    if res.head is None:
        raise SearchError(f"{quant.name}: the verification compared no head with the reference")
    worst = min(res.head.findings().values(), key=lambda f: (f.difference_ci[0] is not None,
                                                              f.difference_ci[0] or 0.0))
    lo, hi = worst.difference_ci
    return _AcceptanceEntry(acceptance_diff=worst.difference,
                            acceptance_ci=[lo, hi] if lo is not None and hi is not None else None)


@contextlib.contextmanager
def _quantized(model: Path, recipe: Recipe, o: MeasureOptions, name: str) -> Iterator[Path]:
    """``recipe`` on ``model`` in a temporary folder, removed on every path."""
    with tempfile.TemporaryDirectory(prefix="ggufmtp-search-", dir=o.work_dir) as tmp:
        yield quantize(model, recipe, Path(tmp) / f"{name}.gguf", Path(o.imatrix) if o.imatrix else None,
                       threads=o.quantize_threads, progress=False).output


def measure_candidate(model: str | os.PathLike, rule: Rule | None, options: MeasureOptions, *,
                      acceptance: bool = False) -> Measurement:
    """The cost of the baseline with ``rule`` (None: the baseline itself), from the cache or
    measured (see the module doc); ``acceptance``: the paired acceptance too. A task for a Dask
    client as well as a call: its arguments pickle, it returns a plain record."""
    t0 = time.perf_counter()
    model = Path(model)
    recipe = candidate_recipe(options.baseline, rule)
    inputs = _inputs(model, recipe, options)
    kld_key = _digest({**inputs, "measure": "kld"})
    acc_key = (_digest({**inputs, "measure": "acceptance", "verify": (options.verify or VerifyOptions()).to_dict()})
               if acceptance else None)
    memo = measurement_memo(options.cache_dir)
    kld = _cached_kld(memo.get(kld_key)) if options.cache else None
    acc = _cached_acceptance(memo.get(acc_key)) if options.cache and acc_key else None
    fresh = kld is None or (acc_key is not None and acc is None)
    if fresh:
        with _quantized(model, recipe, options, kld_key[:16]) as quant:
            if kld is None:
                kld = _kld(model, quant, options)
                memo.put(kld_key, kld)
            if acc_key is not None and acc is None:
                acc = _acceptance(model, quant, options)
                memo.put(acc_key, acc)
    assert kld is not None
    ci = acc["acceptance_ci"] if acc else None
    return Measurement(kld=kld["kld"], kld_err=kld["kld_err"], chunk_kld=tuple(kld["chunk_kld"]),
                       same_top_p=kld["same_top_p"], acceptance_diff=acc["acceptance_diff"] if acc else None,
                       acceptance_ci=(ci[0], ci[1]) if ci else None, seconds=time.perf_counter() - t0, cached=not fresh)


@dataclass(frozen=True)
class _Job:
    candidate: Candidate | None  # None: the baseline
    rule: Rule | None
    acceptance: bool


def _run_jobs(model: Path, jobs: Sequence[_Job], o: MeasureOptions, client: Any | None,
              on_done: Callable[[_Job, Measurement], None]) -> list[Measurement]:
    """Every job's measurement, in order: here in sequence, or as tasks of ``client`` (Dask's
    ``submit``/``as_completed``), the first job (the baseline, which makes the base logits) alone first."""
    if client is None:
        out = []
        for job in jobs:
            out.append(measure_candidate(model, job.rule, o, acceptance=job.acceptance))
            on_done(job, out[-1])
        return out
    from distributed import as_completed

    quiet = dataclasses.replace(o, progress=False)

    def submit(job: _Job) -> Any:
        return client.submit(measure_candidate, model, job.rule, quiet, acceptance=job.acceptance, pure=False)

    def result(fut: Any, job: _Job) -> Measurement:
        return task_result(fut, f"{model.name}: measuring {_what(job, o.baseline)}", SearchError)

    results = {0: result(submit(jobs[0]), jobs[0])}
    on_done(jobs[0], results[0])
    futures = {submit(job): i for i, job in enumerate(jobs) if i}
    for fut in as_completed(list(futures)):
        results[futures[fut]] = result(fut, jobs[futures[fut]])
        on_done(jobs[futures[fut]], results[futures[fut]])
    return [results[i] for i in range(len(jobs))]


def baseline_types(model: str | os.PathLike, options: MeasureOptions) -> dict[str, str]:
    """The type the baseline recipe gives each tensor, as llama.cpp decides it (the plan's dry run)."""
    plan = make_plan(Path(model), Recipe.load(options.baseline), Path(options.imatrix) if options.imatrix else None,
                     threads=options.quantize_threads)
    return {t.name: t.to_type for t in plan.tensors}


def _what(job: _Job, baseline: str) -> str:
    return f"{job.candidate.group} at {job.candidate.qtype}" if job.candidate else f"baseline {baseline}"


def _log_line(job: _Job, m: Measurement, baseline: str) -> str:
    return (f"{_what(job, baseline)}: KLD {m.kld:.6f} ± {m.kld_err:.6f}" +
            (f", acceptance {m.acceptance_diff * 100:+.1f} points" if m.acceptance_diff is not None else "") +
            f" ({'cached' if m.cached else f'{m.seconds:.1f} s'})")


def measure_sensitivity(model: str | os.PathLike, groups: Sequence[TensorGroup], types: Sequence[str],
                        options: MeasureOptions | None = None, *, client: Any | None = None,
                        log: Callable[[str], None] = lambda m: None) -> SensitivityTable:
    """Every candidate of ``groups`` at ``types`` (:func:`~.groups.candidates`) measured against the
    baseline (see the module doc), with the baseline's own KLD: the table the allocator reads. A
    candidate that changes nothing (the baseline already gives every tensor of its group that type:
    Q8_0 under the Q8_0 baseline) is the baseline's file, so it gets the baseline's measurement.
    ``client``: a Dask ``distributed.Client`` to run the measurements on (default: in sequence here);
    ``log``: one line per measurement (its group, type, KLD, wall time, cached or not)."""
    o = options if options is not None else MeasureOptions()
    model = Path(model)
    cands = candidates(model, groups, types, imatrix=imatrix_covers(o.imatrix))
    by_name = {g.name: g for g in groups}
    planned = baseline_types(model, o)
    unchanged = {c for c in cands if all(planned.get(n) == c.qtype for n in by_name[c.group].tensors)}
    jobs = [_Job(None, None, any(o.measures_acceptance(by_name[c.group]) for c in unchanged))]
    jobs += [_Job(c, group_rule(by_name[c.group], c.qtype), o.measures_acceptance(by_name[c.group]))
             for c in cands if c not in unchanged]
    with progress_bar(len(jobs), "sensitivity", "candidate", enabled=o.progress) as bar:
        def done(job: _Job, m: Measurement) -> None:
            log(_log_line(job, m, o.baseline))
            bar.update(1)

        results = _run_jobs(model, jobs, o, client, done)
    base = results[0]
    measured = {j.candidate: m for j, m in zip(jobs, results, strict=True) if j.candidate is not None}
    no_acceptance = dataclasses.replace(base, acceptance_diff=None, acceptance_ci=None)
    costs = tuple((measured[c] if c not in unchanged else base if o.measures_acceptance(by_name[c.group])
                   else no_acceptance).cost(c) for c in cands)
    corpus = resolve_corpus(o.eval.corpus)
    return SensitivityTable(model_sha256=_sha256(model), corpus=f"{corpus.name} ({corpus.sha256[:12]})",
                            baseline_recipe=o.baseline, baseline_kld=base.kld, baseline_chunk_kld=base.chunk_kld,
                            groups=tuple(groups), costs=costs)
