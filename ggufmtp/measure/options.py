"""Server options of an MTP arm: :class:`TuneConfig`, one llama-server configuration with
``--spec-type draft-mtp`` (window, draft limits, backend sampling, slots, CUDA graph optimisation,
threads), as ``tune`` searches it and ``verify --tune`` / ``profiles --tuned`` apply it.

A leaf of :mod:`ggufmtp.measure`: it imports neither tune, verify nor profiles, so each of them can
import it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import TuneError

__all__ = ["CUDA_GRAPH_OPT_ENV", "TuneConfig"]

CUDA_GRAPH_OPT_ENV = "GGML_CUDA_GRAPH_OPT"  # read by ggml-cuda at 0c1e570; off unless set to 1


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

    def __post_init__(self) -> None:
        for name in ("draft_n_max", "draft_n_min", "parallel", "threads"):
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
        if self.threads is not None and self.threads < 1:
            raise TuneError(f"threads {self.threads}: must be at least 1")

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
        return s

    def extra_args(self) -> list[str]:
        """Flags beyond those :class:`ggufmtp.runtime.server.ServerConfig` writes itself."""
        out: list[str] = []
        if self.backend_sampling:
            out.append("-bs")
        if self.draft_backend_sampling is not None:
            out.append("--spec-draft-backend-sampling" if self.draft_backend_sampling
                       else "--no-spec-draft-backend-sampling")
        return out

    def env(self) -> dict[str, str]:
        """Environment variables the server needs for this configuration."""
        return {CUDA_GRAPH_OPT_ENV: "1"} if self.cuda_graph_opt else {}

    def server_fields(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (:class:`ServerConfig` fields shared with the vanilla arm) turned into the MTP
        server's: draft-mtp with this window, this configuration's flags appended (once: ``-bs`` may
        already be in ``base``), its environment added and its thread count in force."""
        kw = dict(base)
        shared = list(base.get("extra_args") or [])
        kw["extra_args"] = shared + [a for a in self.extra_args() if a not in shared]
        kw["env"] = {**(base.get("env") or {}), **self.env()} or None
        if self.threads is not None:
            kw["threads"] = self.threads
        kw.update(draft_mtp=True, draft_n_max=self.draft_n_max, draft_n_min=self.draft_n_min,
                  draft_p_min=self.draft_p_min)
        return kw

    def complexity(self) -> tuple:
        """Tie-break order: simpler first (fewer drafted tokens to verify, fewer non-default flags,
        more slots = less queueing)."""
        return (self.draft_n_max, self.draft_n_min, self.draft_p_min, bool(self.backend_sampling),
                self.draft_backend_sampling is False, bool(self.cuda_graph_opt), self.threads is not None,
                -self.parallel)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every field, then ``key``."""
        d = dataclasses.asdict(self)
        d["key"] = self.key
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TuneConfig":
        """The configuration of a :meth:`to_dict` object (unknown keys such as ``key`` ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def coerce(cls, value: Any) -> "TuneConfig":
        """``value`` as a configuration: a TuneConfig or its dict (e.g. tune's recommendation)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            try:
                return cls.from_dict(value)
            except (TypeError, ValueError) as e:
                raise TuneError(f"tuned configuration {value!r}: {e}") from e
        raise TuneError(f"tuned: expected a TuneConfig or its dict, got {type(value).__name__}")
