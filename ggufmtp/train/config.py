"""What a trained model is made of: its shape, tokenizer, data and schedule, named as presets.

A preset fixes everything that decides the weights except the machine: the model's dimensions
(:class:`ModelConfig`, written as Qwen3.6's ``text_config``), the tokenizer's settings, the corpus's
sources and split, the optimizer schedule and the seed. :meth:`TrainPreset.key` hashes all of it
with the trainer's version and the corpus's digest: the cache key of ``builtin:*-trained`` models.
The device and thread count are not in the key (they change rounding, not what is trained).

``micro`` is what the test suite trains (well under a minute of one core's time), ``tiny`` is
``builtin:tiny-qwen35moe-trained`` (about two minutes on two cores), ``gpu-small`` and ``gpu-base``
are for an accelerator (bf16 autocast, the whole standard library).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from ..errors import TrainError
from ..jsontypes import JsonObject

__all__ = ["TRAINER_VERSION", "ModelConfig", "TokenizerConfig", "DataConfig", "ScheduleConfig", "TrainPreset",
           "PRESETS", "preset", "TINY_MODULES", "MICRO_MODULES"]

# Bump when a change to the trainer, the data builder or the export changes the weights it makes:
# the cached builtin:*-trained models are keyed on it.
TRAINER_VERSION = "1"

# Pure-Python modules of the standard library with many documented functions: the corpus of the
# CPU presets. Named as ``import`` would (a package is its ``__init__``).
TINY_MODULES = (
    "argparse", "base64", "bisect", "calendar", "collections", "configparser", "contextlib", "copy", "csv",
    "dataclasses", "difflib", "enum", "fnmatch", "fractions", "functools", "glob", "heapq", "json.decoder",
    "json.encoder", "ntpath", "pathlib", "posixpath", "pprint", "queue", "random", "shlex", "shutil",
    "statistics", "string", "tempfile", "textwrap", "tokenize", "uuid", "zipfile",
)
MICRO_MODULES = ("bisect", "calendar", "copy", "csv", "fnmatch", "glob", "heapq", "posixpath", "shlex", "string",
                 "textwrap", "uuid")


@dataclass(frozen=True)
class ModelConfig:
    """The trunk's and the head's dimensions, in transformers' ``Qwen3_5MoeTextConfig`` names.

    Layer ``i`` is full attention when ``(i + 1) % full_attention_interval == 0``, else Gated
    DeltaNet (Qwen3.6: 3 linear : 1 full); the MTP layer is always full attention."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    full_attention_interval: int = 4
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10_000_000.0
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4  # 2 value heads per key head: the converter's V-head reordering is used
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    linear_conv_kernel_dim: int = 4
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    shared_expert_intermediate_size: int = 128
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02

    def layer_types(self) -> list[str]:
        n = self.full_attention_interval
        return ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(self.num_hidden_layers)]

    def mrope_section(self) -> list[int]:
        """Qwen3.6's interleaved-MRoPE sections ([11, 11, 10] of 32 rotary pairs) scaled to this
        head: for text every section sees the same position, so only their sum matters."""
        pairs = int(self.head_dim * self.partial_rotary_factor) // 2
        s = round(pairs * 11 / 32)
        return [s, s, pairs - 2 * s]

    def validate(self) -> None:
        problems = []
        if self.num_hidden_layers < 1 or self.full_attention_interval < 1:
            problems.append("num_hidden_layers and full_attention_interval must be >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            problems.append("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_experts_per_tok > self.num_experts:
            problems.append("num_experts_per_tok exceeds num_experts")
        if int(self.head_dim * self.partial_rotary_factor) % 2 or min(self.mrope_section()) < 0:
            problems.append("head_dim * partial_rotary_factor must be an even number of rotary dimensions")
        if problems:
            raise TrainError("model config: " + "; ".join(problems))

    def text_config(self, vocab_size: int, eos_token_id: int) -> JsonObject:
        """Qwen3.6's ``text_config`` (config.json's published keys) at these dimensions."""
        return {
            "model_type": "qwen3_5_moe_text", "vocab_size": vocab_size, "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim, "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings, "initializer_range": self.initializer_range,
            "rms_norm_eps": self.rms_norm_eps, "use_cache": True, "tie_word_embeddings": False,
            "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True,
            "full_attention_interval": self.full_attention_interval, "layer_types": self.layer_types(),
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim, "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim, "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads, "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok, "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "router_aux_loss_coef": 0.001, "output_router_logits": False,
            "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor,
                                "mrope_section": self.mrope_section(), "mrope_interleaved": True},
            "bos_token_id": None, "eos_token_id": eos_token_id, "pad_token_id": None, "dtype": "bfloat16",
        }


@dataclass(frozen=True)
class TokenizerConfig:
    """The byte-level BPE: ``vocab_size`` tokens in all (256 bytes, merges, 3 control tokens)."""

    vocab_size: int = 1024
    min_frequency: int = 2


