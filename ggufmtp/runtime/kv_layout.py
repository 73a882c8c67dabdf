"""What a GGUF's llama-server contexts hold besides weights, laid out as the pinned llama.cpp
(0c1e570) lays it out: per cache layer its K and V widths and which cell count it has, per
recurrent layer the width of one state row. :mod:`ggufmtp.runtime.memory` turns the layout into
bytes for a server's settings (context size, slots, physical batch, KV types).

The layouts (``src/llama-model.cpp: create_memory`` and the caches it builds):

- **plain and hybrid** (``llama-kv-cache.cpp``, ``llama-memory-hybrid.cpp``): one K row of
  ``key_length x head_count_kv(il)`` and one V row of ``value_length x head_count_kv(il)`` per cell
  and attention layer; the main context holds the trunk's layers, the MTP draft context the MTP
  layers only. Recurrent layers (Gated DeltaNet, Mamba, Kimi delta attention) hold state rows.
- **MLA** (``attention.key_length_mla`` and ``value_length_mla`` set: ``hparams.is_mla()``): K only,
  ``key_length`` (the latent ``kv_lora_rank`` + the rope part) per cell; no V cache. A DeepSeek-style
  GGUF without the ``_mla`` keys is not MLA to llama.cpp and caches full K and V heads.
- **SWA** (``llama-kv-cache-iswa.cpp``): sliding-window layers hold
  ``pad256(min(n_ctx_seq, n_swa + n_ubatch))`` cells per slot, the others the context's; the pattern
  is ``attention.sliding_window_pattern`` (per layer) or the architecture's default.
- **DSA** (``llama-kv-cache-dsa.cpp``; DeepSeek-V3.2, GLM-DSA): the MLA cache of the trunk and an
  indexer key cache of ``indexer.key_length`` per cell on the layers with a full indexer
  (``attention.indexer.types``); the draft context is plain MLA of the MTP layers.
- **GLM5-Next** (``llama-memory-hybrid-idx.cpp``): recurrent KDA layers, MLA on the others and an
  indexer cache of ``indexer.key_length x 3`` (key, gate, pooled) with ``indexer.kpool``.
- **DeepSeek-V4** (``llama-kv-cache-dsv4.cpp``): a K-only sliding-window cache of every layer (the
  MTP layer's too), K-only compressed caches of ``ceil(n_ctx_seq / 4)`` (CSA layers, with a
  lightning-indexer cache of the same cells) and ``ceil(n_ctx_seq / 128)`` cells (HCA layers),
  each padded to 256, and F32 compressor states counted as recurrent rows; the draft context is an
  SWA cache of the MTP layer with K and V.

Exact on these assumptions, which the plan cannot see: flash attention on (llama-server's
``auto`` on CPU and CUDA; with ``-fa off`` V rows widen to the widest layer's), no ``--swa-full``
(it sizes the window caches like the context's). An architecture the table below does not know
with an ``attention.sliding_window`` is planned with full-size caches: an upper bound
(:attr:`KVLayout.bounds` says so).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Cells", "CacheLayer", "StateLayer", "KVLayout", "kv_layout", "cells_per_stream"]


class Cells(enum.StrEnum):
    """Which cell count a cache layer has (per slot; see :func:`cells_per_stream`)."""

    CONTEXT = "context"  # n_ctx_seq
    WINDOW = "window"  # the sliding-window cache: pad256(min(n_ctx_seq, n_swa + n_ubatch))
    CSA = "csa"  # DeepSeek-V4 compressed by 4: pad256(ceil(n_ctx_seq / 4))
    HCA = "hca"  # DeepSeek-V4 compressed by 128: pad256(ceil(n_ctx_seq / 128))


_COMPRESS = {Cells.CSA: 4, Cells.HCA: 128}  # DSV4_CSA_RATIO, DSV4_HCA_RATIO


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def cells_per_stream(kind: Cells, n_ctx_seq: int, n_swa: int, n_ubatch: int) -> int:
    """Cells of one slot's stream of a cache layer of ``kind`` (``llama-kv-cache-iswa.cpp``,
    ``llama-kv-cache-dsv4.cpp``; the caches are per slot as llama-server does not unify them under
    an explicit ``--parallel``)."""
    if kind is Cells.WINDOW:
        return _pad(min(n_ctx_seq, n_swa + n_ubatch), 256)
    if kind in _COMPRESS:
        return _pad(max(1, math.ceil(n_ctx_seq / _COMPRESS[kind])), 256)
    return n_ctx_seq


@dataclass(frozen=True)
class CacheLayer:
    """One layer's cache in one cache: elements of K and of V per cell (V 0: K only)."""

    layer: int
    k: int
    v: int
    cells: Cells = Cells.CONTEXT


@dataclass(frozen=True)
class StateLayer:
    """One layer's recurrent state: F32 values of one row (one row per slot and rollback plane)."""

    layer: int
    width: int


