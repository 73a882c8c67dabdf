"""Partial offload of the verification's servers, given to every arm alike (:class:`Offload`:
``--override-tensor``, ``--cpu-moe``, ``--n-cpu-moe``), and the refusal of llama-server's ``--fit``
(:func:`check_fit_args`), which would size each arm to the memory free when it starts. The flags
are spelled as ``common/arg.cpp`` spells them at 0c1e570; :class:`~ggufmtp.measure.core.options.ServerOptions`
writes them into every arm's command line and :mod:`ggufmtp.runtime.memory` places the
tensors by them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import VerifyError

__all__ = ["FFN_EXPS_REGEX", "Offload", "check_fit_args"]

#: the regex ``--cpu-moe`` / ``--n-cpu-moe`` use (common/common.h: LLM_FFN_EXPS_REGEX)
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


@dataclass(frozen=True)
class Offload:
    """Partial offload, given to every arm alike: ``-ot PATTERN=BUFT`` entries (in order),
    ``--cpu-moe`` (every MoE expert tensor in host memory), ``--n-cpu-moe N`` (those of layers
    0..N-1). llama.cpp takes the first pattern that matches a tensor's name; :meth:`args` writes
    them in the order :meth:`rules` reads them."""

    override_tensor: tuple[str, ...] = ()
    cpu_moe: bool = False
    n_cpu_moe: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "override_tensor", tuple(str(o) for o in self.override_tensor or ()))
        if self.n_cpu_moe is not None and (isinstance(self.n_cpu_moe, bool) or not isinstance(self.n_cpu_moe, int)
                                           or self.n_cpu_moe < 0):
            raise VerifyError(f"n_cpu_moe {self.n_cpu_moe!r}: must be a whole number >= 0")
        for entry in self.override_tensor:
            for one in entry.split(","):
                pattern, eq, buft = one.partition("=")
                if not eq or not pattern or not buft:
                    raise VerifyError(f"--override-tensor {entry!r}: expected PATTERN=BUFFER_TYPE (e.g. 'exps=CPU')")
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise VerifyError(f"--override-tensor {entry!r}: bad pattern: {e}") from None

    def __bool__(self) -> bool:
        return bool(self.override_tensor or self.cpu_moe or self.n_cpu_moe)

    def args(self) -> list[str]:
        """The llama-server flags (spelled as ``common/arg.cpp`` at 0c1e570 does)."""
        out = [a for o in self.override_tensor for a in ("--override-tensor", o)]
        out += ["--cpu-moe"] if self.cpu_moe else []
        out += ["--n-cpu-moe", str(self.n_cpu_moe)] if self.n_cpu_moe else []
        return out

    def rules(self) -> list[tuple[re.Pattern[str], int | None]]:
        """(pattern, GPU index or None for host memory), in llama.cpp's order of precedence."""
        out: list[tuple[re.Pattern[str], int | None]] = []
        for entry in self.override_tensor:
            for one in entry.split(","):
                pattern, _, buft = one.partition("=")
                m = re.fullmatch(r"(?:CUDA|ROCm|Vulkan|SYCL|MTL)(\d+)", buft)
                out.append((re.compile(pattern), int(m.group(1)) if m else None))
        if self.cpu_moe:
            out.append((re.compile(FFN_EXPS_REGEX), None))
        for il in range(self.n_cpu_moe or 0):
            out.append((re.compile(rf"blk\.{il}{FFN_EXPS_REGEX}"), None))
        return out

    @property
    def keeps_host_weights(self) -> bool:
        """Whether a rule keeps weights in host memory (``--cpu-moe``, ``--n-cpu-moe``, ``-ot ...=CPU``):
        their matmuls then run on the CPU, which bounds what speculative decoding can gain."""
        return any(device is None for _, device in self.rules())

    @classmethod
    def of_record(cls, d: Any) -> Offload | None:
        """The offload a verification records (``settings.offload``); None for none or a record that
        does not parse (a reader then takes the model as GPU-resident: the stricter reading)."""
        if not isinstance(d, dict):
            return None
        try:
            ot, n = d.get("override_tensor") or (), d.get("n_cpu_moe")
            return cls(tuple(ot) if isinstance(ot, (list, tuple)) else (), d.get("cpu_moe") is True,
                       n if isinstance(n, int) and not isinstance(n, bool) else None)
        except VerifyError:
            return None

    def to_dict(self) -> dict[str, Any]:
        return {"override_tensor": list(self.override_tensor), "cpu_moe": self.cpu_moe, "n_cpu_moe": self.n_cpu_moe}


_FIT_FLAGS = ("--fit", "-fit", "--fit-target", "-fitt", "--fit-ctx", "-fitc")


def check_fit_args(args: Iterable[str], where: str) -> None:
    """VerifyError for a ``--fit`` option among ``args``: llama-server's fit adjusts each server to
    the memory free when it starts, so arms started one after another would be configured
    differently. ggufmtp passes ``--fit off`` and sets the offload explicitly for every arm."""
    for a in args:
        if a.split("=", 1)[0] in _FIT_FLAGS:
            raise VerifyError(f"{where} {a}: --fit sizes each server to the memory free when it starts, so the arms "
                              "would differ; set the offload for every arm with --gpu-layers, --n-cpu-moe, --cpu-moe "
                              "or --override-tensor (the memory plan checks that it fits)")
