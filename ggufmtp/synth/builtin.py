"""The built-in models (``builtin:NAME`` on the command line): named specs, synthesized once into a cache.

Only the CLI and the pipeline turn ``builtin:NAME`` into a path (with :func:`builtin_path`);
library functions take paths.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SynthError
from ..runtime.build import cache_root
from .spec import SynthSpec
from .writer import synthesize

BUILTIN_MODELS: dict[str, SynthSpec] = {
    "tiny-qwen35moe": SynthSpec(),
    "tiny-qwen35moe-f20": SynthSpec(wrong_successor_fraction=0.2),
    "tiny-qwen35moe-f50": SynthSpec(wrong_successor_fraction=0.5),
    "tiny-qwen35moe-noise": SynthSpec(eh_proj_noise=0.5),
    "tiny-qwen35": SynthSpec(arch="qwen35"),
    "tiny-qwen35moe-nomtp": SynthSpec(mtp=False),
    "tiny-qwen35moe-mtp-only": SynthSpec(mtp_only=True),
    "tiny-qwen35moe-no-hnorm": SynthSpec(omit_tensors=("nextn.hnorm",)),
    # a head that reacts to quantization (drafts win by 0.08 logits), and soft distributions for eval's KLD
    "tiny-qwen35moe-margin": SynthSpec(head_margin=0.08),
    "tiny-qwen35moe-soft": SynthSpec(logit_scale=4.0),
    # the other MTP families (README: Architectures), at a known acceptance below 100%
    "tiny-qwen3next": SynthSpec(arch="qwen3next"),
    "tiny-glm4moe": SynthSpec(arch="glm4moe", layers=2),
    "tiny-glm4moe-f20": SynthSpec(arch="glm4moe", layers=2, wrong_successor_fraction=0.2),
    "tiny-deepseek2": SynthSpec(arch="deepseek2", layers=2),
    "tiny-deepseek4": SynthSpec(arch="deepseek4"),  # 4 layers: compress ratios 0, 0, 4 (CSA), 128 (HCA)
    "tiny-deepseek32": SynthSpec(arch="deepseek32", layers=2),
    "tiny-glm-dsa": SynthSpec(arch="glm-dsa"),  # 4 layers: the last one's indexer is "shared"
    "tiny-step35": SynthSpec(arch="step35", mtp_layers=3),
    "tiny-nemotron_h_moe": SynthSpec(arch="nemotron_h_moe"),
    "tiny-mimo2": SynthSpec(arch="mimo2", mtp_layers=3),  # MiMo-V2's 3 chained heads
    "tiny-bailingmoe3": SynthSpec(arch="bailingmoe3"),
    "tiny-cohere2moe": SynthSpec(arch="cohere2moe"),
    "tiny-hy_v3": SynthSpec(arch="hy_v3"),
    # a NextN block as GLM-5.3-Flash converts, which the pinned llama.cpp cannot draft with (no MTP graph)
    "tiny-glm5-next": SynthSpec(arch="glm5-next"),
    "tiny-llama-nomtp": SynthSpec(arch="llama", mtp=False),
}


def builtin_path(name: str, cache_dir: Path | None = None, progress: bool = False) -> Path:
    """Path of built-in model ``name`` (``"builtin:NAME"`` or ``"NAME"``), synthesized once into
    ``cache_root()/"builtin"`` (keyed by the spec and the synth version; atomic write)."""
    key = name.removeprefix("builtin:")
    if key not in BUILTIN_MODELS:
        raise SynthError(f"unknown built-in model {name!r}; known: {', '.join(sorted(BUILTIN_MODELS))}")
    spec = BUILTIN_MODELS[key]
    if cache_dir is None:
        cache_dir = cache_root() / "builtin"
    path = Path(cache_dir) / f"{key}-{spec.digest()[:12]}.gguf"
    if not path.is_file():
        synthesize(path, spec, progress=progress)
    return path
