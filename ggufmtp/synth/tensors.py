"""The bytes of every tensor of a synthetic model, generated lazily chunk by chunk (bounded memory).

Small tensors draw from a PCG64 generator seeded by the spec and the tensor's name; tensors over
4 Mi elements (the real shapes' experts, FFNs and vocabulary padding) tile a seeded 8 MB noise bank --
cheap and deterministic, and never part of the bigram path.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from .archs.registry import arch_for
from .chain import chain_for
from .layout import BF16, F32, Computed, Const, Constructed, Normal, TensorLayout
from .spec import SynthSpec, spec_rng
from .tokenizer import build_vocab

BIG_TENSOR_ELEMS = 1 << 22  # tensors larger than this (and vocab padding) tile the noise bank
BANK_ELEMS = 4_194_301  # prime, so the tiling never lines up with row lengths
CHUNK_BYTES = 32 << 20


@dataclass
class TensorPlan:
    """One tensor to write: its GGUF tensor info, and a callable that yields its data in chunks."""

    name: str
    ne: tuple[int, ...]  # ggml order (ne0 first)
    dtype: int
    chunks: Callable[[], Iterator[np.ndarray]] = field(repr=False)

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        return self.n_elements * (4 if self.dtype == F32 else 2)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32."""
    return (b.astype(np.uint32) << 16).view(np.float32)


