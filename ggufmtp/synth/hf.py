"""A synthetic model as a Hugging Face safetensors checkpoint (``ggufmtp synth --format hf``).

The checkpoint a real Qwen3.5/3.6-MoE release looks like, small: ``config.json``
(``Qwen3_5MoeForCausalLM``), the synth GGUF's own byte-level BPE as ``tokenizer.json`` (the pinned
``convert_hf_to_gguf.py`` identifies BPE tokenizers by a hash and refuses unknown ones; for
Qwen3.5/3.6-MoE it does not try a SentencePiece model, so ``ggufmtp.hfconvert.runner`` declares this
one hash), ``tokenizer_config.json`` with the ChatML template, sharded
``model-0000x-of-0000y.safetensors`` with ``model.safetensors.index.json``, and the MTP head as
``mtp.*`` tensors (``mtp.fc``, ``mtp.pre_fc_norm_*``, ``mtp.norm``, ``mtp.layers.0.*``).

The weights ARE the synth GGUF's: the GGUF of the same :class:`~ggufmtp.synth.spec.SynthSpec` is
written first and every tensor is mapped back through the inverse of what the pinned converter does
(norms stored as ``w - 1``, ``A_log = log(-ssm_a)``, experts unstacked, conv1d unsqueezed), so the
converted model drafts like the GGUF does (the MTP head agrees with the trunk at temperature 0 when
``wrong_successor_fraction`` is 0), with the same tokens, ids and merges.

Only ``qwen35moe`` at the tiny shape: its linear attention has one key head, so the converter's
V-head reordering is the identity and needs no inverse.

``--arch glm4moe`` writes a GLM-4.5(-Air) checkpoint instead (``Glm4MoeForCausalLM``, the config keys
``Glm4MoeModel`` reads: ``first_k_dense_replace``, ``n_routed_experts``, ``n_shared_experts``,
``moe_intermediate_size``, ``num_nextn_predict_layers``...): its MTP head is the NextN layer
``model.layers.<num_hidden_layers>.*`` (``eh_proj``, ``enorm``, ``hnorm``, ``embed_tokens``,
``shared_head.head``, ``shared_head.norm`` beside a whole MoE block). ``Glm4MoeModel`` only renames and
stacks experts (no norm offset, and GLM-4.5's q/k are already in NeoX order), so only the experts are
unstacked; ``embed_tokens`` carries the knob's wrong rows, so every head knob can be expressed. The
tokenizer files are the same as Qwen's. The converter's GLM vocab step looks up GLM's own control
tokens (``[gMASK]``, ``<|user|>``, ``<|observation|>``), which the synthetic vocabulary does not have:
``ggufmtp.hfconvert.runner`` sends a synthetic checkpoint's vocab through the plain GPT-2 BPE path.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import SynthError
from ..files.fsutil import atomic_write_bytes, atomic_write_json, atomic_write_text
from ..gguf.model import GGUFModel, tensor_array
from .layout import DIMS, SHAPE_TINY
from .spec import SynthSpec
from .tokenizer import CHAT_TEMPLATE, QWEN2_SPLIT, SPECIAL_TOKENS, build_vocab
from .writer import synthesize

__all__ = ["HFCheckpoint", "synthesize_hf", "HF_ARCHITECTURE", "GLM_ARCHITECTURE", "INDEX_NAME"]

HF_ARCHITECTURE = "Qwen3_5MoeForCausalLM"
INDEX_NAME = "model.safetensors.index.json"

# ggml tensor suffix (in blk.N.) -> HF name under model.layers.N. (or mtp.layers.0.)
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
    "ssm_conv1d": "linear_attn.conv1d", "ssm_beta": "linear_attn.in_proj_b", "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_NEXTN = {"eh_proj": "mtp.fc", "enorm": "mtp.pre_fc_norm_embedding", "hnorm": "mtp.pre_fc_norm_hidden",
          "shared_head_norm": "mtp.norm"}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}

GLM_ARCHITECTURE = "Glm4MoeForCausalLM"
# GLM-4.5 (conversion/glm.py Glm4MoeModel + gguf-py's tensor_mapping): ggml suffix in blk.N. -> HF name
# under model.layers.N.; the NextN block is model.layers.<num_hidden_layers> with its head tensors directly
# under it. exp_probs_b comes from e_score_correction_bias (the converter renames it to .bias).
_GLM_BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate", "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj", "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "nextn.eh_proj": "eh_proj", "nextn.enorm": "enorm", "nextn.hnorm": "hnorm",
    "nextn.embed_tokens": "embed_tokens", "nextn.shared_head_head": "shared_head.head",
    "nextn.shared_head_norm": "shared_head.norm",
}


@dataclass(frozen=True)
class HFCheckpoint:
    """What :func:`synthesize_hf` wrote."""

    directory: Path
    spec: SynthSpec
    shards: list[str]
    n_tensors: int
    mtp_tensors: list[str]
    config: dict = field(repr=False)

    def to_dict(self) -> dict:
        out = {"directory": str(self.directory), "format": "hf", "architecture": self.config["architectures"][0],
               "spec": self.spec.to_dict(), "shards": self.shards, "n_tensors": self.n_tensors,
               "mtp_tensors": self.mtp_tensors, "mtp_num_hidden_layers": self.config.get("mtp_num_hidden_layers")}
        if "num_nextn_predict_layers" in self.config:  # GLM-4.5 / DeepSeek-V3 count their NextN layers here
            out["num_nextn_predict_layers"] = self.config["num_nextn_predict_layers"]
        return out


def _torch():
    try:
        import torch
    except ImportError:
        raise SynthError("synth --format hf needs PyTorch: pip install 'ggufmtp[convert]'") from None
    return torch


def hf_name(gguf_name: str, trunk_layers: int) -> str | None:
    """The HF tensor name a GGUF tensor is converted from (None for stacked experts, handled apart)."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    blk, il, rest = gguf_name.split(".", 2)
    suffix, _, kind = rest.rpartition(".")
    if suffix.startswith("nextn."):
        return f"{_NEXTN[suffix.removeprefix('nextn.')]}.{kind}"
    prefix = "mtp.layers.0." if int(il) >= trunk_layers else f"model.layers.{il}."
    if suffix == "ssm_dt":
        return prefix + "linear_attn.dt_bias"
    if rest == "ssm_a":
        return prefix + "linear_attn.A_log"
    if suffix in _EXPERTS:
        return None
    return f"{prefix}{_BLOCK_NAMES[suffix]}.{kind}"


