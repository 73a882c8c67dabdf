"""Server options of the compared arms: :class:`TuneConfig`, one llama-server configuration with
``--spec-type draft-mtp``, and :class:`ArmArgs`, which splits every server setting of a comparison
by the arm that gets it (both in :mod:`.tuned`, re-exported here).

Fair baseline: a speedup is only the gain of speculation when both arms differ in speculation
alone. So every NON-speculative setting (threads, ``-bs`` backend sampling, batch sizes, flash
attention, KV cache types, context size, GPU layers, ``GGML_CUDA_GRAPH_OPT``, any ``--server-arg``)
goes to the vanilla arm too; only the speculative ones (``--spec-*`` and the draft model's flags:
:func:`is_speculative`) are the MTP arm's own. The *default* vanilla arm
(:meth:`ArmArgs.default_fields`) is the run's base settings without any of the tuning settings
(``--server-arg``, ``--vanilla-server-arg``, a tuned configuration's ``-bs``/threads/graph
optimisation): what a speedup "against llama-server's defaults" divides by.

The options objects: :class:`VerifyOptions` (what ``verify`` measures with, checked once when
built), made of :class:`ServerOptions` (the servers' settings, shared with tune, curve and profiles)
and :class:`JudgeOptions` (thresholds and statistics). verify's defaults are written here once: the
API, the CLI and tune read them.

Part of :mod:`ggufmtp.measure.core`: it imports neither tune, verify nor profiles, so each of them
can import it."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import GgufmtpError, TuneError, VerifyError
from ...provenance.head import DEFAULT_MARGIN as DEFAULT_HEAD_MARGIN
from ...provenance.head import check_margin
from ...provenance.verdict import Thresholds
from ...quant.recipe import VerifyThresholds
from ...runtime.hardware import peak_bandwidth
from ...runtime.offload import Offload, check_fit_args
from ...stats import DEFAULT_RESAMPLES, DEFAULT_SEED
from .suite import DEFAULT_SUITE, Suite
from .tuned import CUDA_GRAPH_OPT_ENV, ArmArgs, TuneConfig, flag_names, is_speculative, split_args, tuned_window

#: verify's defaults, written once: the API, the CLI and tune read them from here (and :class:`VerifyOptions`)
DEFAULT_SEEDS = (42, 1337, 2024)
DEFAULT_MAX_TOKENS = 128
DEFAULT_DRAFT_N_MAX = 4

__all__ = ["CUDA_GRAPH_OPT_ENV", "TuneConfig", "ArmArgs", "ServerOptions", "JudgeOptions", "VerifyOptions",
           "is_speculative", "flag_names", "split_args", "tuned_window"]



def check_whole(value: Any, name: str, minimum: int, *, optional: bool = False) -> None:
    """VerifyError naming the field unless ``value`` is an int (a bool is not) of at least
    ``minimum``, or None when ``optional``: an option object refuses what its flag's type would."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise VerifyError(f"{name} {value!r}: must be a whole number of at least {minimum}"
                          + (" (or None)" if optional else ""))


def check_seeds(seeds: Sequence[int], max_tokens: int) -> list[int]:
    """The seeds as ints; VerifyError on none, a non-integer, duplicates, or a reply too short to draft."""
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise VerifyError(f"seeds {tuple(seeds)!r}: {seed!r} is not an integer")
    out = list(seeds)
    if not out:
        raise VerifyError("at least one seed is needed")
    if len(set(out)) != len(out):
        raise VerifyError(f"seeds {out}: duplicates")
    if max_tokens < 2:
        raise VerifyError(f"max_tokens {max_tokens}: must be at least 2 (a reply of one token has nothing to draft)")
    return out


# ----------------------------------------------------------------------------- the options objects

_ARG_FIELDS = ("extra_args", "server_args", "mtp_server_args", "vanilla_server_args")
#: every arm's first flags: llama-server's --fit (on by default) would size each server to the memory
#: free when it starts; ggufmtp sets the offload explicitly (the memory plan checks it fits)
FIT_OFF = ("--fit", "off")


