"""A model's quantizable tensors in groups, and each group's candidate types with their sizes (issue #43).

A group is the tensors of one role over a range of layers (:class:`~.records.GroupRole`): the
attention of trunk layers 0-1, the routed experts of layers 2-3, the recurrent (linear-attention /
SSM) tensors of a hybrid trunk's layers, the token embedding, the output, and the MTP head's parts
(``nextn.eh_proj``, its attention, its routed experts, the rest). ``token_embd`` and ``output`` are
marked ``head_reads`` when the head has no embedding or output of its own and llama.cpp gives it
these (:func:`ggufmtp.gguf.model.check_mtp`'s fallbacks): the allocator floors them as it floors the
head. Every tensor llama-quantize would
quantize (:func:`ggufmtp.imatrix.check.is_quantizable`: 2-D and wider, not a norm, router or conv)
is in exactly one group; the routers (``ffn_gate_inp*``) are not quantized by llama.cpp, so they are
in none (a quantizable tensor of that name elsewhere would be a ``gates`` group of its own).

Each group's ``pattern`` is a recipe rule's (llama-quantize's ``--tensor-type`` semantics: lower-cased,
searched unanchored, ``{mtp}`` for the head's blocks) and is checked with the recipe's own matcher
(:class:`~ggufmtp.quant.recipe.Rule`) to match exactly the group's tensors in this model: anchored
``^...$``, compact (``^blk\\.(0|1)\\.ffn_(down|gate|up)_exps\\.weight$``) where that is exact, the
alternation of the names otherwise.

A type llama.cpp cannot quantize to at all (I8 ... F64, Q8_1, Q8_K: it aborts on them) is refused
as a ``--types`` entry before anything is measured (:func:`~ggufmtp.quant.ggml_types.writable_type`). A type is a candidate
for a group only where llama-quantize would write it as asked: its block size
divides every tensor's row width (``ne0``; otherwise llama.cpp falls back to another type, so the
size and the cost would be another type's), and, for the types that need statistics
(:func:`~ggufmtp.imatrix.check.needs_imatrix`), only where the imatrix has them for every tensor of
the group (llama-imatrix collects no token_embd, and llama.cpp aborts on it at IQ2_XXS without
them). A candidate's bytes
are the tensors' bytes at that type from gguf-py's block sizes (:func:`ggufmtp.quant.plan.row_bytes`),
what llama-quantize writes.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from ..errors import SearchError
from ..gguf.model import GGUFModel, TensorInfo, check_mtp
from ..imatrix.check import is_quantizable, needs_imatrix
from ..imatrix.format import read_imatrix
from ..quant.ggml_types import ggml_types, writable_type
from ..quant.plan import row_bytes
from ..quant.recipe import MTP_PLACEHOLDER, Rule, normalize_type
from .records import Candidate, GroupRole, TensorGroup

__all__ = ["DEFAULT_LAYERS_PER_GROUP", "candidates", "group_rule", "groups_of", "imatrix_covers", "matching_tensors"]

DEFAULT_LAYERS_PER_GROUP = 4
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")

# short names of the trunk roles in group names ("attn.0-3", "routed_experts.4-7")
_TRUNK_NAMES = {GroupRole.ATTENTION: "attn", GroupRole.RECURRENT: "recurrent", GroupRole.ROUTED_EXPERTS: "routed_experts",
                GroupRole.SHARED_EXPERT: "shared_expert", GroupRole.GATES: "gates", GroupRole.DENSE_FFN: "ffn"}
_HEAD_NAMES = {GroupRole.MTP_EH_PROJ: "mtp.eh_proj", GroupRole.MTP_ATTENTION: "mtp.attn",
               GroupRole.MTP_EXPERTS: "mtp.experts", GroupRole.MTP_REST: "mtp.rest"}
_RECURRENT_MARKS = ("ssm_", "time_mix", "channel_mix", "shortconv", "linear_attn")


@dataclasses.dataclass(frozen=True)
class _Member:
    """One quantizable tensor: its group's role and layer (None outside the blocks), the name after ``blk.N.``."""

    info: TensorInfo
    role: GroupRole
    layer: int | None
    suffix: str