@dataclass(frozen=True)
class DataConfig:
    """The corpus: chat turns about the standard library's ``modules`` (None: every module),
    ``heldout_fraction`` of the definitions held out; replies longer than ``max_chars`` are dropped."""

    source: str = "stdlib"
    modules: tuple[str, ...] | None = TINY_MODULES
    heldout_fraction: float = 0.05
    max_chars: int = 3000


@dataclass(frozen=True)
class ScheduleConfig:
    """The optimizer and its schedule: AdamW, linear warm-up then cosine decay to ``min_lr_ratio``;
    loss = LM + ``mtp_loss_weight`` x MTP (DeepSeek-V3 uses 0.3, then 0.1), the MTP loss the mean
    over ``mtp_chain`` draft steps."""

    steps: int = 150
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    mtp_loss_weight: float = 0.3
    # Draft steps trained: llama-server drafts k tokens by feeding the head its own normed output;
    # with 2 or more the head learns that too (the MTP loss is then the steps' mean).
    mtp_chain: int = 1
    precision: str = "float32"  # "bfloat16": autocast (on an accelerator)
    eval_batches: int = 4
    log_every: int = 20


@dataclass(frozen=True)
class TrainPreset:
    """A named, complete description of a training run (see the module docstring)."""

    name: str
    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    seed: int = 1234

    def to_dict(self) -> JsonObject:
        return dataclasses.asdict(self)

    def with_overrides(self, *, seed: int | None = None, steps: int | None = None) -> TrainPreset:
        out = self if seed is None else dataclasses.replace(self, seed=seed)
        if steps is not None:
            out = dataclasses.replace(out, schedule=dataclasses.replace(out.schedule, steps=steps))
        return out

    def validate(self) -> None:
        self.model.validate()
        s = self.schedule
        if s.steps < 1 or s.batch_size < 1 or s.seq_len < 8 or s.lr <= 0 or not 1 <= s.mtp_chain < s.seq_len // 2:
            raise TrainError(f"preset {self.name}: steps, batch_size, lr must be positive, seq_len >= 8 and "
                             f"1 <= mtp_chain < seq_len / 2")
        if s.precision not in ("float32", "bfloat16"):
            raise TrainError(f"preset {self.name}: precision {s.precision!r}: float32 or bfloat16")
        if not 0 < self.data.heldout_fraction < 0.5:
            raise TrainError(f"preset {self.name}: heldout_fraction must be in (0, 0.5)")
        if self.tokenizer.vocab_size < 300:
            raise TrainError(f"preset {self.name}: vocab_size {self.tokenizer.vocab_size}: at least 300")

    def key(self, data_digest: str) -> str:
        """The content key of what this preset trains on data of ``data_digest``."""
        blob = json.dumps({"trainer": TRAINER_VERSION, "preset": self.to_dict(), "data": data_digest},
                          sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()


# Sized to one 10-minute accelerator command from throughputs measured on an H100 with the same
# modules (bf16, 16 x 1024: 144M parameters 46k tokens/s, 555M 29k): gpu-small (135M, 36M active)
# ~7 min for 1200 steps, gpu-base (0.80G, 0.23G active) ~6 min for 600.
_GPU_SCHEDULE = ScheduleConfig(steps=1200, batch_size=16, seq_len=1024, lr=1.5e-3, warmup_steps=100,
                               precision="bfloat16", eval_batches=16, log_every=50)

PRESETS: dict[str, TrainPreset] = {
    # the test suite's: the same layout, fewer modules and steps (about 40 s of one core)
    "micro": TrainPreset("micro", data=DataConfig(modules=MICRO_MODULES), tokenizer=TokenizerConfig(vocab_size=768),
                         schedule=ScheduleConfig(steps=150, batch_size=8, seq_len=128, warmup_steps=10)),
    # builtin:tiny-qwen35moe-trained
    "tiny": TrainPreset("tiny"),
    # an accelerator's: the whole standard library, Qwen3.6's ratios at small widths
    "gpu-small": TrainPreset(
        "gpu-small",
        model=ModelConfig(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                          linear_value_head_dim=64, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=256,
                          shared_expert_intermediate_size=256),
        tokenizer=TokenizerConfig(vocab_size=8192), data=DataConfig(modules=None, max_chars=8000),
        schedule=_GPU_SCHEDULE),
    "gpu-base": TrainPreset(
        "gpu-base",
        model=ModelConfig(hidden_size=1024, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=128, linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=128,
                          linear_value_head_dim=128, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256,
                          shared_expert_intermediate_size=512),
        tokenizer=TokenizerConfig(vocab_size=16384), data=DataConfig(modules=None, max_chars=8000),
        schedule=dataclasses.replace(_GPU_SCHEDULE, steps=600, lr=1e-3)),
}


def preset(name: str | TrainPreset) -> TrainPreset:
    """The preset called ``name`` (a :class:`TrainPreset` is returned as is)."""
    if isinstance(name, TrainPreset):
        return name
    try:
        return PRESETS[name]
    except KeyError:
        raise TrainError(f"unknown training preset {name!r}; known: {', '.join(PRESETS)}") from None