@dataclass(frozen=True)
class KVLayout:
    """The caches of a GGUF's main context (``target``) and MTP draft context (``draft``), the main
    context's recurrent rows (``states``), the sliding window, and where the layout is a bound."""

    target: tuple[CacheLayer, ...] = ()
    draft: tuple[CacheLayer, ...] = ()
    states: tuple[StateLayer, ...] = ()
    n_swa: int = 0
    bounds: tuple[str, ...] = ()


def _key(meta: Mapping[str, Any], arch: str, key: str, default: Any = None) -> Any:
    v = meta.get(f"{arch}.{key}")
    return default if v is None or isinstance(v, str) else v


def _per_layer(value: Any, il: int, default: int) -> int:
    """A per-layer hyperparameter (a scalar or an array of block_count values)."""
    if isinstance(value, list):
        return int(value[il]) if il < len(value) else default
    return int(value) if value is not None else default


def _has(shapes: Mapping[str, Any], il: int, parts: Sequence[str]) -> bool:
    return any(f"blk.{il}.{p}.weight" in shapes or f"blk.{il}.{p}" in shapes for p in parts)


#: The default sliding-window pattern of the architectures that set ``swa_type`` without a
#: per-layer ``sliding_window_pattern`` array: (n_pattern, dense_first) as ``set_swa_pattern``
#: takes them (``llama-hparams.cpp``), the MTP layers never SWA; "all": every layer, MTP included
#: (``models/deepseek4.cpp``). step35 and mimo2 require the array.
_SWA_DEFAULT: dict[str, tuple[int, bool] | str] = {"cohere2moe": (4, True), "deepseek4": "all", "step35": (0, False),
                                                   "mimo2": (0, False)}


#: Hybrid architectures whose main-context cache takes every non-recurrent layer, the MTP layers
#: included (``create_memory`` passes no ``filter_attn``)
_HYBRID_UNFILTERED = frozenset({"bailingmoe3"})


def _swa_layers(meta: Mapping[str, Any], arch: str, n_all: int, trunk: int) -> tuple[frozenset[int], str]:
    """The sliding-window layers, and a note when the plan cannot know them (then: none, an upper
    bound, as full-size caches are the larger)."""
    if not int(_key(meta, arch, "attention.sliding_window", 0) or 0):
        return frozenset(), ""
    if arch not in _SWA_DEFAULT:
        return frozenset(), (f"{arch} has a sliding window the plan does not know the layout of: its caches are "
                             "planned at full size (an upper bound)")
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    default = _SWA_DEFAULT[arch]
    if default == "all":
        return frozenset(range(n_all)), ""
    if isinstance(pattern, list):
        return frozenset(il for il, s in enumerate(pattern) if s and il < n_all), ""
    n, dense_first = default if isinstance(default, tuple) else (0, False)
    n = int(pattern) if isinstance(pattern, int) else n
    swa = {il for il in range(trunk) if n == 0 or (il % n != 0 if dense_first else il % n < n - 1)}
    return frozenset(swa), ""


def _recurrent_width(meta: Mapping[str, Any], arch: str, n_head: int) -> int:
    """F32 values of one recurrent-state row: conv state (``n_embd_r``) + state (``n_embd_s``),
    ``llama-hparams.cpp``: Kimi delta attention (``kda.head_dim``) or Mamba/Gated DeltaNet."""
    conv = int(_key(meta, arch, "ssm.conv_kernel", 0) or 0)
    kda = int(_key(meta, arch, "kda.head_dim", 0) or 0)
    if kda:
        return 3 * (conv - 1 if conv > 0 else 3) * n_head * kda + kda * kda * n_head
    inner = int(_key(meta, arch, "ssm.inner_size", 0) or 0)
    state, groups = int(_key(meta, arch, "ssm.state_size", 0) or 0), int(_key(meta, arch, "ssm.group_count", 0) or 0)
    return max(conv - 1, 0) * (inner + 2 * groups * state) + state * inner