@dataclass(frozen=True)
class ServerOptions:
    """The llama-server settings that verify, tune, curve and profiles share: the binary, the
    machine's settings (every arm) and the flags by the arm that gets them (:class:`ArmArgs`).

    ``llama_cpp_bin``: the llama-server binary or its directory (default: the built runtime's).
    ``threads``, ``gpu_layers``: ``--threads`` and ``--n-gpu-layers`` of every arm. ``extra_args``:
    base flags of every arm, the default vanilla one included; ``server_args`` (``--server-arg``):
    every arm but the default vanilla one (non-speculative flags only: fair baseline);
    ``mtp_server_args`` / ``vanilla_server_args``: one arm only. Argument lists are kept as tuples.
    ``n_cpu_moe``, ``cpu_moe``, ``override_tensor``: partial offload (:class:`~ggufmtp.runtime.offload.Offload`),
    every arm alike. llama-server's ``--fit`` is refused in any of them and ``--fit off`` given to
    every arm: it would size each server to the memory free when it starts."""

    threads: int | None = None
    gpu_layers: int | str | None = None
    llama_cpp_bin: str | os.PathLike | None = None
    extra_args: Sequence[str] = ()
    server_args: Sequence[str] = ()
    mtp_server_args: Sequence[str] = ()
    vanilla_server_args: Sequence[str] = ()
    n_cpu_moe: int | None = None
    cpu_moe: bool = False
    override_tensor: Sequence[str] = ()

    def __post_init__(self) -> None:
        for name in (*_ARG_FIELDS, "override_tensor"):
            if isinstance(getattr(self, name), str):  # a string is a sequence of characters, not of arguments
                raise VerifyError(f"{name} {getattr(self, name)!r}: a sequence of arguments, e.g. ('-b', '256')")
            object.__setattr__(self, name, tuple(str(a) for a in getattr(self, name) or ()))
        for name, flag in zip(_ARG_FIELDS, ("extra_args", "--server-arg", "--mtp-server-arg", "--vanilla-server-arg"),
                              strict=True):
            check_fit_args(getattr(self, name), flag)
        check_whole(self.threads, "threads", 1, optional=True)
        if self.gpu_layers not in ("auto", "all") and (isinstance(self.gpu_layers, bool) or not (
                self.gpu_layers is None or isinstance(self.gpu_layers, int) and self.gpu_layers >= 0)):
            raise VerifyError(f"gpu_layers {self.gpu_layers!r}: a number of layers, 'auto', 'all' or None")
        self.offload  # a bad --n-cpu-moe or --override-tensor fails now  # noqa: B018

    @property
    def offload(self) -> Offload:
        """The partial offload every arm gets."""
        return Offload(tuple(self.override_tensor), self.cpu_moe, self.n_cpu_moe)

    def arm_args(self, tuned: TuneConfig | None = None) -> ArmArgs:
        """The flags by arm, checked (:meth:`ArmArgs.of`: TuneError on a speculative flag for the vanilla arm)."""
        return ArmArgs.of(self.server_args, self.mtp_server_args, self.vanilla_server_args, tuned)

    def base_fields(self, **fields: Any) -> dict[str, Any]:
        """The :class:`~ggufmtp.runtime.server.ServerConfig` fields every arm starts from (``fields``
        added: the model, the context, the slots)."""
        return dict(threads=self.threads, gpu_layers=self.gpu_layers, llama_cpp_bin=self.llama_cpp_bin, metrics=True,
                    extra_args=[*FIT_OFF, *self.offload.args(), *self.extra_args], **fields)


@dataclass(frozen=True)
class JudgeOptions:
    """How a verification is judged. ``thresholds``: a :class:`~ggufmtp.provenance.verdict.Thresholds`,
    a recipe's ``VerifyThresholds`` (whose ``draft_n_max`` is then the default window), their dict,
    or None (the project's defaults: there is always a threshold); ``min_identical`` (when given)
    and ``enforce_speedup`` go over them. ``peak_bandwidth_gbs``: the memory's peak in GB/s for the
    bandwidth fraction (default: ``$GGUFMTP_PEAK_BANDWIDTH_GBS``, else a table of GPUs; see
    :mod:`ggufmtp.runtime.hardware`). ``bootstrap_resamples``, ``bootstrap_seed``: the percentile
    bootstrap of every 95% CI. ``head_margin``: the non-inferiority margin of the head against a
    reference (:mod:`ggufmtp.provenance.head`); ``absolute_acceptance``: with a reference, judge
    the thresholds' ``min_acceptance`` too (without one it always applies)."""

    thresholds: Any = None
    min_identical: float | None = None
    enforce_speedup: bool = False
    peak_bandwidth_gbs: float | None = None
    bootstrap_resamples: int = DEFAULT_RESAMPLES
    bootstrap_seed: int = DEFAULT_SEED
    head_margin: float | None = None
    absolute_acceptance: bool = False

    def __post_init__(self) -> None:
        if self.thresholds is not None and not isinstance(self.thresholds, (Thresholds, VerifyThresholds, dict)):
            raise VerifyError(f"thresholds {self.thresholds!r}: a Thresholds, a recipe's VerifyThresholds, their "
                              "dict or None")
        check_whole(self.bootstrap_resamples, "bootstrap_resamples", 1)
        check_whole(self.bootstrap_seed, "bootstrap_seed", 0)
        try:
            check_margin(self.margin, "head_margin")
        except ValueError as e:
            raise VerifyError(str(e)) from None
        if self.peak_bandwidth_gbs is not None:
            try:
                peak_bandwidth(None, self.peak_bandwidth_gbs)  # a bad figure fails now, not after the run
            except GgufmtpError as e:
                raise VerifyError(str(e)) from e
        th = self.merged_thresholds()
        if not 0.0 <= th.min_identical <= 1.0:
            raise VerifyError(f"min_identical {th.min_identical}: must be between 0 and 1")

    @property
    def margin(self) -> float:
        """The head's non-inferiority margin: ``head_margin``, else the thresholds' (a recipe's
        ``[verify] head_margin``), else ggufmtp's (:data:`~ggufmtp.provenance.head.DEFAULT_MARGIN`)."""
        if self.head_margin is not None:
            return self.head_margin
        th = getattr(self.thresholds, "head_margin", None) if not isinstance(self.thresholds, dict) \
            else self.thresholds.get("head_margin")
        return DEFAULT_HEAD_MARGIN if th is None else th

    def merged_thresholds(self) -> Thresholds:
        """The thresholds in force: ``thresholds`` with ``min_identical`` and ``enforce_speedup`` over them."""
        th = Thresholds.coerce(self.thresholds).merged(min_identical=self.min_identical,
                                                       enforce_speedup=self.enforce_speedup)
        return dataclasses.replace(th, absolute_acceptance=th.absolute_acceptance or self.absolute_acceptance)