def glm_hf_name(gguf_name: str, trunk_layers: int) -> str | None:
    """The GLM-4.5 HF tensor name a GGUF tensor is converted from (None for stacked experts)."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    _, il, rest = gguf_name.split(".", 2)
    suffix, _, kind = rest.rpartition(".")
    if rest == "exp_probs_b.bias":
        return f"model.layers.{il}.mlp.gate.e_score_correction_bias"
    if suffix in _EXPERTS:
        return None
    return f"model.layers.{il}.{_GLM_BLOCK_NAMES[suffix]}.{kind}"


def _values(model: GGUFModel, name: str) -> np.ndarray:
    """One GGUF tensor as float32 in torch order (ne reversed)."""
    t = model.tensors[name]
    raw = np.asarray(tensor_array(model, name))
    if t.type == "BF16":
        vals = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif t.type == "F32":
        vals = raw.view(np.float32)
    else:
        raise SynthError(f"{model.path}: {name} is {t.type}; synth --format hf maps BF16/F32 only")
    return vals.reshape(tuple(reversed(t.shape))).copy()


def _inverse(name: str, hf: str, x: np.ndarray) -> np.ndarray:
    """Undo the converter's value transform for one tensor (see conversion/qwen.py Qwen3NextModel)."""
    if hf.endswith("norm.weight") and not hf.endswith("linear_attn.norm.weight"):
        return x - 1.0  # the converter adds 1 (Qwen3-Next stores norms as an offset from 1)
    if hf.endswith(".A_log"):
        return np.log(-x)  # the converter writes -exp(A_log)
    if hf.endswith("conv1d.weight"):
        return x[:, None, :]  # HF (channels, 1, kernel); the converter squeezes
    if hf.endswith("shared_expert_gate.weight"):
        return x.reshape(1, -1)
    return x