@dataclass(frozen=True)
class _Shape:
    """The hyperparameters a layout is computed from."""

    meta: Mapping[str, Any]
    arch: str
    n_all: int
    trunk: int
    n_embd: int

    def get(self, key: str, default: Any = None) -> Any:
        return _key(self.meta, self.arch, key, default)

    @property
    def n_head(self) -> int:
        return _per_layer(self.get("attention.head_count", 1), 0, 1)

    def heads_kv(self, il: int) -> int:
        heads = self.get("attention.head_count", 1)
        return _per_layer(self.get("attention.head_count_kv"), il, _per_layer(heads, il, 1))

    @property
    def mla(self) -> bool:
        return bool(self.get("attention.key_length_mla")) and bool(self.get("attention.value_length_mla"))

    def head_k(self, swa: bool = False) -> int:
        dk = int(self.get("attention.key_length", 0) or self.n_embd // max(1, self.n_head))
        return int(self.get("attention.key_length_swa", 0) or dk) if swa else dk

    def head_v(self, swa: bool = False) -> int:
        dv = int(self.get("attention.value_length", 0) or self.n_embd // max(1, self.n_head))
        return int(self.get("attention.value_length_swa", 0) or dv) if swa else dv

    def layer(self, il: int, swa: bool, k_only: bool | None = None) -> CacheLayer:
        """Layer ``il``'s K/V cache (``k_only``: None = as llama.cpp's ``is_mla()``)."""
        hk = self.heads_kv(il)
        no_v = self.mla if k_only is None else k_only
        return CacheLayer(il, self.head_k(swa) * hk, 0 if no_v else self.head_v(swa) * hk,
                          Cells.WINDOW if swa else Cells.CONTEXT)

    def indexer_full(self, il: int) -> bool:
        """``hparams.is_indexer_full``: ``attention.indexer.types``, else GLM-DSA's defaults (every
        layer before GLM-5.2's 1M context; 5.2: layers 0-2 and every 4th from 6) or every layer."""
        types = self.meta.get(f"{self.arch}.attention.indexer.types")
        if types is not None:
            return bool(_per_layer(types, il, 0))
        if self.arch == "glm-dsa" and int(self.get("context_length", 0) or 0) >= 1048576:
            return il < 3 or (il - 2) % 4 == 0
        return True


def kv_layout(meta: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], arch: str) -> KVLayout:
    """The cache layout of a GGUF from its header: ``meta`` (its metadata), ``shapes`` (every
    tensor's shape by name; which layers attend and which are recurrent)."""
    n_all = int(_key(meta, arch, "block_count", 0))
    trunk = n_all - int(_key(meta, arch, "nextn_predict_layers", 0) or 0)
    s = _Shape(meta, arch, n_all, trunk, int(_key(meta, arch, "embedding_length", 0)))
    kda = bool(s.get("kda.head_dim"))
    recurrent = [il for il in range(trunk) if _has(shapes, il, ("ssm_conv1d", "ssm_a")) or (kda and not s.heads_kv(il))]
    attn = [il for il in range(n_all) if il not in recurrent
            and _has(shapes, il, ("attn_k", "attn_qkv", "attn_kv_a_mqa", "attn_q_a", "attn_q", "attn_kv"))]
    swa, note = _swa_layers(meta, arch, n_all, trunk)
    width = _recurrent_width(meta, arch, s.n_head) if recurrent else 0
    states = tuple(StateLayer(il, width) for il in recurrent)
    n_swa = int(s.get("attention.sliding_window", 0) or 0)
    if arch == "deepseek4":
        return _dsv4(s, attn, swa, n_swa)
    # bailingmoe3's hybrid cache has no layer filter (``llama-memory-hybrid.cpp``): its main context
    # holds the MTP layer's K too, beside the draft context's copy
    target = [s.layer(il, il in swa) for il in attn if il < trunk or arch in _HYBRID_UNFILTERED]
    draft = [s.layer(il, il in swa) for il in attn if il >= trunk]
    idx_width = int(s.get("attention.indexer.key_length", 0) or 0)
    if arch in ("deepseek32", "glm-dsa", "glm5-next") and idx_width:
        idx_width *= 3 if arch == "glm5-next" and s.get("attention.indexer.kpool") else 1
        target += [CacheLayer(il, idx_width, 0) for il in attn if il < trunk and s.indexer_full(il)]
        if arch == "glm5-next":  # its draft context is a hybrid-idx cache of the MTP layer
            draft += [CacheLayer(il, idx_width, 0) for il in attn if il >= trunk]
    return KVLayout(tuple(target), tuple(draft), states, n_swa, (note,) if note else ())


def _dsv4(s: _Shape, attn: Sequence[int], swa: frozenset[int], n_swa: int) -> KVLayout:
    """DeepSeek-V4 (``llama-kv-cache-dsv4.cpp``): the K-only raw window cache of every layer, the
    compressed caches and the compressor states (rows of kv + score, ``2 x width x state_size``
    F32 each); the draft context an ordinary SWA cache of the MTP layer(s)."""
    ratios = s.meta.get(f"{s.arch}.attention.compress_ratios") or []
    dk, idx = s.head_k(), int(s.get("attention.indexer.key_length", 0) or 0)
    csa = [il for il in attn if il < s.trunk and _per_layer(ratios, il, 0) == _COMPRESS[Cells.CSA]]
    hca = [il for il in attn if il < s.trunk and _per_layer(ratios, il, 0) == _COMPRESS[Cells.HCA]]
    target = [s.layer(il, il in swa, k_only=True) for il in attn]
    target += [CacheLayer(il, dk * s.heads_kv(il), 0, Cells.CSA) for il in csa]
    target += [CacheLayer(il, dk * s.heads_kv(il), 0, Cells.HCA) for il in hca]
    target += [CacheLayer(il, idx, 0, Cells.CSA) for il in csa]
    states = [StateLayer(il, 2 * (2 * dk) * (2 * 4)) for il in csa]  # csa: 2 x head, 2 x ratio rows
    states += [StateLayer(il, 2 * dk * 128) for il in hca]  # hca: head x ratio rows
    states += [StateLayer(il, 2 * (2 * idx) * (2 * 4)) for il in csa]  # the indexer's, as csa
    draft = [s.layer(il, il in swa, k_only=False) for il in attn if il >= s.trunk]
    return KVLayout(tuple(target), tuple(draft), tuple(states), n_swa)
