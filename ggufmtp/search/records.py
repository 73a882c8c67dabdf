"""The search's nouns (issue #43): tensor groups, candidate types, measured costs, allocations.

One record per noun, shared by the measuring side (:mod:`.groups`, :mod:`.measure`) and the
allocating side (:mod:`.allocate`, :mod:`.prove`, :mod:`.report`). A group is a set of tensors
that get one type together (a role over a range of layers, or one part of the MTP head); its
``pattern`` is a recipe rule's pattern (llama-quantize's ``--tensor-type`` semantics, ``{mtp}``
allowed), so an allocation is an ordinary recipe: one ``[[rules]]`` entry per group.

A cost is measured with every *other* tensor at the baseline type (the model quantized at the
baseline recipe) and only this group at the candidate type: ``kld`` is the mean KL divergence
against the BF16 source on the held-out corpus, ``chunk_kld`` the per-chunk means (so two costs
measured on the same chunks can be paired), and for the head and the last trunk layers
``acceptance_diff`` the paired acceptance difference against the reference (the verdict's
relative judgment, :mod:`ggufmtp.provenance.head`). ``None`` means "not measured", never zero.
"""

from __future__ import annotations

import dataclasses
import enum


class GroupRole(enum.Enum):
    """What a group's tensors do; the allocator's constraints and the report's rows use it."""

    ATTENTION = "attention"
    ROUTED_EXPERTS = "routed_experts"
    SHARED_EXPERT = "shared_expert"
    GATES = "gates"  # router/gate inputs (ffn_gate_inp*): usually kept high
    DENSE_FFN = "dense_ffn"
    RECURRENT = "recurrent"  # linear-attention / SSM tensors of hybrid trunks
    TOKEN_EMBEDDING = "token_embedding"
    OUTPUT = "output"
    MTP_EH_PROJ = "mtp_eh_proj"
    MTP_ATTENTION = "mtp_attention"
    MTP_EXPERTS = "mtp_experts"
    MTP_REST = "mtp_rest"

    @property
    def is_head(self) -> bool:
        return self.name.startswith("MTP_")


@dataclasses.dataclass(frozen=True)
class TensorGroup:
    """Tensors quantized to one type together."""

    name: str                 # stable and human: "attn.0-1", "routed_experts.2-3", "mtp.eh_proj"
    role: GroupRole
    pattern: str              # a recipe rule's pattern; matches exactly ``tensors`` in this model
    tensors: tuple[str, ...]  # the GGUF tensor names it covers
    n_params: int             # elements over all its tensors
    # the MTP head reads these tensors too (``output`` when the head has no shared_head_head of its
    # own, ``token_embd`` when it has no embed_tokens): their type moves acceptance as the head's does
    head_reads: bool = False

    @property
    def drafts(self) -> bool:
        """Whether the group's type moves the head's acceptance directly: a head part, or a tensor it reads."""
        return self.role.is_head or self.head_reads


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One group at one type; ``n_bytes`` is what the group's tensors take at that type."""

    group: str
    qtype: str
    n_bytes: int


@dataclasses.dataclass(frozen=True)
class Cost:
    """What a candidate costs in quality, measured against the baseline (see the module doc)."""

    candidate: Candidate
    kld: float
    kld_ci: tuple[float, float]
    chunk_kld: tuple[float, ...]
    same_top_p: float | None = None
    acceptance_diff: float | None = None
    acceptance_ci: tuple[float, float] | None = None


@dataclasses.dataclass(frozen=True)
class SensitivityTable:
    """Every cost measured for one model, corpus and baseline; content-addressed by its inputs."""

    model_sha256: str
    corpus: str
    baseline_recipe: str
    baseline_kld: float
    baseline_chunk_kld: tuple[float, ...]
    groups: tuple[TensorGroup, ...]
    costs: tuple[Cost, ...]

    def cost(self, group: str, qtype: str) -> Cost | None:
        return next((c for c in self.costs if c.candidate.group == group and c.candidate.qtype == qtype), None)


@dataclasses.dataclass(frozen=True)
class Budget:
    """The size to fit: total bytes of the quantized tensors, or bits per weight over all of them."""

    n_bytes: int | None = None
    bpw: float | None = None


@dataclasses.dataclass(frozen=True)
class Allocation:
    """One type per group, the predicted size and cost, and the recipe it becomes."""

    types: tuple[tuple[str, str], ...]  # (group name, type), in the table's group order
    n_bytes: int
    predicted_kld: float
    predicted_acceptance_diff: float | None
    n_params: int = 0          # elements over every group's tensors (bpw = 8 * n_bytes / n_params)
    budget_bytes: int = 0      # the budget it was allocated under, in bytes over the groups' tensors
    method: str = ""           # how it was found (the allocator's name), for the recipe's [search] table
    excluded: tuple[tuple[str, str, str], ...] = ()  # (group, type, why) left out by the floors

    @property
    def bpw(self) -> float:
        return 8.0 * self.n_bytes / self.n_params if self.n_params else 0.0