class TensorBuilder:
    """Turns a spec's tensor layout into :class:`TensorPlan` s; :meth:`plans` is the whole model."""

    def __init__(self, spec: SynthSpec):
        self.spec = spec
        self.arch = arch_for(spec.arch)
        self.d = self.arch.dims(spec)
        self.vocab = build_vocab(spec.shape)
        self.chain = chain_for(spec)
        self._banks: dict[float, np.ndarray] = {}
        self._embd: np.ndarray | None = None

    # --- the model
    def plans(self) -> list[TensorPlan]:
        """Every tensor, in file order: globals, the trunk blocks, then the MTP blocks."""
        s, a = self.spec, self.arch
        layout = a.global_tensors(s, len(self.vocab)) + a.extra_globals(s)
        if not s.mtp_only:
            for il in range(s.layers):
                layout += a.trunk_block(il, s)
        embed_tokens = s.wrong_successor_fraction > 0 or s.head_margin > 0
        for il in s.mtp_blocks:  # omit_tensors applies to each of them
            mtp = a.mtp_block(il, s) + a.nextn(il, s, len(self.vocab), embed_tokens)
            omit = {f"blk.{il}.{t}" for t in s.omit_tensors} | {f"blk.{il}.{t}.weight" for t in s.omit_tensors}
            layout += [t for t in mtp if t.name not in omit]
        return [self.plan_for(t) for t in layout]

    def plan_for(self, t: TensorLayout) -> TensorPlan:
        if isinstance(t.init, Normal):
            return self.normal(t.name, t.ne, t.init.std, t.dtype, t.init.mean)
        if isinstance(t.init, Const):
            return self.const(t.name, t.ne, t.init.value, t.dtype)
        if isinstance(t.init, Computed):
            return self.computed(t.name, t.ne, t.dtype, t.init.make)
        constructed: dict[Constructed, Callable[[], Iterator[np.ndarray]]] = {
            Constructed.EMBEDDINGS: lambda: self.vocab_rows("token_embd.weight", self.embeddings, 1.0),
            Constructed.OUTPUT: lambda: self.vocab_rows("output.weight", self.output_rows, 0.02),
            # same padding as token_embd: only the corrupted text rows differ
            Constructed.DRAFT_EMBEDDINGS: lambda: self.vocab_rows("token_embd.weight", self.draft_embeddings, 1.0),
            Constructed.EH_PROJ: lambda: self.eh_proj(t.name.removesuffix(".weight")),
            Constructed.SSM_A: lambda: self.ssm_a(t.name, t.ne[0]),
        }
        return TensorPlan(t.name, t.ne, t.dtype, constructed[t.init])

    # --- data sources
    def bank(self, std: float) -> np.ndarray:
        if std not in self._banks:
            z = spec_rng(self.spec, "bank").standard_normal(BANK_ELEMS, dtype=np.float32)
            self._banks[std] = to_bf16(z * np.float32(std))
        return self._banks[std]

    def tiled(self, name: str, n: int, std: float) -> Iterator[np.ndarray]:
        bank = self.bank(std)
        off = zlib.crc32(name.encode()) % BANK_ELEMS
        while n > 0:
            take = min(n, BANK_ELEMS - off)
            yield bank[off: off + take]
            n -= take
            off = 0

    def normal(self, name: str, ne: tuple[int, ...], std: float, dtype: int, mean: float = 0.0) -> TensorPlan:
        n = math.prod(ne)

        def chunks() -> Iterator[np.ndarray]:
            if dtype == BF16 and n > BIG_TENSOR_ELEMS:
                yield from self.tiled(name, n, std)
                return
            rng = spec_rng(self.spec, name)
            left = n
            step = CHUNK_BYTES // 4
            while left > 0:
                k = min(left, step)
                z = rng.standard_normal(k, dtype=np.float32) * np.float32(std) + np.float32(mean)
                yield z if dtype == F32 else to_bf16(z)
                left -= k

        return TensorPlan(name, ne, dtype, chunks)

    def const(self, name: str, ne: tuple[int, ...], value: float, dtype: int = F32) -> TensorPlan:
        def chunks() -> Iterator[np.ndarray]:
            z = np.full(math.prod(ne), value, dtype=np.float32)
            yield z if dtype == F32 else to_bf16(z)

        return TensorPlan(name, ne, dtype, chunks)

    def computed(self, name: str, ne: tuple[int, ...], dtype: int, make: Callable[[TensorBuilder], np.ndarray]) -> TensorPlan:
        def chunks() -> Iterator[np.ndarray]:
            z = np.ascontiguousarray(make(self), dtype=np.float32).reshape(-1)
            yield z if dtype == F32 else to_bf16(z)

        return TensorPlan(name, ne, dtype, chunks)

    # --- the constructed tensors
    def embeddings(self) -> np.ndarray:
        """float32 [n_text_vocab, n_embd], already rounded to bf16 (what the file holds)."""
        if self._embd is None:
            z = spec_rng(self.spec, "token_embd").standard_normal((self.vocab.n_text_vocab, self.d.n_embd),
                                                                  dtype=np.float32)
            self._embd = from_bf16(to_bf16(z)).reshape(z.shape)
        return self._embd

    def draft_embeddings(self) -> np.ndarray:
        """``nextn.embed_tokens``' text rows: each corrupted token carries another token's embedding;
        with ``head_margin``, each row also mixes in a competitor's (see :mod:`.margins`)."""
        rows = self.embeddings()[self.chain.embed_source]
        if self.spec.head_margin > 0:
            from .margins import with_competitors

            rows = with_competitors(rows, self.embeddings(), self.output_rows(), self.chain, self.spec.head_margin,
                                    spec_rng(self.spec, "competitors"))
        return rows

    def output_rows(self) -> np.ndarray:
        """``output[y] = (24/n_embd) * sum_{x: s(x)=y} embed(x)``: the successor wins by a wide margin."""
        e = self.embeddings()
        rows = np.zeros_like(e)
        np.add.at(rows, self.chain.successor, e)
        return rows * np.float32(self.spec.logit_scale / self.d.n_embd)

    def vocab_rows(self, name: str, text_rows: Callable[[], np.ndarray], pad_std: float) -> Iterator[np.ndarray]:
        yield to_bf16(text_rows()).reshape(-1)
        n_pad = (len(self.vocab) - self.vocab.n_text_vocab) * self.d.n_embd
        if n_pad:
            yield from self.tiled(name + ".pad", n_pad, pad_std)

    def eh_proj(self, key: str) -> Iterator[np.ndarray]:
        """``[I | 0]``: passes the embedding half of ``[enorm(embed) ; hnorm(hidden)]`` through."""
        s, n = self.spec, self.d.n_embd
        m = np.zeros((n, 2 * n), dtype=np.float32)  # numpy [out, in]: out = m @ [e; h]
        m[np.arange(n), np.arange(n)] = 1.0
        if s.eh_proj_noise:
            noise = spec_rng(s, key).standard_normal(m.shape, dtype=np.float32)
            m += noise * np.float32(s.eh_proj_noise / math.sqrt(2 * n))
        yield to_bf16(m).reshape(-1)

    def ssm_a(self, name: str, n: int) -> Iterator[np.ndarray]:
        yield -np.exp(spec_rng(self.spec, name).uniform(0, 1.5, n)).astype(np.float32)
