"""One tuned llama-server configuration and the split of a comparison's settings by arm:
:class:`TuneConfig`, one llama-server configuration with ``--spec-type draft-mtp`` (window, draft
limits, backend sampling, slots, CUDA graph optimisation, threads), as ``tune`` searches it and
``verify --tune`` / ``profiles --tuned`` apply it; and :class:`ArmArgs`, which splits every server
setting of a comparison by the arm that gets it (the fair baseline: see :mod:`.options`).
Re-exported by :mod:`.options`, which the rest of the package imports."""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import TuneError, VerifyError

__all__ = ["CUDA_GRAPH_OPT_ENV", "TuneConfig", "ArmArgs", "is_speculative", "flag_names", "split_args", "tuned_window"]

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