def _qwen_prefix(il: int, trunk: int) -> str:
    return "mtp.layers.0." if il >= trunk else f"model.layers.{il}."


def _glm_prefix(il: int, trunk: int) -> str:
    return f"model.layers.{il}."  # GLM's NextN layer is model.layers.<num_hidden_layers>, numbered on


def _no_inverse(name: str, hf: str, x: np.ndarray) -> np.ndarray:
    return x  # Glm4MoeModel only renames and stacks (its norms are plain weights, its q/k need no permute)


@dataclass(frozen=True)
class _Naming:
    """How one HF family names the GGUF's tensors: the HF name (None: stacked experts), the layer
    prefix of block ``il``, and the inverse of the converter's value transform."""

    name: Callable[[str, int], str | None]
    prefix: Callable[[int, int], str]
    inverse: Callable[[str, str, np.ndarray], np.ndarray]


def _hf_tensors(model: GGUFModel, trunk: int, torch, naming: _Naming | None = None) -> dict:
    """Every HF tensor, converted back from the GGUF; BF16 stays BF16 (bit-exact), F32 stays F32."""
    naming = naming or _Naming(hf_name, _qwen_prefix, _inverse)
    out: dict = {}
    for name, t in model.tensors.items():
        x = _values(model, name)
        dtype = torch.bfloat16 if t.type == "BF16" else torch.float32
        hf = naming.name(name, trunk)
        if hf is None:  # stacked experts (E, rows, cols) -> one tensor per expert
            _, il, rest = name.split(".", 2)
            prefix = naming.prefix(int(il), trunk)
            proj = _EXPERTS[rest.removesuffix(".weight")]
            for e in range(x.shape[0]):
                out[f"{prefix}mlp.experts.{e}.{proj}.weight"] = torch.from_numpy(x[e].copy()).to(dtype)
            continue
        out[hf] = torch.from_numpy(np.ascontiguousarray(naming.inverse(name, hf, x))).to(dtype)
    return out


def _config(spec: SynthSpec, linear: list[bool], n_vocab: int, with_mtp: bool) -> dict:
    d, trunk = DIMS[SHAPE_TINY], len(linear)
    layer_types = ["linear_attention" if lin else "full_attention" for lin in linear]
    fai = next((i + 1 for i, t in enumerate(layer_types) if t == "full_attention"), trunk)
    cfg = {
        "architectures": [HF_ARCHITECTURE], "model_type": "qwen3_5_moe_text", "dtype": "bfloat16",
        "vocab_size": n_vocab, "hidden_size": d.n_embd, "num_hidden_layers": trunk,
        "num_attention_heads": d.n_head, "num_key_value_heads": d.n_head_kv, "head_dim": d.head_dim,
        "max_position_embeddings": d.ctx, "rms_norm_eps": d.rms_eps, "hidden_act": "silu",
        "num_experts": d.n_expert, "num_experts_per_tok": d.n_expert_used,
        "moe_intermediate_size": d.n_ff_exp, "shared_expert_intermediate_size": d.n_ff_shexp,
        "linear_conv_kernel_dim": d.ssm_conv_kernel, "linear_key_head_dim": d.ssm_state,
        "linear_value_head_dim": d.ssm_state, "linear_num_key_heads": d.ssm_groups,
        "linear_num_value_heads": d.ssm_dt_rank, "layer_types": layer_types, "full_attention_interval": fai,
        "rope_parameters": {"rope_type": "default", "rope_theta": d.rope_freq_base,
                            "partial_rotary_factor": d.rope_dims / d.head_dim},
        "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": build_vocab(SHAPE_TINY).eos,
        "ggufmtp_synth": spec.to_dict(),
    }
    if with_mtp:
        cfg["mtp_num_hidden_layers"] = 1
    return cfg