def _block_role(suffix: str, recurrent_layer: bool) -> GroupRole:
    """The role of a trunk block's tensor by its name (``suffix``: after ``blk.N.``)."""
    if suffix.startswith("ffn_gate_inp"):
        return GroupRole.GATES
    if "_exps" in suffix:
        return GroupRole.ROUTED_EXPERTS
    if "_shexp" in suffix:
        return GroupRole.SHARED_EXPERT
    if suffix.startswith(_RECURRENT_MARKS) or (recurrent_layer and suffix.startswith("attn_")):
        return GroupRole.RECURRENT  # a hybrid trunk's linear-attention layer: its attn_qkv, attn_gate too
    if suffix.startswith("attn") or "attn" in suffix:
        return GroupRole.ATTENTION
    return GroupRole.DENSE_FFN


def _head_role(suffix: str) -> GroupRole:
    if suffix.startswith("nextn.eh_proj"):
        return GroupRole.MTP_EH_PROJ
    if suffix.startswith("attn_"):
        return GroupRole.MTP_ATTENTION
    if "_exps" in suffix:
        return GroupRole.MTP_EXPERTS
    return GroupRole.MTP_REST


def _members(gm: GGUFModel) -> list[_Member]:
    heads = set(gm.mtp_blocks)
    by_layer: dict[int, list[str]] = {}
    for name in gm.tensors:
        if m := _BLK.match(name):
            by_layer.setdefault(int(m.group(1)), []).append(m.group(2))
    recurrent = {b for b, names in by_layer.items() if any(s.startswith(_RECURRENT_MARKS) for s in names)}
    out = []
    for t in gm.tensors.values():
        if not is_quantizable(t.name, t.shape):
            continue
        m = _BLK.match(t.name)
        if m is None:
            role = GroupRole.OUTPUT if t.name.startswith("output") else GroupRole.TOKEN_EMBEDDING
            out.append(_Member(t, role, None, t.name))
            continue
        layer, suffix = int(m.group(1)), m.group(2)
        role = _head_role(suffix) if layer in heads else _block_role(suffix, layer in recurrent)
        out.append(_Member(t, role, layer, suffix))
    return out


def _alternation(items: Iterable[str]) -> str:
    parts = sorted(set(items))
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _compact_pattern(members: Sequence[_Member], head: bool) -> str:
    """``^blk\\.(0|1)\\.(ffn_down_exps|...)\\.weight$``-like: layers x suffixes (exact only when the
    group holds every combination: :func:`groups_of` checks and falls back)."""
    if members[0].layer is None:
        return "^" + _alternation(re.escape(m.suffix) for m in members) + "$"
    layers = MTP_PLACEHOLDER if head else _alternation(str(m.layer) for m in members)
    return rf"^blk\.{layers}\." + _alternation(re.escape(m.suffix) for m in members) + "$"


def _names_pattern(members: Sequence[_Member], head: bool) -> str:
    """The alternation of the exact names (the head's block as ``{mtp}``)."""
    def one(m: _Member) -> str:
        return rf"blk\.{MTP_PLACEHOLDER}\." + re.escape(m.suffix) if head else re.escape(m.info.name)
    return "^" + _alternation(one(m) for m in members) + "$"


def matching_tensors(pattern: str, names: Iterable[str], mtp_blocks: Sequence[int]) -> list[str]:
    """The names a recipe rule with ``pattern`` overrides, as llama-quantize matches it (the recipe's
    matcher: placeholders filled in, lower-cased, searched unanchored)."""
    rule = Rule(pattern, "Q8_0").resolve(list(mtp_blocks))
    if rule is None:
        return []
    rx = re.compile(rule.llama_pattern)
    return [n for n in names if rx.search(n)]


def _group(role: GroupRole, name: str, members: list[_Member], gm: GGUFModel) -> TensorGroup:
    head = role.is_head
    names = [m.info.name for m in members]
    for pattern in (_compact_pattern(members, head), _names_pattern(members, head)):
        if sorted(matching_tensors(pattern, gm.tensors, gm.mtp_blocks)) == sorted(names):
            return TensorGroup(name, role, pattern, tuple(names), sum(m.info.n_elements for m in members))
    raise SearchError(f"{gm.path}: no pattern matches exactly the tensors of group {name} ({', '.join(names)})")


