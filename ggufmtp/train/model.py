"""The trained model in PyTorch: transformers' Qwen3.5-MoE trunk and our MTP head, and their losses.

The trunk is ``Qwen3_5MoeForCausalLM`` from transformers' ``qwen3_5_moe`` modules: Gated DeltaNet
layers (the PyTorch fallback; no fla kernels are needed) and gated full attention at the
``full_attention_interval``, every layer a sparse MoE block with routed experts (packed
``gate_up_proj`` / ``down_proj``) and a gated shared expert. transformers has no MTP module (it
drops ``mtp.*`` when it loads a checkpoint), so the head is ours, with the published names:

- ``pre_fc_norm_embedding`` (RMSNorm of the embedding of token t+1, the trunk's shared embedding),
- ``pre_fc_norm_hidden`` (RMSNorm of the trunk's hidden state at t),
- ``fc``: Linear(2 x hidden -> hidden) over ``[embedding half ; hidden half]`` (llama.cpp's
  ``nextn.eh_proj``, concatenated in that order by ``src/models/qwen35moe.cpp``),
- ``layers.0``: one full-attention MoE decoder layer (transformers' ``Qwen3_5MoeDecoderLayer``),
- ``norm``; the logits are the trunk's ``lm_head`` of that.

The hidden state the head reads is the trunk's output AFTER its final norm (``model.norm``): the
pinned llama.cpp feeds the head ``h_nextn``, built after ``output_norm`` (upstream #24025 moved it
there), so a head trained on the pre-norm state would read something else at run time. Every
RMSNorm here is Qwen3.5's zero-centred ``x * (1 + w)``: the checkpoint stores ``w`` and the
converter writes ``1 + w``, exactly as for a published checkpoint.

Losses: LM = cross-entropy of ``lm_head(h[t])`` against token t+1; MTP = cross-entropy of the head
at t against token t+2 (DeepSeek-V3's depth-1 MTP; the head's gradient reaches the trunk, as there).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import TrainDependencyError
from ..jsontypes import JsonObject
from .config import ModelConfig
from .tokenizer import TRAIN_INSTALL_HINT

if TYPE_CHECKING:  # annotations only: torch is imported when a model is built
    from torch import Tensor

__all__ = ["require_torch", "Model", "build_model", "losses", "text_config_object", "config_from_text_config",
           "new_model"]

# text_config keys of the checkpoint that transformers' config does not take (the converter reads
# the MTP layer count; the rest describe the file)
_CHECKPOINT_ONLY = frozenset({"model_type", "dtype", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings",
                              "attn_output_gate"})


def require_torch() -> Any:
    """``torch``, or one clear error naming the ``train`` extra."""
    try:
        import torch
        import transformers  # noqa: F401 - the trunk's modules
    except ImportError as e:
        raise TrainDependencyError(f"training needs PyTorch and transformers ({e.name} is missing): "
                                   f"{TRAIN_INSTALL_HINT}") from None
    return torch


def _modeling() -> Any:
    try:
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
    except ImportError as e:
        raise TrainDependencyError(f"this transformers has no qwen3_5_moe model ({e}): transformers>=5.0 is needed; "
                                   f"{TRAIN_INSTALL_HINT}") from None
    return modeling_qwen3_5_moe


def text_config_object(cfg: ModelConfig, vocab_size: int, eos_id: int) -> Any:
    """transformers' ``Qwen3_5MoeTextConfig`` of ``cfg`` (SDPA attention: causal without a mask)."""
    return config_from_text_config(cfg.text_config(vocab_size, eos_id))


def config_from_text_config(text_config: JsonObject) -> Any:
    """transformers' config of a checkpoint's ``text_config`` (config.json's JSON; SDPA attention)."""
    require_torch()
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

    keys = {k: v for k, v in text_config.items() if k not in _CHECKPOINT_ONLY}
    config = Qwen3_5MoeTextConfig(**keys)
    # The MTP layer is built outside the PreTrainedModel that would pick an implementation, and
    # eager attention without a mask is NOT causal: name SDPA (causal when no mask is given).
    config._attn_implementation = "sdpa"
    return config


