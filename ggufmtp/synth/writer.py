"""Write a synthetic model: the GGUF header, then every tensor streamed through the one atomic writer."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ..errors import SynthError
from ..files.fsutil import atomic_write_parts
from ..progress import bar as progress_bar
from .archs.registry import arch_for
from .chain import effective_draft_n_max, realized_fraction
from .layout import F32
from .metadata import add_metadata
from .spec import SynthSpec, expected_acceptance
from .tensors import TensorBuilder, TensorPlan
from .tokenizer import Vocab


@dataclass(frozen=True)
class SynthResult:
    """What :func:`synthesize` wrote."""

    path: Path
    spec: SynthSpec
    mtp_block: int | None
    n_tensors: int
    size_bytes: int
    sha256: str | None = None

    @property
    def servable(self) -> bool:
        """Whether llama-server 0c1e570 can run this file on its own (see
        :meth:`~ggufmtp.synth.archs.SynthArch.unservable_reason`)."""
        return arch_for(self.spec.arch).servable(self.spec)

    @property
    def mtp_blocks(self) -> list[int]:
        """Every MTP block (several where the architecture chains heads)."""
        return self.spec.mtp_blocks

    @property
    def realized_wrong_fraction(self) -> float:
        """The exact fraction of text tokens whose draft successor is wrong in this file."""
        return realized_fraction(self.spec)

    def expected_acceptance(self, draft_n_max: int) -> float:
        """:func:`~ggufmtp.synth.spec.expected_acceptance` at the fraction actually written (``round(f*n)/n``);
        0 without an MTP block. It ignores ``eh_proj_noise`` (no closed form; noise only lowers it)."""
        if self.mtp_block is None:
            return 0.0
        # several heads draft at most one token each (chain.effective_draft_n_max)
        return expected_acceptance(self.realized_wrong_fraction, effective_draft_n_max(self.spec, draft_n_max))

    def to_dict(self) -> dict:
        return {
            "path": str(self.path),
            "spec": self.spec.to_dict(),
            "mtp_block": self.mtp_block,
            "mtp_blocks": self.mtp_blocks,
            "n_tensors": self.n_tensors,
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "servable": self.servable,
            "realized_wrong_fraction": self.realized_wrong_fraction,
            "expected_acceptance": {str(k): self.expected_acceptance(k) for k in range(1, 5)},
        }


def plan(spec: SynthSpec) -> list[TensorPlan]:
    """The tensors ``synthesize`` would write (names, ggml shapes, types), without any data."""
    spec.validate()
    return TensorBuilder(spec).plans()


def synthesize(out: str | os.PathLike, spec: SynthSpec = SynthSpec(), *, progress: bool = True,
               sha256: bool = True) -> SynthResult:
    """Write the model described by ``spec`` to ``out``, streamed tensor by tensor (bounded memory)
    through :func:`ggufmtp.files.fsutil.atomic_write_parts`: an interruption leaves nothing behind.

    The writer hashes what it writes; ``sha256=False`` only leaves the digest out of the result."""
    spec.validate()
    out = Path(out)
    builder = TensorBuilder(spec)
    plans = builder.plans()
    header, align = gguf_header(spec, builder.vocab, plans)
    digest = atomic_write_parts(out, _file_parts(out.name, header, align, plans, progress))
    return SynthResult(path=out, spec=spec, mtp_block=spec.layers if spec.mtp else None,
                       n_tensors=len(plans), size_bytes=out.stat().st_size, sha256=digest if sha256 else None)


def gguf_header(spec: SynthSpec, vocab: Vocab, plans: list[TensorPlan]) -> tuple[bytes, int]:
    """The GGUF header, key/values and tensor infos of the model, and its data alignment."""
    w = gguf.GGUFWriter(path=None, arch=spec.arch)
    add_metadata(w, spec, vocab)
    for p in plans:
        w.add_tensor_info(p.name, tuple(reversed(p.ne)), np.dtype(np.float32 if p.dtype == F32 else np.float16),
                          p.nbytes, raw_dtype=gguf.GGMLQuantizationType(p.dtype))
    buf = io.BytesIO()
    # GGUFWriter opens its output by path only; hand it an in-memory one, in the state open_output_file sets
    w.fout, w.state = [buf], gguf.WriterState.EMPTY
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return buf.getvalue(), w.data_alignment


def _file_parts(name: str, header: bytes, align: int, plans: list[TensorPlan], progress: bool) -> Iterator[bytes]:
    """The whole file as byte chunks: the header, then each tensor padded to ``align``."""
    pos = len(header)
    yield header
    with progress_bar(sum(p.nbytes for p in plans), f"synth {name}", "B", enabled=progress, unit_scale=True) as bar:
        for p in plans:
            if pad := (-pos) % align:
                yield b"\x00" * pad
                pos += pad
            written = 0
            for chunk in p.chunks():
                b = memoryview(np.ascontiguousarray(chunk)).cast("B")
                yield b
                written += len(b)
                bar.update(len(b))
            if written != p.nbytes:
                raise SynthError(f"internal error: {p.name} wrote {written} bytes, expected {p.nbytes}")
            pos += written
        if pad := (-pos) % align:
            yield b"\x00" * pad

