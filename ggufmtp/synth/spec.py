"""What to synthesize (:class:`SynthSpec`), its seeded generators, and the acceptance it should give."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import SynthError
from .layout import ARCHES, LOGIT_SCALE, SHAPE_REAL, SHAPE_TINY, SHAPES, mtp_block_suffixes

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

    def validate(self) -> None:
        """Raise :class:`SynthError` naming the first knob out of range."""
        if self.arch not in ARCHES:
            raise SynthError(f"arch {self.arch!r}: must be one of {', '.join(ARCHES)}")
        if self.shape not in SHAPES:
            raise SynthError(f"shape {self.shape!r}: must be one of {', '.join(SHAPES)}")
        if self.shape == SHAPE_REAL and self.arch != "qwen35moe":
            raise SynthError(f"shape {SHAPE_REAL!r} is the MoE Qwen3.6-35B-A3B; use arch qwen35moe")
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
        suffixes = mtp_block_suffixes(self.arch, self.shape)
        for t in self.omit_tensors:
            if t.removesuffix(".weight").removesuffix(".bias") not in suffixes:
                raise SynthError(
                    f"omit_tensors: {t!r} is not a tensor of the MTP block; choose among {', '.join(suffixes)}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["omit_tensors"] = list(self.omit_tensors)
        for knob, default in (("head_margin", 0.0), ("logit_scale", LOGIT_SCALE)):
            if d[knob] == default:
                del d[knob]
        return d

    def digest(self) -> str:
        """sha256 of the spec and the synth version: the identity of the bytes it makes."""
        blob = json.dumps({"v": SYNTH_VERSION, **self.to_dict()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def spec_rng(spec: SynthSpec, *key: int | str) -> np.random.Generator:
    """The generator for one named part of a spec's model: the same seed and key give the same values."""
    words = [spec.seed & 0xFFFFFFFF, spec.seed >> 32]
    for k in key:
        words.append(zlib.crc32(k.encode()) if isinstance(k, str) else int(k) & 0xFFFFFFFF)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def full_attention_interval(spec: SynthSpec) -> int:
    """4 (layers 0-2 Gated DeltaNet, 3 full attention, ...), or ``layers`` when there are 2 or 3
    trunk layers: llama.cpp 0c1e570 aborts at warm-up (``GGML_ASSERT(buffer)`` in the hybrid
    memory's ``set_input``) on a trunk without any attention layer, and equally on one without any
    recurrent layer -- so a 1-layer model (written with interval 4: one DeltaNet layer) loads in
    the GGUF tools but llama-server cannot run it (:attr:`SynthResult.servable` is False)."""
    return 4 if spec.layers == 1 else min(4, spec.layers)


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