def _range_name(role: GroupRole, layers: Sequence[int]) -> str:
    lo, hi = min(layers), max(layers)
    return f"{_TRUNK_NAMES[role]}.{lo}" + (f"-{hi}" if hi != lo else "")


def groups_of(model_path: str | Path, layers_per_group: int = DEFAULT_LAYERS_PER_GROUP) -> tuple[TensorGroup, ...]:
    """The tensor groups of the GGUF at ``model_path`` (see the module doc): trunk roles over
    ``layers_per_group`` consecutive trunk layers each (named by the layers they hold: ``attn.3``,
    ``routed_experts.0-1``), then ``token_embd``, ``output`` and the MTP head's parts, in that order.
    GGUFReadError for an unreadable model, SearchError for ``layers_per_group`` < 1."""
    if isinstance(layers_per_group, bool) or not isinstance(layers_per_group, int) or layers_per_group < 1:
        raise SearchError(f"layers per group {layers_per_group!r}: must be an integer of at least 1")
    gm = GGUFModel(model_path)
    members = _members(gm)
    trunk: dict[tuple[int, GroupRole], list[_Member]] = {}
    single: dict[GroupRole, list[_Member]] = {}
    for m in members:
        if m.layer is None or m.role.is_head:
            single.setdefault(m.role, []).append(m)
        else:
            trunk.setdefault((m.layer // layers_per_group, m.role), []).append(m)
    out = [_group(role, _range_name(role, [m.layer for m in ms if m.layer is not None]), ms, gm)
           for (_, role), ms in sorted(trunk.items(), key=lambda kv: (kv[0][0], list(GroupRole).index(kv[0][1])))]
    read_by_head = set(check_mtp(gm).fallbacks.values())
    for role, name in ((GroupRole.TOKEN_EMBEDDING, "token_embd"), (GroupRole.OUTPUT, "output"), *_HEAD_NAMES.items()):
        if role in single:
            g = _group(role, name, single[role], gm)
            out.append(dataclasses.replace(g, head_reads=bool(read_by_head & set(g.tensors))))
    return tuple(out)


def group_rule(group: TensorGroup, qtype: str) -> Rule:
    """The recipe rule that puts ``group`` at ``qtype`` (an allocation's ``[[rules]]`` entry)."""
    return Rule(group.pattern, normalize_type(qtype, f"group {group.name}"))


def _fits(qtype: str, info: TensorInfo) -> bool:
    """Whether llama-quantize writes ``info`` as ``qtype`` (its block size divides the row width)."""
    return ggml_types()[qtype].fits(int(info.shape[0]))


def imatrix_covers(imatrix: str | os.PathLike | None) -> frozenset[str] | None:
    """The tensors ``imatrix`` has statistics for (:func:`candidates`' argument; None: no imatrix)."""
    return None if imatrix is None else frozenset(read_imatrix(imatrix).entries)


def candidates(model_path: str | Path, groups: Sequence[TensorGroup], types: Sequence[str], *,
               imatrix: Collection[str] | None = None) -> tuple[Candidate, ...]:
    """Each group at each of ``types`` that llama-quantize would write as asked (see the module doc),
    with its bytes; ``imatrix``: the tensors the imatrix has statistics for (None: no imatrix). A
    type that needs statistics is a candidate only where every tensor of the group that needs them
    has them: token_embd and output at IQ2_XXS without them abort llama.cpp, the MTP head at IQ3_XXS
    is refused. RecipeError naming an unknown type, SearchError for a group of another model."""
    qtypes = [writable_type(t, "search --types") for t in types]
    gm = GGUFModel(model_path)
    covered = frozenset(imatrix or ())
    out = []
    for g in groups:
        if missing := [n for n in g.tensors if n not in gm.tensors]:
            raise SearchError(f"{model_path}: group {g.name} names tensors the model lacks ({', '.join(missing[:3])}"
                              f"{' ...' if len(missing) > 3 else ''}): groups of another model?")
        infos = [gm.tensors[n] for n in g.tensors]
        for qt in qtypes:
            if not all(_fits(qt, i) for i in infos):
                continue
            if any(needs_imatrix(qt, None, i.name) and i.name not in covered for i in infos):
                continue
            out.append(Candidate(g.name, qt, sum(row_bytes(qt, i.shape) for i in infos)))
    return tuple(out)