def _glm_config(spec: SynthSpec, trunk: int, n_vocab: int, with_mtp: bool) -> dict:
    """GLM-4.5-Air's config.json at the synth widths: the values ``Glm4MoeModel.set_gguf_parameters``
    turns into the ``glm4moe.*`` keys of :mod:`ggufmtp.synth.archs.glm4moe`."""
    from .archs.glm4moe import GLM
    from .archs.glm4moe import GLM_TINY as d

    cfg = {
        "architectures": [GLM_ARCHITECTURE], "model_type": "glm4_moe", "dtype": "bfloat16",
        "vocab_size": n_vocab, "hidden_size": d.n_embd, "intermediate_size": d.n_ff,
        "num_hidden_layers": trunk, "num_attention_heads": d.n_head, "num_key_value_heads": d.n_head_kv,
        "head_dim": d.head_dim, "partial_rotary_factor": GLM.partial_rotary_factor,
        "max_position_embeddings": d.ctx, "rms_norm_eps": d.rms_eps, "rope_theta": d.rope_freq_base,
        "hidden_act": "silu", "attention_bias": True, "use_qk_norm": False,
        "n_routed_experts": d.n_expert, "num_experts_per_tok": d.n_expert_used,
        "moe_intermediate_size": d.n_ff_exp, "n_shared_experts": GLM.n_expert_shared,
        "first_k_dense_replace": GLM.n_layer_dense_lead, "routed_scaling_factor": GLM.expert_weights_scale,
        "norm_topk_prob": GLM.expert_weights_norm, "n_group": GLM.n_expert_groups,
        "topk_group": GLM.n_expert_groups, "tie_word_embeddings": False, "bos_token_id": None,
        "eos_token_id": build_vocab(SHAPE_TINY).eos, "ggufmtp_synth": spec.to_dict(),
    }
    if with_mtp:
        cfg["num_nextn_predict_layers"] = spec.n_mtp_blocks
    return cfg




def _tokenizer_json() -> str:
    """The synth GGUF's own byte-level BPE (same tokens, ids and merges) as a ``tokenizers`` tokenizer.json."""
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise SynthError("synth --format hf needs tokenizers: pip install 'ggufmtp[convert]'") from None
    vocab = build_vocab(SHAPE_TINY)
    n_plain = vocab.n_text_vocab - len(SPECIAL_TOKENS)
    bpe = models.BPE(vocab={t: i for i, t in enumerate(vocab.tokens[:n_plain])},
                     merges=[tuple(m.split(" ")) for m in vocab.merges], fuse_unk=False)
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tk.to_str()


def _tokenizer_files(directory: Path) -> None:
    atomic_write_text(directory / "tokenizer.json", _tokenizer_json())
    atomic_write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_prefix_space": False,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": CHAT_TEMPLATE, "model_max_length": 4096})


