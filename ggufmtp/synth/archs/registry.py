"""The registry of synthesizable architectures: every module of :mod:`ggufmtp.synth.archs` that defines ``ARCHES``."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from ...errors import SynthError
from . import __path__ as _ARCHS_PATH
from .base import SynthArch

__all__ = ["SynthArch", "arch_for", "arch_names"]


@lru_cache(maxsize=1)
def _registry() -> dict[str, SynthArch]:
    found: dict[str, SynthArch] = {}
    for mod in pkgutil.iter_modules(_ARCHS_PATH):
        if mod.name in ("base", "registry") or mod.name.startswith("_"):
            continue
        for arch in getattr(importlib.import_module(f"{__package__}.{mod.name}"), "ARCHES", ()):
            found[arch.name] = arch
    # the two Qwen3.5 archs first (the defaults), then alphabetical
    return dict(sorted(found.items(), key=lambda kv: (not kv[0].startswith("qwen35"), kv[0])))


def arch_names() -> tuple[str, ...]:
    """Every architecture synth can write, ``qwen35moe`` first."""
    return tuple(_registry())


def arch_for(name: str) -> SynthArch:
    """The synthesizer of architecture ``name``; :class:`SynthError` naming the choices otherwise."""
    try:
        return _registry()[name]
    except KeyError:
        raise SynthError(f"arch {name!r}: must be one of {', '.join(arch_names())}") from None
