"""What to synthesize (:class:`SynthSpec`), its seeded generators, and the acceptance it should give."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import SynthError
from .archs.registry import arch_for
from .layout import LOGIT_SCALE, SHAPE_TINY, SHAPES

SYNTH_VERSION = 1  # bump when the bytes written for a given spec change (invalidates builtin caches)


@dataclass(frozen=True)
class SynthSpec:
    """What to synthesize. See the :mod:`ggufmtp.synth` docstring for the meaning of the knobs."""

    arch: str = "qwen35moe"
    shape: str = SHAPE_TINY
    layers: int = 4
    mtp: bool = True
    seed: int = 0
    wrong_successor_fraction: float = 0.0
    eh_proj_noise: float = 0.0
    omit_tensors: tuple[str, ...] = ()
    mtp_only: bool = False
    # Knobs added later; left out of to_dict() at their defaults so older specs keep their digests.
    head_margin: float = 0.0  # > 0: the head's drafts win by only this many logits (reacts to quantization)
    logit_scale: float = LOGIT_SCALE  # the successor's logit; lower = softer distributions (KLD > 0 when quantized)
    mtp_layers: int = 1  # MTP blocks (nextn_predict_layers) when mtp; > 1 only where the arch chains heads

    @property
    def n_mtp_blocks(self) -> int:
        """``nextn_predict_layers``: ``mtp_layers``, or 0 without an MTP block."""
        return self.mtp_layers if self.mtp else 0

    @property
    def mtp_blocks(self) -> list[int]:
        """Indices of the MTP blocks (after the ``layers`` trunk blocks)."""
        return list(range(self.layers, self.layers + self.n_mtp_blocks))

    def validate(self) -> None:
        """Raise :class:`SynthError` naming the first knob out of range."""
        arch = arch_for(self.arch)  # SynthError naming the architectures
        if self.shape not in SHAPES:
            raise SynthError(f"shape {self.shape!r}: must be one of {', '.join(SHAPES)}")
        if self.shape not in arch.shapes:
            raise SynthError(f"shape {self.shape!r} is not written for arch {self.arch} (it has: {', '.join(arch.shapes)})")
        if not 1 <= self.mtp_layers <= arch.max_mtp_layers:
            raise SynthError(f"mtp_layers {self.mtp_layers}: arch {self.arch} takes 1"
                             + (f" to {arch.max_mtp_layers}" if arch.max_mtp_layers > 1 else " (one MTP block)"))
        if not 1 <= self.layers <= 200:
            raise SynthError(f"layers {self.layers}: must be between 1 and 200")
        if not 0.0 <= self.wrong_successor_fraction <= 1.0:
            raise SynthError(f"wrong_successor_fraction {self.wrong_successor_fraction}: must be in [0, 1]")
        if not 0.0 <= self.eh_proj_noise <= 100.0:
            raise SynthError(f"eh_proj_noise {self.eh_proj_noise}: must be in [0, 100]")
        if not 0.0 <= self.head_margin <= 20.0:
            raise SynthError(f"head_margin {self.head_margin}: must be in [0, 20] logits")
        if not 1.0 <= self.logit_scale <= 64.0:
            raise SynthError(f"logit_scale {self.logit_scale}: must be in [1, 64]")
        if not 0 <= self.seed < 2**63:
            raise SynthError(f"seed {self.seed}: must be a non-negative 63-bit integer")
        self._validate_mtp_knobs()

    def _validate_mtp_knobs(self) -> None:
        if not self.mtp and (self.wrong_successor_fraction or self.eh_proj_noise or self.omit_tensors
                             or self.mtp_only or self.head_margin):
            raise SynthError("mtp=False: the MTP knobs (wrong successors, eh_proj noise, omitted "
                             "tensors, mtp_only) need the MTP block")
        suffixes = mtp_block_suffixes(self)
        for t in self.omit_tensors:
            if t not in suffixes and t.removesuffix(".weight").removesuffix(".bias") not in suffixes:
                raise SynthError(
                    f"omit_tensors: {t!r} is not a tensor of the MTP block; choose among {', '.join(suffixes)}")
        knob_carrier = "nextn.embed_tokens"  # the corrupted rows and the margin's competitors live there
        if (self.wrong_successor_fraction or self.head_margin) and \
                {knob_carrier, knob_carrier + ".weight"} & set(self.omit_tensors):
            raise SynthError(f"omit_tensors: {knob_carrier} carries the wrong-successor fraction and the head "
                             f"margin; omitting it would leave the head agreeing with the trunk")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["omit_tensors"] = list(self.omit_tensors)
        for knob, default in (("head_margin", 0.0), ("logit_scale", LOGIT_SCALE), ("mtp_layers", 1)):
            if d[knob] == default:
                del d[knob]
        return d

    def digest(self) -> str:
        """sha256 of the spec and the synth version: the identity of the bytes it makes."""
        blob = json.dumps({"v": SYNTH_VERSION, **self.to_dict()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def mtp_block_suffixes(spec: SynthSpec) -> list[str]:
    """Names (without ``blk.N.`` and ``.weight``) of every tensor an MTP block of ``spec``'s arch can hold."""
    a = arch_for(spec.arch)
    names = [t.name for t in a.mtp_block(0, spec) + a.nextn(0, spec, 0, True)]
    return [nm.removeprefix("blk.0.").removesuffix(".weight") for nm in names]


def spec_rng(spec: SynthSpec, *key: int | str) -> np.random.Generator:
    """The generator for one named part of a spec's model: the same seed and key give the same values."""
    words = [spec.seed & 0xFFFFFFFF, spec.seed >> 32]
    for k in key:
        words.append(zlib.crc32(k.encode()) if isinstance(k, str) else int(k) & 0xFFFFFFFF)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def expected_acceptance(wrong_successor_fraction: float, draft_n_max: int) -> float:
    """Draft acceptance (accepted / drafted) at temperature 0 for a model made with
    ``wrong_successor_fraction = f``: ``(sum_{i=1..k} (1-f)^i) / k`` at ``draft_n_max = k``.

    Derivation: each draft chains on the previous drafted token; draft ``i`` is accepted iff the
    ``i`` chain tokens before it are all uncorrupted (probability ``(1-f)^i``), and the next draft
    starts at a token not visited before, so accepted lengths are independent with mean
    ``sum_i (1-f)^i``. Holds for long replies (see the package docstring for the end-of-reply cap).
    """
    if draft_n_max < 1:
        raise ValueError("draft_n_max must be >= 1")
    q = 1.0 - float(wrong_successor_fraction)
    return sum(q**i for i in range(1, draft_n_max + 1)) / draft_n_max