@functools.lru_cache(maxsize=1)
def _head_class() -> Any:
    """The MTP head's class (made on first use: torch is imported only when a model is built)."""
    torch = require_torch()
    mod = _modeling()
    nn = torch.nn

    class MtpHead(nn.Module):  # type: ignore[name-defined]  # torch is imported in this function
        """Qwen3.5/3.6's MTP block (see the module docstring); returns the normed hidden state."""

        def __init__(self, config: Any):
            super().__init__()
            layer_config = copy.deepcopy(config)
            layer_config.layer_types = ["full_attention"]  # the MTP layer is a full-attention block
            layer_config.num_hidden_layers = 1
            h, eps = config.hidden_size, config.rms_norm_eps
            self.pre_fc_norm_embedding = mod.Qwen3_5MoeRMSNorm(h, eps=eps)
            self.pre_fc_norm_hidden = mod.Qwen3_5MoeRMSNorm(h, eps=eps)
            self.fc = nn.Linear(2 * h, h, bias=False)
            self.layers = nn.ModuleList([mod.Qwen3_5MoeDecoderLayer(layer_config, 0)])
            self.norm = mod.Qwen3_5MoeRMSNorm(h, eps=eps)

        def forward(self, hidden: Any, next_embeds: Any, position_embeddings: Any) -> Any:
            x = torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
            x = self.fc(x)
            for layer in self.layers:
                x = layer(x, position_embeddings=position_embeddings, attention_mask=None)
                if isinstance(x, tuple):
                    x = x[0]
            return self.norm(x)

    return MtpHead


@dataclass
class Model:
    """The trunk (``Qwen3_5MoeForCausalLM``) and the MTP head, with the head's initial weights kept
    (the untrained head a trained one is measured against)."""

    trunk: Any
    head: Any
    initial_head: dict[str, Tensor]

    def parameters(self) -> list[Any]:
        return [*self.trunk.parameters(), *self.head.parameters()]

    def n_params(self) -> dict[str, int]:
        trunk = sum(p.numel() for p in self.trunk.parameters())
        head = sum(p.numel() for p in self.head.parameters())
        return {"trunk": trunk, "mtp_head": head, "total": trunk + head}

    def to(self, device: Any) -> Model:
        self.trunk.to(device)
        self.head.to(device)
        return self

    def train(self, mode: bool = True) -> None:
        self.trunk.train(mode)
        self.head.train(mode)


def build_model(cfg: ModelConfig, vocab_size: int, eos_id: int, seed: int) -> Model:
    """The trunk and head at their initial weights, from ``seed`` (transformers' own initialization,
    applied to the head too: its MoE expert weights are allocated uninitialised)."""
    torch = require_torch()
    torch.manual_seed(seed)
    return new_model(text_config_object(cfg, vocab_size, eos_id))


def new_model(config: Any) -> Model:
    """Trunk and head of transformers ``config``, initialized from the current RNG state."""
    mod = _modeling()
    trunk = mod.Qwen3_5MoeForCausalLM(config)
    head = _head_class()(config)
    head.apply(trunk._init_weights)
    initial = {k: v.detach().clone() for k, v in head.state_dict().items()}
    return Model(trunk, head, initial)


def _positions(torch: Any, batch: int, n: int, device: Any) -> Any:
    # Qwen3.5's rotary embedding takes (3, batch, seq) position ids (temporal, height, width);
    # for text all three are the token's position.
    return torch.arange(n, device=device).view(1, 1, n).expand(3, batch, n)


def losses(model: Model, ids: Any, head_state: dict[str, Tensor] | None = None, chain: int = 1
           ) -> tuple[Any, list[Any]]:
    """(LM loss, [MTP loss of each draft step]) on a batch of token windows ``ids`` (batch, L).

    LM predicts t+1 from h[t]; the head's first step predicts t+2 from h[t] and the embedding of
    t+1. With ``chain`` > 1 the head also drafts on as llama-server makes it draft: step s reads the
    head's own normed output of step s-1 (``h_nextn`` of the MTP graph) with the embedding of token
    t+1+s and predicts t+2+s. ``head_state``: evaluate the head with these weights instead (the
    untrained head), without training it."""
    torch = require_torch()
    f = torch.nn.functional
    trunk = model.trunk
    batch, length = ids.shape
    h = trunk.model(input_ids=ids).last_hidden_state  # post-norm: what llama.cpp hands the head
    vocab = trunk.config.vocab_size
    lm = f.cross_entropy(trunk.lm_head(h[:, :-1]).float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
    n = length - 1 - chain
    rope = trunk.model.rotary_emb(h, _positions(torch, batch, n, ids.device))
    g, mtp = h[:, :n], []
    for s in range(chain):
        emb = trunk.model.embed_tokens(ids[:, 1 + s:1 + s + n])
        if head_state is None:
            g = model.head(g, emb, rope)
        else:
            g = torch.func.functional_call(model.head, head_state, (g, emb, rope))
        mtp.append(f.cross_entropy(trunk.lm_head(g).float().reshape(-1, vocab), ids[:, 2 + s:2 + s + n].reshape(-1)))
    return lm, mtp
