"""Server options of the compared arms: :class:`TuneConfig`, one llama-server configuration with
``--spec-type draft-mtp`` (window, draft limits, backend sampling, slots, CUDA graph optimisation,
threads), as ``tune`` searches it and ``verify --tune`` / ``profiles --tuned`` apply it; and
:class:`ArmArgs`, which splits every server setting of a comparison by the arm that gets it.

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
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import GgufmtpError, TuneError, VerifyError
from ...provenance.head import DEFAULT_MARGIN as DEFAULT_HEAD_MARGIN
from ...provenance.head import check_margin
from ...provenance.verdict import Thresholds
from ...runtime.hardware import peak_bandwidth
from ...runtime.offload import Offload, check_fit_args
from ...stats import DEFAULT_RESAMPLES, DEFAULT_SEED
from .suite import DEFAULT_SUITE, Suite

#: verify's defaults, written once: the API, the CLI and tune read them from here (and :class:`VerifyOptions`)
DEFAULT_SEEDS = (42, 1337, 2024)
DEFAULT_MAX_TOKENS = 128
DEFAULT_DRAFT_N_MAX = 4

__all__ = ["CUDA_GRAPH_OPT_ENV", "TuneConfig", "ArmArgs", "ServerOptions", "JudgeOptions", "VerifyOptions",
           "is_speculative", "flag_names", "split_args"]

CUDA_GRAPH_OPT_ENV = "GGML_CUDA_GRAPH_OPT"  # read by ggml-cuda at 0c1e570; off unless set to 1

# The short aliases of llama-server's "speculative params" (``--help`` at 0c1e570); every long
# spelling there starts with --spec- or names the draft model (``--*-draft``, ``--draft-*``).
_SPECULATIVE_SHORT = frozenset({"-hfd", "-hfrd", "-td", "-tbd", "-Cd", "-Crd", "-Cbd", "-otd", "-cmoed", "-ncmoed",
                                "-devd", "-ngld", "-md", "-ctkd", "-ctvd"})


def is_speculative(flag: str) -> bool:
    """Whether a llama-server flag configures speculation (the MTP arm's own) rather than the
    server as a whole (both arms)."""
    name = flag.split("=", 1)[0]
    return (name.startswith(("--spec-", "--no-spec-")) or name in _SPECULATIVE_SHORT
            or name.startswith("--draft") or name.endswith("-draft"))


def flag_names(args: Iterable[str]) -> list[str]:
    """The flags among ``args`` (values and negative numbers left out)."""
    return [a.split("=", 1)[0] for a in args if a.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", a)]


def _flag_groups(args: Sequence[str]) -> list[list[str]]:
    """``args`` as [flag, its values...] groups (``["-fa", "off", "-bs"]`` -> ``[["-fa", "off"], ["-bs"]]``)."""
    out: list[list[str]] = []
    for a in args:
        if flag_names([a]) or not out:
            out.append([a])
        else:
            out[-1].append(a)
    return out


def split_args(values: Iterable[str]) -> list[str]:
    """Command-line values as arguments: each shell-split (``"-b 256"`` -> ``["-b", "256"]``)."""
    return [a for v in values for a in shlex.split(str(v))]


@dataclass(frozen=True)
class TuneConfig:
    """One MTP server configuration. ``None`` for a backend-sampling switch = not searched (the flag
    is left out: llama-server's default applies)."""

    draft_n_max: int
    draft_n_min: int = 0
    draft_p_min: float = 0.0
    backend_sampling: bool | None = None  # -bs (target sampling on the backend)
    draft_backend_sampling: bool | None = None  # --[no-]spec-draft-backend-sampling
    parallel: int = 1
    cuda_graph_opt: bool | None = None  # GGML_CUDA_GRAPH_OPT=1 (ggml-cuda's concurrent-stream graph optimisation)
    threads: int | None = None  # the MTP server's --threads (None: the run's setting, else llama-server's default)
    # The server options a GPU run searches (#52; both arms: non-speculative, so the fair vanilla gets them too):
    flash_attn: bool | None = None  # -fa on/off (None: llama-server's auto)
    cache_type: str | None = None  # -ctk and -ctv (a quantized V cache needs flash attention on)
    batch: int | None = None  # -b (logical batch)
    ubatch: int | None = None  # -ub (physical batch)
    server_args: tuple[str, ...] = ()  # any other non-speculative flags (an option set given by the user)
    head: str | None = None  # the MTP head's tensor type this was measured with (None: the model's own head)

    def __post_init__(self) -> None:
        object.__setattr__(self, "server_args", tuple(str(a) for a in self.server_args or ()))
        spec = [f for f in flag_names(self.server_args) if is_speculative(f)]
        if spec:
            raise TuneError(f"server_args {' '.join(spec)}: speculative; the option sets are given to both arms")
        for name in ("draft_n_max", "draft_n_min", "parallel", "threads", "batch", "ubatch"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise TuneError(f"{name} {v!r}: must be an integer")
        if isinstance(self.draft_p_min, bool) or not isinstance(self.draft_p_min, (int, float)):
            raise TuneError(f"draft_p_min {self.draft_p_min!r}: must be a number")
        if self.draft_n_max < 1:
            raise TuneError(f"draft_n_max {self.draft_n_max}: must be at least 1")
        if not 0 <= self.draft_n_min <= self.draft_n_max:
            raise TuneError(f"draft_n_min {self.draft_n_min}: must be between 0 and draft_n_max {self.draft_n_max}")
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise TuneError(f"draft_p_min {self.draft_p_min}: must be in [0, 1]")
        if self.parallel < 1:
            raise TuneError(f"parallel {self.parallel}: must be at least 1")
        for name in ("threads", "batch", "ubatch"):
            if (v := getattr(self, name)) is not None and v < 1:
                raise TuneError(f"{name} {v}: must be at least 1")
        if self.cache_type is not None and self.cache_type not in ("f16", "bf16", "f32") and self.flash_attn is False:
            raise TuneError(f"cache_type {self.cache_type}: a quantized V cache needs flash attention (not -fa off)")

    @property
    def key(self) -> str:
        """A short readable name, unique per configuration (``k=3 nmin=0 pmin=0 np=1``)."""
        s = f"k={self.draft_n_max} nmin={self.draft_n_min} pmin={self.draft_p_min:g}"
        if self.backend_sampling is not None:
            s += f" bs={'on' if self.backend_sampling else 'off'}"
        if self.draft_backend_sampling is not None:
            s += f" dbs={'on' if self.draft_backend_sampling else 'off'}"
        s += f" np={self.parallel}"
        if self.cuda_graph_opt is not None:
            s += f" gopt={'on' if self.cuda_graph_opt else 'off'}"
        if self.threads is not None:
            s += f" t={self.threads}"
        for flag, v in self._server_options():
            s += f" {flag}={v}"
        if self.server_args:
            s += f" args={shlex.join(self.server_args)!r}"
        if self.head is not None:
            s += f" head={self.head}"
        return s

    @property
    def sets_server_options(self) -> bool:
        """Whether it sets a server option that may change the output itself (KV types, flash
        attention, batch sizes, an option set): tune then checks its vanilla against the default's."""
        return bool(self._server_options() or self.server_args)

    def _server_options(self) -> list[tuple[str, str]]:
        """The searched server options that are set, as (short flag name, value)."""
        fa = None if self.flash_attn is None else ("on" if self.flash_attn else "off")
        return [(f, str(v)) for f, v in (("fa", fa), ("kv", self.cache_type), ("b", self.batch), ("ub", self.ubatch))
                if v is not None]

    def extra_args(self) -> list[str]:
        """Flags beyond those :class:`ggufmtp.runtime.server.ServerConfig` writes itself."""
        return self.shared_args() + self.speculative_args()

    def shared_args(self) -> list[str]:
        """This configuration's non-speculative flags: both arms get them (a fair baseline)."""
        out = ["-bs"] if self.backend_sampling else []
        flags = {"fa": ["-fa"], "kv": ["-ctk", "-ctv"], "b": ["-b"], "ub": ["-ub"]}
        out += [a for name, v in self._server_options() for f in flags[name] for a in (f, v)]
        return out + list(self.server_args)

    def speculative_args(self) -> list[str]:
        """This configuration's speculative flags beyond the window: the MTP arm's own."""
        if self.draft_backend_sampling is None:
            return []
        return ["--spec-draft-backend-sampling" if self.draft_backend_sampling else "--no-spec-draft-backend-sampling"]

    @property
    def tunes_the_server(self) -> bool:
        """Whether it sets anything non-speculative (then the fair vanilla is not llama-server's default)."""
        return bool(self.backend_sampling or self.cuda_graph_opt or self.threads is not None
                    or self._server_options() or self.server_args)

    def env(self) -> dict[str, str]:
        """Environment variables the server needs for this configuration."""
        return {CUDA_GRAPH_OPT_ENV: "1"} if self.cuda_graph_opt else {}

    def server_fields(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (:class:`ServerConfig` fields shared with the vanilla arm) turned into the MTP
        server's: draft-mtp with this window, this configuration's flags appended (once: ``-bs`` may
        already be in ``base``), its environment added and its thread count in force."""
        kw = self._with(base, self.extra_args())
        kw.update(draft_mtp=True, draft_n_max=self.draft_n_max, draft_n_min=self.draft_n_min,
                  draft_p_min=self.draft_p_min)
        return kw

    def vanilla_fields(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` turned into the vanilla server's that matches this configuration: its
        non-speculative flags, environment and thread count, no speculation (the fair baseline)."""
        return self._with(base, self.shared_args())

    def _with(self, base: Mapping[str, Any], args: Sequence[str]) -> dict[str, Any]:
        kw = dict(base)
        shared = list(base.get("extra_args") or [])
        have = set(flag_names(shared))  # a flag already there (e.g. -bs) is not given twice; values are kept with their flag
        kw["extra_args"] = shared + [a for flag in _flag_groups(args) if flag[0] not in have for a in flag]
        kw["env"] = {**(base.get("env") or {}), **self.env()} or None
        if self.threads is not None:
            kw["threads"] = self.threads
        return kw

    def complexity(self) -> tuple:
        """Tie-break order: simpler first (fewer drafted tokens to verify, fewer non-default flags,
        more slots = less queueing)."""
        return (self.draft_n_max, self.draft_n_min, self.draft_p_min, bool(self.backend_sampling),
                self.draft_backend_sampling is False, bool(self.cuda_graph_opt), self.threads is not None,
                len(self._server_options()) + len(self.server_args), -self.parallel)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field, then ``key``."""
        d = dataclasses.asdict(self)
        d["server_args"] = list(self.server_args)
        d["key"] = self.key
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TuneConfig:
        """The configuration of a :meth:`to_dict` object (unknown keys such as ``key`` ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def coerce(cls, value: Any) -> TuneConfig:
        """``value`` as a configuration: a TuneConfig or its dict (e.g. tune's recommendation)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            try:
                return cls.from_dict(value)
            except (TypeError, ValueError) as e:
                raise TuneError(f"tuned configuration {value!r}: {e}") from e
        raise TuneError(f"tuned: expected a TuneConfig or its dict, got {type(value).__name__}")


@dataclass(frozen=True)
class ArmArgs:
    """The server settings of one comparison by the arm that gets them: ``both`` (``--server-arg``:
    non-speculative, every arm but the default one), ``mtp`` (``--mtp-server-arg``: the MTP arm
    only) and ``vanilla`` (``--vanilla-server-arg``: the vanilla arm only), and the ``tuned``
    configuration, whose non-speculative part goes to both arms. See the module docstring."""

    both: tuple[str, ...] = ()
    mtp: tuple[str, ...] = ()
    vanilla: tuple[str, ...] = ()
    tuned: TuneConfig | None = None
    draft_model: str | None = None  # an MTP-only sidecar the MTP arm drafts with (-md), the trunk being the model

    @classmethod
    def of(cls, both: Iterable[str] = (), mtp: Iterable[str] = (), vanilla: Iterable[str] = (),
           tuned: TuneConfig | None = None) -> ArmArgs:
        """Checked: a speculative flag for the vanilla arm (in ``both`` or ``vanilla``) is a
        TuneError, since that arm would then speculate too."""
        out = cls(tuple(map(str, both)), tuple(map(str, mtp)), tuple(map(str, vanilla)), tuned)
        for where, args in (("--server-arg", out.both), ("--vanilla-server-arg", out.vanilla)):
            spec = [f for f in flag_names(args) if is_speculative(f)]
            if spec:
                raise TuneError(f"{where} {' '.join(spec)}: a speculative flag would make the vanilla arm speculate "
                                "too; give it with --mtp-server-arg")
        return out

    @property
    def differs_from_default(self) -> bool:
        """Whether the vanilla arm is configured beyond the run's base settings (then a default
        vanilla arm is measured as well)."""
        return bool(self.both or self.vanilla or (self.tuned is not None and self.tuned.tunes_the_server))

    def notes(self) -> list[str]:
        """What a reader must know: non-speculative flags given to one arm only make the two
        configurations differ beyond speculation (reported, not corrected)."""
        out = []
        mtp_only = [f for f in flag_names(self.mtp) if not is_speculative(f)]
        if mtp_only:
            out.append(f"--mtp-server-arg {' '.join(mtp_only)} is not speculative but was given to the MTP arm only: "
                       "the arms differ beyond speculation, so the speedup is not MTP's alone")
        if flag_names(self.vanilla):
            out.append(f"--vanilla-server-arg {' '.join(self.vanilla)}: given to the vanilla arm only; the arms differ "
                       "beyond speculation")
        return out

    def default_fields(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """The default vanilla server: the run's base settings alone."""
        return dict(base)

    def vanilla_fields(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """The vanilla server: base, ``both``, the tuned configuration's non-speculative part, ``vanilla``."""
        kw = self._append(base, self.both)
        if self.tuned is not None:
            kw = self.tuned.vanilla_fields(kw)
        return self._append(kw, self.vanilla)

    def mtp_fields(self, base: Mapping[str, Any], k: int, draft_n_min: int | None = None) -> dict[str, Any]:
        """The MTP server at window ``k``: base, ``both``, the tuned configuration (or ``k`` and
        ``draft_n_min``), ``mtp``, and the sidecar as the draft model when there is one."""
        kw = self._append(base, self.both)
        if self.tuned is not None:
            kw = self.tuned.server_fields(kw)
        else:
            kw.update(draft_mtp=True, draft_n_max=k, draft_n_min=draft_n_min)
        if self.draft_model is not None:
            kw["draft_model"] = self.draft_model
        return self._append(kw, self.mtp)

    @staticmethod
    def _append(base: Mapping[str, Any], args: Sequence[str]) -> dict[str, Any]:
        kw = dict(base)
        kw["extra_args"] = list(base.get("extra_args") or []) + list(args)
        return kw

    def to_dict(self) -> dict[str, Any]:
        return {"both": list(self.both), "mtp": list(self.mtp), "vanilla": list(self.vanilla)}


# ----------------------------------------------------------------------------- verify's option checks


def tuned_window(cfg: TuneConfig | None, sweep: Iterable[int] | None, draft_n_max: int | None,
                  draft_n_min: int | None) -> tuple[int | None, int | None]:
    """(draft_n_max, draft_n_min) once a tuned configuration fixes them."""
    if cfg is None:
        return draft_n_max, draft_n_min
    if sweep:
        raise VerifyError("a tuned configuration and a draft-window sweep cannot be combined: "
                          "the configuration fixes the window")
    if draft_n_max is not None and int(draft_n_max) != cfg.draft_n_max:
        raise VerifyError(f"draft_n_max {draft_n_max} disagrees with the tuned configuration's "
                          f"{cfg.draft_n_max}: give one or the other")
    return cfg.draft_n_max, cfg.draft_n_min


def check_seeds(seeds: Sequence[int], max_tokens: int) -> list[int]:
    """The seeds as ints; VerifyError on none, duplicates, or a reply too short to draft."""
    out = [int(s) for s in seeds]
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
            object.__setattr__(self, name, tuple(str(a) for a in getattr(self, name) or ()))
        for name, flag in zip(_ARG_FIELDS, ("extra_args", "--server-arg", "--mtp-server-arg", "--vanilla-server-arg"),
                              strict=True):
            check_fit_args(getattr(self, name), flag)
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
        set_("tuned", None if self.tuned is None else TuneConfig.coerce(self.tuned))
        try:
            self.arm_args()
        except TuneError as e:
            raise VerifyError(str(e)) from e
        set_("sweep", tuple(int(k) for k in self.sweep or ()))
        if isinstance(self.seeds, (int, str)) or not isinstance(self.seeds, Sequence):
            raise VerifyError(f"seeds {self.seeds!r}: a sequence of integers, e.g. (42,) or (42, 1337, 2024)")
        if self.limit is not None and (not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit < 1):
            raise VerifyError(f"limit {self.limit!r}: the number of the suite's prompts to run, at least 1")
        set_("seeds", tuple(check_seeds(self.seeds, self.max_tokens)))
        ks = self.windows
        if ks[0] < 1:
            raise VerifyError(f"draft window {ks[0]}: --spec-draft-n-max must be at least 1")
        draft_n_min = self.window[1]
        if draft_n_min is not None and draft_n_min > ks[0]:
            raise VerifyError(f"draft_n_min {draft_n_min} exceeds the smallest draft window {ks[0]}")

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