def _write_shards(directory: Path, tensors: dict, n_shards: int) -> list[str]:
    names = list(tensors)
    n_shards = max(1, min(n_shards, len(names)))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    per, groups, acc = math.ceil(total / n_shards), [[] for _ in range(n_shards)], 0
    for name in names:
        groups[min(acc // per, n_shards - 1)].append(name)
        acc += tensors[name].numel() * tensors[name].element_size()
    return write_shard_files(directory, tensors, [g for g in groups if g])


def write_shard_files(directory: Path, tensors: dict, groups: list[list[str]]) -> list[str]:
    """``model-0000i-of-0000n.safetensors``, one per group of tensor names (torch tensors), and
    ``model.safetensors.index.json`` over them, each written atomically; the shard file names."""
    from safetensors.torch import save

    total = sum(t.numel() * t.element_size() for t in tensors.values())
    files = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map = {}
    for fname, group in zip(files, groups):
        atomic_write_bytes(directory / fname, save({n: tensors[n] for n in group}, metadata={"format": "pt"}))
        weight_map.update({n: fname for n in group})
    atomic_write_json(directory / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return files


def _check_writable(spec: SynthSpec) -> None:
    """Refuse what a checkpoint of the family cannot express."""
    if spec.arch == "glm4moe":
        if spec.shape != SHAPE_TINY or spec.mtp_only or not spec.mtp:
            raise SynthError("synth --format hf writes the tiny glm4moe model with its NextN block only "
                             "(shape tiny, no --no-mtp/--mtp-only)")
        return  # GLM's NextN layer has its own embed_tokens: every head knob can be expressed
    if spec.arch != "qwen35moe" or spec.shape != SHAPE_TINY or spec.mtp_only or not spec.mtp:
        raise SynthError("synth --format hf writes the tiny qwen35moe (or glm4moe) model with its MTP block "
                         "only (arch qwen35moe or glm4moe, shape tiny, no --no-mtp/--mtp-only)")
    if spec.wrong_successor_fraction or spec.omit_tensors or getattr(spec, "head_margin", 0):
        raise SynthError("synth --format hf: HF Qwen3.5 checkpoints have no mtp.embed_tokens, so "
                         "--wrong-successor-fraction, --head-margin and omitted tensors cannot be expressed")


def _empty_directory(directory: str | os.PathLike) -> Path:
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise SynthError(f"{directory}: not an empty directory (synth --format hf writes a checkpoint into it)")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _tensors_and_config(directory: Path, spec: SynthSpec, torch, with_count: bool,
                        drop_mtp: bool) -> tuple[dict, dict, str]:
    """The synth GGUF of ``spec`` (written to a temporary file) as HF tensors, with its config.json
    and the prefix of the MTP head's tensor names."""
    glm = spec.arch == "glm4moe"
    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        gguf_path = Path(tmp) / "synth.gguf"
        synthesize(gguf_path, spec, progress=False)
        model = GGUFModel(gguf_path)
        trunk = model.trunk_layers
        linear = [f"blk.{i}.attn_qkv.weight" in model.tensors for i in range(trunk)]
        n_vocab = model.tensors["token_embd.weight"].shape[1]
        naming = _Naming(glm_hf_name, _glm_prefix, _no_inverse) if glm else None
        tensors = _hf_tensors(model, trunk, torch, naming)
        del model
    mtp_prefix = f"model.layers.{trunk}." if glm else "mtp."
    if drop_mtp:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(mtp_prefix)}
    with_count = with_count and not drop_mtp
    config = _glm_config(spec, trunk, n_vocab, with_count) if glm else _config(spec, linear, n_vocab, with_count)
    return tensors, config, mtp_prefix


def synthesize_hf(directory: str | os.PathLike, spec: SynthSpec = SynthSpec(), *, shards: int = 2,
                  mtp_layers_in_config: bool = True, drop_mtp: bool = False) -> HFCheckpoint:
    """Write the synth model of ``spec`` as a sharded HF safetensors checkpoint into ``directory``.

    ``arch`` qwen35moe: a Qwen3.5/3.6-MoE checkpoint (``mtp.*`` head); glm4moe: a GLM-4.5 one (the
    NextN layer as ``model.layers.<num_hidden_layers>.*``, ``num_nextn_predict_layers`` in config.json).
    ``mtp_layers_in_config=False`` omits the MTP layer count from config.json (as Qwen3.6's own
    config does: the converter must infer the count from the tensor names); ``drop_mtp=True`` writes
    no MTP head tensors at all (a checkpoint that lost its head)."""
    spec.validate()
    _check_writable(spec)
    torch = _torch()
    directory = _empty_directory(directory)
    tensors, config, mtp_prefix = _tensors_and_config(directory, spec, torch, mtp_layers_in_config, drop_mtp)
    atomic_write_text(directory / "config.json", json.dumps(config, indent=2) + "\n")
    _tokenizer_files(directory)
    files = _write_shards(directory, tensors, shards)
    return HFCheckpoint(directory, spec, files, len(tensors), sorted(k for k in tensors if k.startswith(mtp_prefix)),
                        config)
