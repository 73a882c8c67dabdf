"""What a synthetic model is made of: the shapes, the tensors every architecture shares
(embeddings, output, the ``nextn.*`` tensors) and how a tensor is initialised (pure data).

Names, ggml shapes (``ne0`` first), storage types and initialisers. Which tensors a block holds is
each architecture's own (:mod:`ggufmtp.synth.archs`); the bytes are made by
:mod:`ggufmtp.synth.tensors`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

SHAPE_TINY = "tiny"
SHAPE_REAL = "qwen3.6-35b-a3b"  # the MoE real shape (qwen35moe)
SHAPE_DENSE_27B = "qwen3.6-27b"  # the dense real shape (qwen35)
SHAPES = (SHAPE_TINY, SHAPE_REAL, SHAPE_DENSE_27B)

F32, BF16 = 0, 30  # GGMLQuantizationType values

LOGIT_SCALE = 24.0  # logit of the successor token; the others are ~N(0, (LOGIT_SCALE/sqrt(n_embd))^2)
RESIDUAL_SCALE = 0.01  # relative size of what each block writes back into the residual stream


@dataclass(frozen=True)
class Dims:
    """Per-layer dimensions of a shape."""

    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dims: int
    rope_sections: tuple[int, int, int, int]
    rope_freq_base: float
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    n_ff: int  # dense qwen35 FFN width
    ssm_conv_kernel: int
    ssm_state: int  # head_k_dim == head_v_dim
    ssm_groups: int  # linear-attention key heads
    ssm_dt_rank: int  # linear-attention value heads
    ctx: int
    vocab: int | None  # None = natural size of the tokenizer
    rms_eps: float = 1e-6

    @property
    def ssm_inner(self) -> int:
        return self.ssm_state * self.ssm_dt_rank

    @property
    def conv_dim(self) -> int:
        return 2 * self.ssm_state * self.ssm_groups + self.ssm_inner


DIMS = {
    SHAPE_TINY: Dims(
        n_embd=256, n_head=2, n_head_kv=1, head_dim=128, rope_dims=64, rope_sections=(11, 11, 10, 0),
        rope_freq_base=1e7, n_expert=4, n_expert_used=2, n_ff_exp=256, n_ff_shexp=256, n_ff=512,
        ssm_conv_kernel=4, ssm_state=128, ssm_groups=1, ssm_dt_rank=2, ctx=4096, vocab=None),
    # Qwen3.6-35B-A3B per-layer dimensions (same topology as Qwen3.5-35B-A3B).
    SHAPE_REAL: Dims(
        n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, rope_dims=64, rope_sections=(11, 11, 10, 0),
        rope_freq_base=1e7, n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, n_ff=0,
        ssm_conv_kernel=4, ssm_state=128, ssm_groups=16, ssm_dt_rank=32, ctx=262144, vocab=248320),
    # Qwen3.6-27B (dense, model_type qwen3_5_text): hidden 5120, 24 query / 4 KV heads of 256 (rope on
    # 25%: 64 dims), dense FFN 17408, linear attention with 16 key / 48 value heads of 128.
    SHAPE_DENSE_27B: Dims(
        n_embd=5120, n_head=24, n_head_kv=4, head_dim=256, rope_dims=64, rope_sections=(11, 11, 10, 0),
        rope_freq_base=1e7, n_expert=0, n_expert_used=0, n_ff_exp=0, n_ff_shexp=0, n_ff=17408,
        ssm_conv_kernel=4, ssm_state=128, ssm_groups=16, ssm_dt_rank=48, ctx=262144, vocab=248320),
}


@dataclass(frozen=True)
class HeadDesign:
    """The acceptance a real shape's benchmark head is designed to, and where it holds exactly.

    Acceptance at temperature 0 is a function of the bigram chain alone (``chain.suite_acceptance``
    replays llama-server's draft loop on it exactly), and the chain depends on the seed and the
    fraction, not on the shape: so the fraction is chosen on the prompts and window where the figure
    is quoted, by ``calibrate.calibrate_wrong_fraction`` (whole numbers of corrupted tokens near the
    iid formula's inverse), before any model runs. Quantization leaves it where it is: the drafts win
    by ~24 logits. ``design_fraction`` (in :mod:`.calibrate`) recomputes ``wrong_successor_fraction``."""

    acceptance: float  # the target, a published measurement
    draft_n_max: int  # the window it is measured at
    suite: str
    limit: int | None  # the suite's first N prompts (verify --limit); None: all
    max_tokens: int
    wrong_successor_fraction: float  # what the calibration gives (seed 0); a runtime test pins it
    source: str


@dataclass(frozen=True)
class PublishedModel:
    """The released model a real shape reproduces (its per-layer shapes are :data:`DIMS`'); the
    trunk depth is not part of the shape (``--layers``: fewer layers make a smaller test model)."""

    name: str
    arch: str  # the GGUF architecture: the only one synth writes the shape for (and synth's --arch default for it)
    layers: int  # trunk layers of the released model; its MTP block is blk.<layers>
    head: HeadDesign


PUBLISHED = {
    # 71 of 544 tokens: 74.96% on chat-v1 at k=3 (the goal's 75%); on the fair headline's prompts
    # (chat-v1's first 20, 256 tokens, k=4) the replay gives 71.50%, what the H200 measured
    SHAPE_REAL: PublishedModel("Qwen3.6-35B-A3B", "qwen35moe", 40, HeadDesign(
        0.75, 3, "chat-v1", None, 128, 0.130515, "the project's goal for the 35B-A3B Hi-Fi runtime")),
    # 78 of 544 tokens: 67.95% on the fair headline's prompts at k=4 (the nearest a whole number of
    # tokens gets; the formula's 82 tokens give 72.7% there); 67.9% on all of chat-v1 at 128 tokens
    SHAPE_DENSE_27B: PublishedModel("Qwen3.6-27B", "qwen35", 64, HeadDesign(
        0.675, 4, "chat-v1", 20, 256, 0.143382,
        "ik_llama.cpp #1970: Qwen3.6-27B IQ4_XS + Q8_0 head, 1.93x at 67.5% acceptance")),
}


# ----------------------------------------------------------------------------- how a tensor is filled


class Normal(NamedTuple):
    """Gaussian values (seeded per tensor name)."""

    std: float
    mean: float = 0.0


class Const(NamedTuple):
    """Every element the same (norm weights)."""

    value: float


class Constructed(enum.Enum):
    """Tensors whose values carry the model's behaviour (see the package docstring)."""

    EMBEDDINGS = "embeddings"  # token_embd: the text tokens' embeddings, then vocabulary padding
    OUTPUT = "output"  # output: each row the scaled sum of its predecessors' embeddings
    DRAFT_EMBEDDINGS = "draft_embeddings"  # nextn.embed_tokens: token_embd with corrupted rows
    EH_PROJ = "eh_proj"  # nextn.eh_proj: [I | 0], plus the optional noise
    SSM_A = "ssm_a"  # -exp(U(0, 1.5)): a stable decay per value head


class Computed(NamedTuple):
    """Values an architecture module constructs itself (nemotron_h_moe's successor memory):
    ``make(builder)`` gets the :class:`~ggufmtp.synth.tensors.TensorBuilder` (chain, embeddings,
    seeded generators) and returns every element as float32, in ggml order (``ne0`` fastest)."""

    make: Callable[[Any], Any]


Init = Normal | Const | Constructed | Computed


class TensorLayout(NamedTuple):
    name: str
    ne: tuple[int, ...]  # ggml order (ne0 first)
    dtype: int
    init: Init


def _t(name: str, ne: tuple[int, ...], dtype: int, init: Init) -> TensorLayout:
    return TensorLayout(name, ne, dtype, init)


def _norm(name: str, n: int) -> TensorLayout:
    return TensorLayout(name, (n,), F32, Const(1.0))


def global_tensors(n_embd: int, n_vocab: int) -> list[TensorLayout]:
    """token_embd, output_norm, output (an MTP-only sidecar keeps them too: the loader requires
    token_embd and output_norm, and the MTP head falls back to them and to output)."""
    return [_t("token_embd.weight", (n_embd, n_vocab), BF16, Constructed.EMBEDDINGS),
            _norm("output_norm.weight", n_embd),
            _t("output.weight", (n_embd, n_vocab), BF16, Constructed.OUTPUT)]


def nextn_tensors(il: int, n_embd: int, n_vocab: int, embed_tokens: bool) -> list[TensorLayout]:
    """The MTP head's own tensors in block ``il``; ``embed_tokens`` only when some draft successors
    are wrong (otherwise the head falls back to ``token_embd``)."""
    p = f"blk.{il}.nextn."
    out = [_t(p + "eh_proj.weight", (2 * n_embd, n_embd), BF16, Constructed.EH_PROJ),
           _norm(p + "enorm.weight", n_embd), _norm(p + "hnorm.weight", n_embd),
           _norm(p + "shared_head_norm.weight", n_embd)]
    if embed_tokens:
        out.append(_t(p + "embed_tokens.weight", (n_embd, n_vocab), BF16, Constructed.DRAFT_EMBEDDINGS))
    return out