@dataclass(frozen=True)
class VerifyOptions:
    """What :func:`ggufmtp.verify` measures with, checked once, when built: VerifyError naming the
    first bad setting (TuneError for a ``tuned`` value that is no configuration), before any server
    starts. The defaults are the command line's.

    ``draft_n_max``: the draft window k (default: the thresholds' ``draft_n_max``, a recipe's, else
    4); ``draft_n_min``: ``--spec-draft-n-min``; ``sweep``: windows to measure besides k.
    ``tuned``: a :class:`TuneConfig` (or its dict, e.g. ``tune``'s recommendation) for the MTP arm,
    its non-speculative part for the vanilla arm too; it fixes the window. ``seeds``, ``suite`` (a
    shipped name, a JSONL path or a :class:`~ggufmtp.measure.core.suite.Suite`), ``limit`` (its
    first N prompts), ``max_tokens``: the requests; ``raw``: also ``/completion`` without the chat
    template. ``ctx_size`` (both arms), ``parallel`` (N > 1: the slot study of
    :mod:`ggufmtp.measure.verify.slots`), ``cache_type_k``/``cache_type_v`` (both arms) and
    ``context_fill`` (see :mod:`ggufmtp.measure.verify.kvdepth`). ``reference``: a model measured
    alone first with the MTP arm's settings (cached by content), against which the head is judged
    (:mod:`ggufmtp.measure.verify.reference`; it must be the artifact's source or a more precise
    variant of it). ``sidecar``: an MTP-only GGUF the MTP arm drafts
    with (``--spec-draft-model``/``-md``), the model being its trunk; the vanilla arm serves the
    trunk alone (:mod:`ggufmtp.provenance.pair` checks they pair). ``server``: the servers' settings
    (:class:`ServerOptions`); ``judge``: thresholds and statistics (:class:`JudgeOptions`).
    :meth:`from_dict` builds one from flat keys (a ladder file's ``[verify]`` table)."""

    draft_n_max: int | None = None
    draft_n_min: int | None = None
    sweep: Sequence[int] = ()
    tuned: TuneConfig | None = None  # or its dict
    seeds: Sequence[int] = DEFAULT_SEEDS
    suite: str | os.PathLike | Suite = DEFAULT_SUITE
    max_tokens: int = DEFAULT_MAX_TOKENS
    limit: int | None = None
    raw: bool = False
    ctx_size: int | None = 4096
    parallel: int | None = 1
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    context_fill: int = 0
    reference: str | os.PathLike | None = None
    sidecar: str | os.PathLike | None = None
    server: ServerOptions = field(default_factory=ServerOptions)
    judge: JudgeOptions = field(default_factory=JudgeOptions)

    def __post_init__(self) -> None:
        set_ = functools.partial(object.__setattr__, self)
        self._check_fields()
        set_("tuned", None if self.tuned is None else TuneConfig.coerce(self.tuned))
        try:
            self.arm_args()
        except TuneError as e:
            raise VerifyError(str(e)) from e
        set_("sweep", tuple(self.sweep))
        set_("seeds", tuple(check_seeds(self.seeds, self.max_tokens)))
        ks = self.windows
        if ks[0] < 1:
            raise VerifyError(f"draft window {ks[0]}: --spec-draft-n-max must be at least 1")
        draft_n_min = self.window[1]
        if draft_n_min is not None and draft_n_min > ks[0]:
            raise VerifyError(f"draft_n_min {draft_n_min} exceeds the smallest draft window {ks[0]}")

    def _check_fields(self) -> None:
        """VerifyError naming the first field whose value its flag would refuse (``--seeds``,
        ``--limit``, ...), before anything uses it."""
        for name, cls in (("server", ServerOptions), ("judge", JudgeOptions)):
            if not isinstance(getattr(self, name), cls):
                raise VerifyError(f"{name} {getattr(self, name)!r}: must be a {cls.__name__}")
        for name in ("seeds", "sweep"):
            if isinstance(getattr(self, name), (int, str)) or not isinstance(getattr(self, name), Sequence):
                raise VerifyError(f"{name} {getattr(self, name)!r}: a sequence of integers, e.g. (42,) or (42, 1337)")
        if self.limit is not None and (not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit < 1):
            raise VerifyError(f"limit {self.limit!r}: the number of the suite's prompts to run, at least 1")
        for k in self.sweep:
            check_whole(k, "sweep", 1)
        for name, minimum, optional in (("draft_n_max", 1, True), ("draft_n_min", 0, True), ("max_tokens", 2, False),
                                        ("ctx_size", 1, True), ("parallel", 1, True), ("context_fill", 0, False)):
            check_whole(getattr(self, name), name, minimum, optional=optional)
        if not isinstance(self.raw, bool):
            raise VerifyError(f"raw {self.raw!r}: must be True or False")
        if not isinstance(self.suite, (str, os.PathLike, Suite)):
            raise VerifyError(f"suite {self.suite!r}: a shipped suite's name, a JSONL path or a Suite")

    @property
    def window(self) -> tuple[int, int | None]:
        """(draft_n_max, draft_n_min) in force: the tuned configuration's, else as given; the window
        defaults to the thresholds' ``draft_n_max``, else 4."""
        draft_n_max, draft_n_min = tuned_window(self.tuned, self.sweep, self.draft_n_max, self.draft_n_min)
        if draft_n_max is None:
            draft_n_max = getattr(self.judge.thresholds, "draft_n_max", None) or DEFAULT_DRAFT_N_MAX
        return int(draft_n_max), draft_n_min

    @property
    def windows(self) -> list[int]:
        """Every draft window measured, smallest first (k and the sweep's)."""
        return sorted({self.window[0], *self.sweep})

    def arm_args(self) -> ArmArgs:
        """The flags by arm, the tuned configuration included; the sidecar as the MTP arm's draft model."""
        arms = self.server.arm_args(self.tuned)
        return arms if self.sidecar is None else dataclasses.replace(arms, draft_model=str(self.sidecar))

    def with_defaults(self, draft_n_max: int | None = None, thresholds: Any = None) -> VerifyOptions:
        """These options with ``draft_n_max`` and ``thresholds`` (e.g. a recipe's ``[verify]``
        table) where they set none."""
        out = self
        if draft_n_max is not None and out.draft_n_max is None:
            out = dataclasses.replace(out, draft_n_max=draft_n_max)
        if thresholds is not None and out.judge.thresholds is None:
            out = dataclasses.replace(out, judge=dataclasses.replace(out.judge, thresholds=thresholds))
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VerifyOptions:
        """Options from flat keys: the fields of this class, of :class:`ServerOptions` and of
        :class:`JudgeOptions` (``{"seeds": [42], "gpu_layers": 99}``); VerifyError on any other key."""
        groups: dict[str, type] = {"server": ServerOptions, "judge": JudgeOptions}
        own = {f.name for f in dataclasses.fields(cls)} - set(groups)
        kw: dict[str, Any] = {}
        sub: dict[str, dict[str, Any]] = {g: {} for g in groups}
        for k, v in d.items():
            g = next((g for g, c in groups.items() if k in {f.name for f in dataclasses.fields(c)}), None)
            if k not in own and g is None:
                raise VerifyError(f"verify option {k!r}: unknown (known: {', '.join(sorted(_flat_names()))})")
            (kw if k in own else sub[g])[k] = v  # type: ignore[index]
        return cls(**kw, **{g: c(**sub[g]) for g, c in groups.items()})

    def to_dict(self) -> dict[str, Any]:
        """The settings that differ from the defaults, as flat keys (:meth:`from_dict`'s), in JSON form."""
        out: dict[str, Any] = {}
        for obj in (self, self.server, self.judge):
            for f in dataclasses.fields(obj):
                v = getattr(obj, f.name)
                if f.name in ("server", "judge") or v == _default(f):
                    continue
                out[f.name] = (list(v) if isinstance(v, tuple) else v.to_dict() if hasattr(v, "to_dict")
                               else v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
        return out


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _flat_names() -> set[str]:
    return {f.name for c in (VerifyOptions, ServerOptions, JudgeOptions) for f in dataclasses.fields(c)} - {"server",
                                                                                                             "judge"}
