"""Synthetic MTP (NextN) models: the project's test models, since no real weights can be fetched.

``synthesize(out, SynthSpec(...))`` writes a BF16 GGUF of a ``qwen35moe`` (or dense ``qwen35``) model
that llama.cpp (commit 0c1e570) loads and serves with ``llama-server --spec-type draft-mtp``. The
weights are not trained; they are *constructed* so that the model's behaviour is known exactly.

Layout
------
``layers`` trunk blocks (3 Gated DeltaNet : 1 full attention, ``full_attention_interval`` 4; with 2
or 3 layers the interval is ``layers``, because llama.cpp 0c1e570 aborts at warm-up on a hybrid trunk
without any attention layer -- or without any recurrent one, so a 1-layer file can be written and
quantized but not served, see :func:`full_attention_interval`), then ONE MTP block ``blk.<layers>`` (``nextn_predict_layers`` 1,
``block_count = layers + 1``). ``mtp=False`` writes the same trunk without it; ``mtp_only=True`` an
MTP-only sidecar (``token_embd``, ``output_norm``, ``output`` and the MTP block, like
``convert_hf_to_gguf.py --mtp``) that llama-server uses through ``--spec-draft-model`` next to the
``mtp=False`` model (as the main ``-m`` model it crashes llama-server with SIGSEGV). BF16 for
matrices; F32 for 1-D tensors (norms, ``ssm_a``, ``ssm_dt.bias``, ``ffn_gate_inp_shexp``) and for
``ffn_gate_inp`` / ``ssm_conv1d``, as ``convert_hf_to_gguf.py`` writes them.

Tokenizer
---------
A real GPT-2-style byte-level BPE (``tokenizer.ggml.model = gpt2``, ``pre = qwen2``): token ids 0..255
are the 256 bytes (in byte order, spelled with GPT-2's ``bytes_to_unicode``), followed by the
results of BPE merges learnt deterministically from a small built-in English corpus (so the merges are
consistent with the vocabulary by construction), then the control tokens ``<|endoftext|>`` (bos and
pad), ``<|im_start|>``, ``<|im_end|>`` (eos). The real shape pads the vocabulary to 248320 with
``[PAD<i>]`` tokens of type UNUSED, as ``convert_hf_to_gguf.py`` does.

Behaviour: a bigram chain
-------------------------
Blocks contribute almost nothing (every projection back into the residual stream -- ``ssm_out``,
``attn_output``, ``ffn_down*`` -- is ~1e-2 of the signal), so the trunk is a bigram model: the
logits of token ``x`` are ``output . rmsnorm(embed(x))``. Every token ``x`` has a successor
``s(x)``: ``s`` is one random cycle through the "text" tokens (tokens spelling only ASCII letters,
digits, space, ``.`` and ``,``) and maps every other token (other bytes, control tokens) onto a text
token. ``output[y] = (24/n_embd) * sum_{x: s(x)=y} embed(x)`` makes ``s(x)`` win by a wide margin
(logit ~24 against ~N(0, 1.5)), so greedy generation from ``x`` is the deterministic chain
``s(x), s(s(x)), ...``; it never yields a control token or EOS, so it runs to ``max_tokens``.
:func:`predict_tokens` gives that chain without running anything.

The MTP head agrees with the trunk: ``nextn.eh_proj`` is ``[I | 0]`` (it passes the embedding half
of ``[enorm(embed(next)) ; hnorm(hidden)]`` through), the block adds ~nothing, and the shared head
falls back to ``output`` / ``output_norm``. So the draft of token ``t+2`` from token ``t+1`` is
exactly ``s(x_{t+1})``: acceptance 100% at temperature 0.

Prompt dependence (design choice)
---------------------------------
A ChatML prompt always ends with ``<|im_start|>assistant\\n``, so a bigram model would answer every
chat with the same text. The chat template therefore ends the *generation prompt* with the user's
last message, stripped of trailing whitespace and ``.?!``::

    <|im_start|>user\\nTell me about the sea.<|im_end|>\\n<|im_start|>assistant\\nTell me about the sea

so the chain starts from the last token of the user's own words (here the token ending in
``sea``). Different prompts give different texts unless their last words end in the same BPE token;
the same prompt is deterministic. (Making the trunk itself carry earlier-token information would
make trunk and MTP disagree whenever that information flips a prediction, and the acceptance would
no longer follow a known formula -- the knob below needs the bigram to stay exact.) Raw
``/completion`` prompts start the chain from their own last token.

The agreement knob
------------------
``wrong_successor_fraction = f`` writes ``nextn.embed_tokens`` = ``token_embd`` except that a random
set of exactly ``round(f * n_text)`` text tokens get the embedding of another text token, so the MTP
head drafts ``s(other) != s(x)`` after them. In llama.cpp's MTP drafting
(``common/speculative.cpp``, ``common_speculative_impl_draft_mtp``) the head drafts greedily (top-k 10,
``p_min`` default 0 and our drafts have p ~ 1, so drafting never stops early), chaining on its own
drafts: the draft ``d_{i+1} = s(c(d_i))`` is right iff every token of the chain from the last
accepted token is uncorrupted. With clean probability ``q = 1 - f`` per token, the accepted length
of a ``k``-token draft has mean ``sum_{i=1..k} q^i``, so

    acceptance = draft_n_accepted / draft_n = (sum_{i=1..k} (1-f)^i) / k

(:func:`expected_acceptance`). Deviations in practice: the server caps the last drafts of a reply at
``n_remaining - 1`` tokens, and a 64-128-token reply visits only part of the cycle, so the realised
runs of clean tokens along it scatter around the iid expectation. :func:`simulate_acceptance`
replays the server's loop on the actual chain and predicts ``(draft_n, draft_n_accepted)`` of a
reply exactly (the tests check equality against llama-server 0c1e570). Measured on the CPU runtime
(5 chat prompts x 128 tokens, seeds 0-2): f=0 gives 1.000 at every k; f=0.2 gives 0.76-0.83 (k=1,
formula 0.80), 0.61-0.66 (k=3, 0.65); f=0.5 gives 0.52 (k=1, 0.50), 0.29-0.31 (k=3, 0.29),
0.22-0.24 (k=4, 0.23) -- within 0.05 of the formula. For a head with a given acceptance *on a given
prompt set*, :func:`calibrate_wrong_fraction` searches the number of corrupted tokens with that exact
replay (``ggufmtp synth --target-acceptance``; :func:`chat_last_tokens` gets each prompt's last token
from a real llama-server).

``eh_proj_noise = s`` adds gaussian noise of relative RMS ``s`` to ``eh_proj``'s output. It shrinks
the draft logit margin by ``sqrt(1 + s^2)`` against ``sqrt(n_embd)`` (16 for tiny, 45 for the real
shape), so nothing happens until ``s`` approaches ``sqrt(n_embd) / 4``; measured on tiny at k=3:
s=0.5 -> 1.00, s=3 -> 0.77, s=5 -> 0.12, s=8 -> 0.02. It has no closed form; use the fraction knob
for calibrated acceptance.

Streaming
---------
Tensor infos are declared up front, then every tensor is generated and written chunk by chunk
(bounded memory), into a temporary file in the destination directory that is ``os.replace``-d into
place only when complete. Small tensors use a seeded PCG64 generator; tensors over 4 Mi elements
(the real shape's experts and vocabulary padding) tile a seeded 8 MB noise bank -- cheap and
deterministic, and never part of the bigram path. The sha256 is computed in a second thread while
writing. Measured on 2 cores: the real shape with 2 trunk layers (7.1 GB) in 5-22 s, with 1 layer
(5.4 GB) in ~14 s (the spread is the page cache's write-back), peak RSS ~280 MB; tiny in ~0.2 s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import tempfile
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ..errors import GgufmtpError, SynthError

SYNTH_VERSION = 1  # bump when the bytes written for a given spec change (invalidates builtin caches)

ARCHES = ("qwen35moe", "qwen35")
SHAPE_TINY = "tiny"
SHAPE_REAL = "qwen3.6-35b-a3b"
SHAPES = (SHAPE_TINY, SHAPE_REAL)

LOGIT_SCALE = 24.0  # logit of the successor token; the others are ~N(0, (LOGIT_SCALE/sqrt(n_embd))^2)
RESIDUAL_SCALE = 0.01  # relative size of what each block writes back into the residual stream
BIG_TENSOR_ELEMS = 1 << 22  # tensors larger than this (and vocab padding) tile the noise bank
BANK_ELEMS = 4_194_301  # prime, so the tiling never lines up with row lengths
CHUNK_BYTES = 32 << 20


# ----------------------------------------------------------------------------- spec / result


@dataclass(frozen=True)
class SynthSpec:
    """What to synthesize. See the module docstring for the meaning of the knobs."""

    arch: str = "qwen35moe"
    shape: str = SHAPE_TINY
    layers: int = 4
    mtp: bool = True
    seed: int = 0
    wrong_successor_fraction: float = 0.0
    eh_proj_noise: float = 0.0
    omit_tensors: tuple[str, ...] = ()
    mtp_only: bool = False

    def validate(self) -> None:
        if self.arch not in ARCHES:
            raise SynthError(f"arch {self.arch!r}: must be one of {', '.join(ARCHES)}")
        if self.shape not in SHAPES:
            raise SynthError(f"shape {self.shape!r}: must be one of {', '.join(SHAPES)}")
        if self.shape == SHAPE_REAL and self.arch != "qwen35moe":
            raise SynthError(f"shape {SHAPE_REAL!r} is the MoE Qwen3.6-35B-A3B; use arch qwen35moe")
        if not 1 <= self.layers <= 200:
            raise SynthError(f"layers {self.layers}: must be between 1 and 200")
        if not 0.0 <= self.wrong_successor_fraction <= 1.0:
            raise SynthError(f"wrong_successor_fraction {self.wrong_successor_fraction}: must be in [0, 1]")
        if not 0.0 <= self.eh_proj_noise <= 100.0:
            raise SynthError(f"eh_proj_noise {self.eh_proj_noise}: must be in [0, 100]")
        if not 0 <= self.seed < 2**63:
            raise SynthError(f"seed {self.seed}: must be a non-negative 63-bit integer")
        if not self.mtp and (self.wrong_successor_fraction or self.eh_proj_noise or self.omit_tensors
                             or self.mtp_only):
            raise SynthError("mtp=False: the MTP knobs (wrong successors, eh_proj noise, omitted "
                             "tensors, mtp_only) need the MTP block")
        for t in self.omit_tensors:
            if t.removesuffix(".weight").removesuffix(".bias") not in _mtp_suffixes(self):
                raise SynthError(
                    f"omit_tensors: {t!r} is not a tensor of the MTP block; choose among "
                    f"{', '.join(_mtp_suffixes(self))}")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["omit_tensors"] = list(self.omit_tensors)
        return d

    def digest(self) -> str:
        blob = json.dumps({"v": SYNTH_VERSION, **self.to_json()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def expected_acceptance(wrong_successor_fraction: float, draft_n_max: int) -> float:
    """Draft acceptance (accepted / drafted) at temperature 0 for a model made with
    ``wrong_successor_fraction = f``: ``(sum_{i=1..k} (1-f)^i) / k`` at ``draft_n_max = k``.

    Derivation: each draft chains on the previous drafted token; draft ``i`` is accepted iff the
    ``i`` chain tokens before it are all uncorrupted (probability ``(1-f)^i``), and the next draft
    starts at a token not visited before, so accepted lengths are independent with mean
    ``sum_i (1-f)^i``. Holds for long replies (see the module docstring for the end-of-reply cap).
    """
    if draft_n_max < 1:
        raise ValueError("draft_n_max must be >= 1")
    q = 1.0 - float(wrong_successor_fraction)
    return sum(q**i for i in range(1, draft_n_max + 1)) / draft_n_max


@dataclass(frozen=True)
class SynthResult:
    path: Path
    spec: SynthSpec
    mtp_block: int | None
    n_tensors: int
    size_bytes: int
    sha256: str | None = None

    @property
    def servable(self) -> bool:
        """Whether llama-server 0c1e570 can run this file on its own (see :func:`full_attention_interval`;
        an MTP-only sidecar needs a target model next to it)."""
        return self.spec.layers >= 2 and not self.spec.mtp_only

    @property
    def realized_wrong_fraction(self) -> float:
        """The exact fraction of text tokens whose draft successor is wrong in this file."""
        return _realized_fraction(self.spec)

    def expected_acceptance(self, draft_n_max: int) -> float:
        """:func:`expected_acceptance` at the fraction actually written (``round(f*n)/n``); 0 without
        an MTP block. It ignores ``eh_proj_noise`` (no closed form; noise only lowers it)."""
        if self.mtp_block is None:
            return 0.0
        return expected_acceptance(self.realized_wrong_fraction, draft_n_max)

    def to_json(self) -> dict:
        return {
            "path": str(self.path),
            "spec": self.spec.to_json(),
            "mtp_block": self.mtp_block,
            "n_tensors": self.n_tensors,
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "servable": self.servable,
            "realized_wrong_fraction": self.realized_wrong_fraction,
            "expected_acceptance": {str(k): self.expected_acceptance(k) for k in range(1, 5)},
        }


BUILTIN_MODELS: dict[str, SynthSpec] = {
    "tiny-qwen35moe": SynthSpec(),
    "tiny-qwen35moe-f20": SynthSpec(wrong_successor_fraction=0.2),
    "tiny-qwen35moe-f50": SynthSpec(wrong_successor_fraction=0.5),
    "tiny-qwen35moe-noise": SynthSpec(eh_proj_noise=0.5),
    "tiny-qwen35": SynthSpec(arch="qwen35"),
    "tiny-qwen35moe-nomtp": SynthSpec(mtp=False),
    "tiny-qwen35moe-mtp-only": SynthSpec(mtp_only=True),
    "tiny-qwen35moe-no-hnorm": SynthSpec(omit_tensors=("nextn.hnorm",)),
}


def resolve_model(model: str | os.PathLike) -> Path:
    """``builtin:NAME`` -> that built-in model's path (synthesized once); anything else -> the
    absolute path it names (existence is the caller's check, with its own error)."""
    s = str(model)
    if s.startswith("builtin:"):
        return builtin_path(s)
    return Path(s).expanduser().resolve()


def builtin_path(name: str, cache_dir: Path | None = None, progress: bool = False) -> Path:
    """Path of built-in model ``name`` (``"builtin:NAME"`` or ``"NAME"``), synthesized once into
    ``cache_root()/"builtin"`` (keyed by the spec and the synth version; atomic write)."""
    key = name.removeprefix("builtin:")
    if key not in BUILTIN_MODELS:
        raise SynthError(f"unknown built-in model {name!r}; known: {', '.join(sorted(BUILTIN_MODELS))}")
    spec = BUILTIN_MODELS[key]
    if cache_dir is None:
        from ..runtime.build import cache_root

        cache_dir = cache_root() / "builtin"
    path = Path(cache_dir) / f"{key}-{spec.digest()[:12]}.gguf"
    if not path.is_file():
        synthesize(path, spec, progress=progress)
    return path


# ----------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Dims:
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
}


# ----------------------------------------------------------------------------- tokenizer

_CORPUS = """\
The sea was calm in the morning, and the small boats went out past the harbour wall before the
sun was over the hills. Fishermen know the weather better than most people, because their work
depends on it. When the wind turns to the north and the clouds grow dark, they bring the nets in
and head for home. A good captain listens to the radio, watches the birds and trusts his own eyes.
Gravity is the force that pulls every object toward every other object. The larger the mass, the
stronger the pull, and the closer two things are, the stronger it becomes. It keeps the moon in
its orbit around the earth and the earth in its orbit around the sun. Without it there would be no
planets, no stars and no oceans, only a thin cloud of gas drifting through space.
To make bread you need flour, water, salt and yeast. Mix them together, knead the dough for ten
minutes until it is smooth, and let it rise in a warm place for about an hour. Then shape the
loaf, let it rise again, and bake it in a hot oven until the crust is brown and it sounds hollow
when you tap the bottom. Fresh bread is one of the simple pleasures of life.
Computers store information as numbers. A program is a list of instructions that the machine
follows one after another, reading values from memory, doing arithmetic and writing the results
back. Modern processors can do billions of these steps every second, and a language model is
nothing more than a very long program that predicts the next word from the words that came before.
The history of the city goes back more than two thousand years. Traders came by river and by road,
markets grew around the old bridge, and the town became rich from wool, wine and iron. Many of the
streets still follow the lines of the medieval walls, and visitors can walk from the cathedral to
the castle in less than twenty minutes.
Learning a new language takes patience. Read a little every day, listen to people speak, write
short notes and do not be afraid of making mistakes. Children learn by playing and by copying the
adults around them; grown people can learn the same way if they are willing to sound a little
foolish at first. After a few months the strange words begin to feel familiar.
Please answer the question, explain your reasoning and give a short summary at the end. What is the
capital of France? How many days are there in a year? Why is the sky blue? Which planet is the
largest? Who wrote this story, and when was it first published? Thank you for your help.
In the garden the roses were in flower, the apple trees were heavy with fruit and the grass needed
cutting. Water the plants in the evening, when the air is cool, and they will grow strong and
green. Birds sing in the hedges, bees work among the flowers and the cat sleeps in the sun.
"""

_N_MERGES = 480
_PRETOKENIZE = re.compile(r"'(?:[sdmt]|ll|ve|re)|[^\r\n A-Za-z0-9]?[A-Za-z]+| [A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+")
_TEXT_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML whose generation prompt ends with the user's own last words (see the module docstring).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if messages|length > 0 and messages[-1]['role'] == 'user' -%}"
    "{{- messages[-1]['content'].rstrip(' \\t\\r\\n.?!') -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    token_bytes: tuple[bytes | None, ...]  # None for control / unused tokens
    n_text_vocab: int  # tokens that can appear as input (bytes + merges + specials)
    bos: int
    eos: int
    pad: int
    im_start: int

    def __len__(self) -> int:
        return len(self.tokens)

    def text_token_ids(self) -> np.ndarray:
        """Tokens allowed as successors: spelled only with letters, digits, space, '.' and ','."""
        return np.array([i for i, b in enumerate(self.token_bytes)
                         if b is not None and b and all(c in _TEXT_BYTES for c in b)], dtype=np.int64)

    def decode(self, ids) -> str:
        return b"".join(self.token_bytes[i] or self.tokens[i].encode() for i in ids).decode("utf-8", "replace")


def _learn_merges(n_merges: int) -> list[tuple[str, str]]:
    b2u = bytes_to_unicode()
    words: dict[tuple[str, ...], int] = {}
    for piece in _PRETOKENIZE.findall(_CORPUS):
        w = tuple(b2u[b] for b in piece.encode("utf-8"))
        words[w] = words.get(w, 0) + 1
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: dict[tuple[str, str], int] = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0][0] + " " + kv[0][1]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        new_words: dict[tuple[str, ...], int] = {}
        for w, c in words.items():
            out: list[str] = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == best[0] and w[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            t = tuple(out)
            new_words[t] = new_words.get(t, 0) + c
        words = new_words
    return merges


@lru_cache(maxsize=4)
def build_vocab(shape: str = SHAPE_TINY) -> Vocab:
    """The tokenizer of a synthetic model (identical for every seed; padded for the real shape)."""
    b2u = bytes_to_unicode()
    u2b = {u: b for b, u in b2u.items()}
    tokens = [b2u[b] for b in range(256)]
    tbytes: list[bytes | None] = [bytes([b]) for b in range(256)]
    seen = set(tokens)
    merges = []
    for a, b in _learn_merges(_N_MERGES):
        t = a + b
        merges.append(f"{a} {b}")
        if t not in seen:
            seen.add(t)
            tokens.append(t)
            tbytes.append(bytes(u2b[c] for c in t))
    types = [1] * len(tokens)
    ids = {}
    for s in SPECIAL_TOKENS:
        ids[s] = len(tokens)
        tokens.append(s)
        tbytes.append(None)
        types.append(3)
    n_text = len(tokens)
    target = DIMS[shape].vocab
    if target is not None:
        if target < n_text:
            raise SynthError(f"vocab {target} smaller than the tokenizer ({n_text})")
        for i in range(target - n_text):
            tokens.append(f"[PAD{i}]")
            tbytes.append(None)
            types.append(5)
    return Vocab(tuple(tokens), tuple(types), tuple(merges), tuple(tbytes), n_text,
                 bos=ids["<|endoftext|>"], eos=ids["<|im_end|>"], pad=ids["<|endoftext|>"],
                 im_start=ids["<|im_start|>"])


# ----------------------------------------------------------------------------- the bigram chain


def _rng(spec: SynthSpec, *key: int | str) -> np.random.Generator:
    words = [spec.seed & 0xFFFFFFFF, spec.seed >> 32]
    for k in key:
        words.append(zlib.crc32(k.encode()) if isinstance(k, str) else int(k) & 0xFFFFFFFF)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


@dataclass(frozen=True)
class Chain:
    successor: np.ndarray  # [n_text_vocab] -> token id (trunk), defined for every input token
    draft_successor: np.ndarray  # [n_text_vocab] -> what the MTP head drafts after each token
    embed_source: np.ndarray  # [n_text_vocab] row of token_embd written as nextn.embed_tokens[x]
    corrupted: np.ndarray  # bool [n_text_vocab]
    text_ids: np.ndarray


_chain_cache: dict[tuple, Chain] = {}


def chain_for(spec: SynthSpec) -> Chain:
    """The successor function s (and the MTP head's draft successor) of a spec."""
    key = (spec.shape, spec.seed, spec.wrong_successor_fraction)
    if key in _chain_cache:
        return _chain_cache[key]
    vocab = build_vocab(spec.shape)
    n = vocab.n_text_vocab
    text = vocab.text_token_ids()
    rng = _rng(spec, "chain")
    cycle = rng.permutation(text)
    succ = np.empty(n, dtype=np.int64)
    succ[cycle] = np.roll(cycle, -1)
    others = np.setdiff1d(np.arange(n), text)
    succ[others] = cycle[rng.permutation(len(cycle))[: len(others)] % len(cycle)] if len(others) <= len(cycle) \
        else cycle[rng.integers(0, len(cycle), len(others))]
    n_bad = int(round(spec.wrong_successor_fraction * len(text)))
    corrupted = np.zeros(n, dtype=bool)
    source = np.arange(n)
    if n_bad:
        bad = rng.choice(text, size=n_bad, replace=False)
        corrupted[bad] = True
        # each corrupted token borrows the embedding of another text token (never itself)
        pos = {int(t): i for i, t in enumerate(cycle)}
        for t in bad:
            off = int(rng.integers(1, len(cycle)))
            source[t] = cycle[(pos[int(t)] + off) % len(cycle)]
    draft = succ[source]
    ch = Chain(succ, draft, source, corrupted, text)
    _chain_cache[key] = ch
    return ch


def _realized_fraction(spec: SynthSpec) -> float:
    if not spec.wrong_successor_fraction:
        return 0.0
    ch = chain_for(spec)
    return float(ch.corrupted[ch.text_ids].mean())


def predict_tokens(spec: SynthSpec, last_token: int, n: int) -> list[int]:
    """The tokens greedy decoding produces after a prompt ending in ``last_token``."""
    succ = chain_for(spec).successor
    out, t = [], int(last_token)
    for _ in range(n):
        t = int(succ[t])
        out.append(t)
    return out


def simulate_acceptance(spec: SynthSpec, last_token: int, n_predict: int, draft_n_max: int,
                        draft_n_min: int = 0) -> tuple[int, int]:
    """(drafted, accepted) that llama-server's draft-mtp loop should report for one reply of
    ``n_predict`` tokens after a prompt ending in ``last_token`` (temperature 0, one slot): each
    draft is capped at ``n_remaining - 1`` tokens, discarded below ``draft_n_min``."""
    ch = chain_for(spec)
    seq = predict_tokens(spec, last_token, n_predict)
    drafted = accepted = 0
    n_gen = 1  # the first token comes from the prompt pass
    last = seq[0]
    while n_gen < n_predict:
        n_max = min(draft_n_max, n_predict - n_gen - 1)
        if n_max <= 0 or n_max < max(draft_n_min, 1):
            n_gen += 1
            last = seq[n_gen - 1]
            continue
        d, t = [], last
        for _ in range(n_max):
            t = int(ch.draft_successor[t])
            d.append(t)
        a = 0
        while a < len(d) and d[a] == seq[n_gen + a]:
            a += 1
        drafted += len(d)
        accepted += a
        n_gen += a + 1
        last = seq[min(n_gen, n_predict) - 1]
    return drafted, accepted


def suite_acceptance(spec: SynthSpec, last_tokens: Iterable[int], n_predict: int, draft_n_max: int,
                     draft_n_min: int = 0) -> tuple[int, int]:
    """(drafted, accepted) summed over replies of ``n_predict`` tokens to prompts ending in each of
    ``last_tokens``: what a verify run of those prompts at temperature 0 reports, exactly (seeds do
    not change it)."""
    drafted = accepted = 0
    for t in last_tokens:
        d, a = simulate_acceptance(spec, int(t), n_predict, draft_n_max, draft_n_min)
        drafted, accepted = drafted + d, accepted + a
    return drafted, accepted


@dataclass(frozen=True)
class Calibration:
    """The wrong-successor fraction whose *realized* acceptance on a prompt set is nearest a target."""

    wrong_successor_fraction: float
    draft_n_max: int
    target: float
    acceptance: float  # exact, on the prompt set, at draft_n_max
    formula_fraction: float  # the fraction the iid formula gives for the target
    candidates: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def calibrate_wrong_fraction(target: float, draft_n_max: int, last_tokens: Sequence[int], n_predict: int,
                             base: SynthSpec = SynthSpec(), spread: float = 0.25) -> Calibration:
    """The fraction (a whole number of corrupted text tokens) within ``spread`` (relative) of the
    formula's inverse whose exact acceptance on the prompts is nearest ``target``; ties go to the one
    nearer the formula.

    Why: a 128-token reply visits a small part of the successor cycle, so which tokens are corrupted
    moves a prompt set's acceptance by a few points around :func:`expected_acceptance` (f=0.136, 75.2%
    by the formula, gave 74.0% on chat-v1 at k=3). Benchmarks that quote "at 75% acceptance" pick
    the head by the acceptance it actually has on their prompts."""
    if not 0.0 < target < 1.0:
        raise SynthError(f"target acceptance {target}: must be in (0, 1)")
    if not last_tokens:
        raise SynthError("calibration needs at least one prompt")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # expected_acceptance falls monotonically in f
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_acceptance(mid, draft_n_max) > target else (lo, mid)
    f0 = (lo + hi) / 2
    n_text = len(build_vocab(base.shape).text_token_ids())
    first = max(1, int(math.floor(f0 * (1 - spread) * n_text)))
    last = min(n_text, int(math.ceil(f0 * (1 + spread) * n_text)))
    acceptance: dict[float, float] = {}
    for n_bad in range(first, last + 1):
        f = n_bad / n_text
        d, a = suite_acceptance(dataclasses.replace(base, wrong_successor_fraction=f), last_tokens, n_predict, draft_n_max)
        acceptance[f] = a / d if d else 0.0
    f = min(acceptance, key=lambda x: (abs(acceptance[x] - target), abs(x - f0)))
    return Calibration(round(f, 6), draft_n_max, target, acceptance[f], f0, len(acceptance))


def chat_last_tokens(messages: Sequence[list[dict[str, str]]], threads: int | None = None) -> list[int]:
    """The last token of each chat's generation prompt, as llama-server renders and tokenizes it for
    a synthetic model: a CPU llama-server on the built-in tiny model does it (every synthetic model,
    tiny or real-shaped, has the same tokenizer and chat template)."""
    from ..runtime.server import LlamaServer, ServerConfig  # the server module sits later in the pipeline

    with LlamaServer(ServerConfig(model=builtin_path("tiny-qwen35moe"), threads=threads, metrics=False,
                                  gpu_layers=0)) as srv:
        return [srv.tokenize(srv.post_json("/apply-template", {"messages": m})["prompt"])[-1]
                for m in messages]


# ----------------------------------------------------------------------------- tensor plan

F32, BF16 = 0, 30  # GGMLQuantizationType values


@dataclass
class TensorPlan:
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
    return (b.astype(np.uint32) << 16).view(np.float32)


class _Builder:
    def __init__(self, spec: SynthSpec):
        self.spec = spec
        self.d = DIMS[spec.shape]
        self.vocab = build_vocab(spec.shape)
        self.chain = chain_for(spec)
        self._banks: dict[float, np.ndarray] = {}
        self._embd: np.ndarray | None = None

    # --- data sources
    def bank(self, std: float) -> np.ndarray:
        if std not in self._banks:
            z = _rng(self.spec, "bank").standard_normal(BANK_ELEMS, dtype=np.float32)
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
            rng = _rng(self.spec, name)
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

    def custom(self, name: str, ne: tuple[int, ...], dtype: int, fn: Callable[[], Iterator[np.ndarray]]) -> TensorPlan:
        return TensorPlan(name, ne, dtype, fn)

    def embeddings(self) -> np.ndarray:
        """float32 [n_text_vocab, n_embd], already rounded to bf16 (what the file holds)."""
        if self._embd is None:
            z = _rng(self.spec, "token_embd").standard_normal((self.vocab.n_text_vocab, self.d.n_embd), dtype=np.float32)
            self._embd = from_bf16(to_bf16(z)).reshape(z.shape)
        return self._embd

    def vocab_rows(self, name: str, text_rows: Callable[[], np.ndarray], pad_std: float) -> Iterator[np.ndarray]:
        yield to_bf16(text_rows()).reshape(-1)
        n_pad = (len(self.vocab) - self.vocab.n_text_vocab) * self.d.n_embd
        if n_pad:
            yield from self.tiled(name + ".pad", n_pad, pad_std)

    # --- model tensors
    def plans(self) -> list[TensorPlan]:
        s, d = self.spec, self.d
        n_vocab, n = len(self.vocab), d.n_embd
        out: list[TensorPlan] = []
        emb = self.embeddings
        # an MTP-only sidecar keeps these too: the loader requires token_embd and output_norm,
        # and the MTP head falls back to them and to output (convert_hf_to_gguf.py --mtp does the same)
        out.append(self.custom("token_embd.weight", (n, n_vocab), BF16,
                               lambda: self.vocab_rows("token_embd.weight", emb, 1.0)))
        out.append(self.const("output_norm.weight", (n,), 1.0))
        out.append(self.custom("output.weight", (n, n_vocab), BF16,
                               lambda: self.vocab_rows("output.weight", self.output_rows, 0.02)))
        if not s.mtp_only:
            interval = full_attention_interval(s)
            for il in range(s.layers):
                out += self.block(il, recurrent=(il + 1) % interval != 0)
        if s.mtp:
            il = s.layers
            mtp = self.block(il, recurrent=False) + self.nextn(il)
            omit = {f"blk.{il}.{t}" for t in s.omit_tensors} | {f"blk.{il}.{t}.weight" for t in s.omit_tensors}
            out += [p for p in mtp if p.name not in omit]
        return out

    def output_rows(self) -> np.ndarray:
        e = self.embeddings()
        rows = np.zeros_like(e)
        np.add.at(rows, self.chain.successor, e)
        return rows * np.float32(LOGIT_SCALE / self.d.n_embd)

    def block(self, il: int, recurrent: bool) -> list[TensorPlan]:
        d, n = self.d, self.d.n_embd
        p = f"blk.{il}."
        w = 1.0 / math.sqrt(n)
        out = [self.const(p + "attn_norm.weight", (n,), 1.0),
               self.const(p + "post_attention_norm.weight", (n,), 1.0)]
        if recurrent:
            vdim, kdim = d.ssm_inner, d.ssm_state * d.ssm_groups
            out += [
                self.normal(p + "attn_qkv.weight", (n, 2 * kdim + vdim), w, BF16),
                self.normal(p + "attn_gate.weight", (n, vdim), w, BF16),
                self.normal(p + "ssm_conv1d.weight", (d.ssm_conv_kernel, d.conv_dim), 0.5, F32),
                self.normal(p + "ssm_dt.bias", (d.ssm_dt_rank,), 0.1, F32, mean=1.0),
                self.custom(p + "ssm_a", (d.ssm_dt_rank,), F32,
                            lambda il=il: iter([-np.exp(_rng(self.spec, f"blk.{il}.ssm_a").uniform(0, 1.5, d.ssm_dt_rank)).astype(np.float32)])),
                self.normal(p + "ssm_beta.weight", (n, d.ssm_dt_rank), w, BF16),
                self.normal(p + "ssm_alpha.weight", (n, d.ssm_dt_rank), w, BF16),
                self.const(p + "ssm_norm.weight", (d.ssm_state,), 1.0),
                self.normal(p + "ssm_out.weight", (vdim, n), RESIDUAL_SCALE / math.sqrt(vdim), BF16),
            ]
        else:
            hq = d.head_dim * d.n_head
            hkv = d.head_dim * d.n_head_kv
            out += [
                self.normal(p + "attn_q.weight", (n, 2 * hq), w, BF16),
                self.normal(p + "attn_k.weight", (n, hkv), w, BF16),
                self.normal(p + "attn_v.weight", (n, hkv), w, BF16),
                self.normal(p + "attn_output.weight", (hq, n), RESIDUAL_SCALE / math.sqrt(hq), BF16),
                self.const(p + "attn_q_norm.weight", (d.head_dim,), 1.0),
                self.const(p + "attn_k_norm.weight", (d.head_dim,), 1.0),
            ]
        if self.spec.arch == "qwen35moe":
            out += [
                self.normal(p + "ffn_gate_inp.weight", (n, d.n_expert), w, F32),
                self.normal(p + "ffn_gate_exps.weight", (n, d.n_ff_exp, d.n_expert), w, BF16),
                self.normal(p + "ffn_up_exps.weight", (n, d.n_ff_exp, d.n_expert), w, BF16),
                self.normal(p + "ffn_down_exps.weight", (d.n_ff_exp, n, d.n_expert),
                            RESIDUAL_SCALE / math.sqrt(d.n_ff_exp), BF16),
                self.normal(p + "ffn_gate_inp_shexp.weight", (n,), w, F32),
                self.normal(p + "ffn_gate_shexp.weight", (n, d.n_ff_shexp), w, BF16),
                self.normal(p + "ffn_up_shexp.weight", (n, d.n_ff_shexp), w, BF16),
                self.normal(p + "ffn_down_shexp.weight", (d.n_ff_shexp, n),
                            RESIDUAL_SCALE / math.sqrt(d.n_ff_shexp), BF16),
            ]
        else:
            out += [
                self.normal(p + "ffn_gate.weight", (n, d.n_ff), w, BF16),
                self.normal(p + "ffn_up.weight", (n, d.n_ff), w, BF16),
                self.normal(p + "ffn_down.weight", (d.n_ff, n), RESIDUAL_SCALE / math.sqrt(d.n_ff), BF16),
            ]
        return out

    def nextn(self, il: int) -> list[TensorPlan]:
        s, n, p = self.spec, self.d.n_embd, f"blk.{il}.nextn."

        def eh_proj() -> Iterator[np.ndarray]:
            m = np.zeros((n, 2 * n), dtype=np.float32)  # numpy [out, in]: out = m @ [e; h]
            m[np.arange(n), np.arange(n)] = 1.0
            if s.eh_proj_noise:
                m += _rng(s, p + "eh_proj").standard_normal(m.shape, dtype=np.float32) * np.float32(
                    s.eh_proj_noise / math.sqrt(2 * n))
            yield to_bf16(m).reshape(-1)

        out = [
            self.custom(p + "eh_proj.weight", (2 * n, n), BF16, eh_proj),
            self.const(p + "enorm.weight", (n,), 1.0),
            self.const(p + "hnorm.weight", (n,), 1.0),
            self.const(p + "shared_head_norm.weight", (n,), 1.0),
        ]
        if s.wrong_successor_fraction > 0:
            src = self.chain.embed_source
            out.append(self.custom(p + "embed_tokens.weight", (n, len(self.vocab)), BF16,
                                   lambda: self.vocab_rows("token_embd.weight", lambda: self.embeddings()[src], 1.0)))
        return out


def _mtp_suffixes(spec: SynthSpec) -> list[str]:
    b = _Builder.__new__(_Builder)
    b.spec, b.d = spec, DIMS[spec.shape]
    names = [t.name for t in _Builder.block(b, 0, recurrent=False)]
    names += ["blk.0.nextn.eh_proj.weight", "blk.0.nextn.enorm.weight", "blk.0.nextn.hnorm.weight",
              "blk.0.nextn.shared_head_norm.weight", "blk.0.nextn.embed_tokens.weight"]
    return [nm.removeprefix("blk.0.").removesuffix(".weight") for nm in names]


# ----------------------------------------------------------------------------- metadata


def full_attention_interval(spec: SynthSpec) -> int:
    """4 (layers 0-2 Gated DeltaNet, 3 full attention, ...), or ``layers`` when there are 2 or 3
    trunk layers: llama.cpp 0c1e570 aborts at warm-up (``GGML_ASSERT(buffer)`` in the hybrid
    memory's ``set_input``) on a trunk without any attention layer, and equally on one without any
    recurrent layer -- so a 1-layer model (written with interval 4: one DeltaNet layer) loads in
    the GGUF tools but llama-server cannot run it (:attr:`SynthResult.servable` is False)."""
    return 4 if spec.layers == 1 else min(4, spec.layers)


def _add_metadata(w, spec: SynthSpec, vocab: Vocab) -> None:
    import gguf

    d, a = DIMS[spec.shape], spec.arch
    n_layer_all = spec.layers + (1 if spec.mtp else 0)
    # general.architecture is written by GGUFWriter itself
    w.add_string("general.type", "model")
    w.add_string("general.name", f"ggufmtp synthetic {spec.shape} {a}")
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_BF16))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    w.add_uint32(f"{a}.context_length", d.ctx)
    w.add_uint32(f"{a}.embedding_length", d.n_embd)
    w.add_uint32(f"{a}.block_count", n_layer_all)
    w.add_uint32(f"{a}.nextn_predict_layers", 1 if spec.mtp else 0)
    w.add_uint32(f"{a}.attention.head_count", d.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", d.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", d.head_dim)
    w.add_uint32(f"{a}.attention.value_length", d.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", d.rms_eps)
    w.add_uint32(f"{a}.rope.dimension_count", d.rope_dims)
    w.add_array(f"{a}.rope.dimension_sections", list(d.rope_sections))
    w.add_float32(f"{a}.rope.freq_base", d.rope_freq_base)
    if a == "qwen35moe":
        w.add_uint32(f"{a}.expert_count", d.n_expert)
        w.add_uint32(f"{a}.expert_used_count", d.n_expert_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", d.n_ff_exp)
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", d.n_ff_shexp)
    else:
        w.add_uint32(f"{a}.feed_forward_length", d.n_ff)
    w.add_uint32(f"{a}.ssm.conv_kernel", d.ssm_conv_kernel)
    w.add_uint32(f"{a}.ssm.state_size", d.ssm_state)
    w.add_uint32(f"{a}.ssm.group_count", d.ssm_groups)
    w.add_uint32(f"{a}.ssm.time_step_rank", d.ssm_dt_rank)
    w.add_uint32(f"{a}.ssm.inner_size", d.ssm_inner)
    w.add_uint32(f"{a}.full_attention_interval", full_attention_interval(spec))
    # tokenizer
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", list(vocab.tokens))
    w.add_array("tokenizer.ggml.token_type", list(vocab.token_types))
    w.add_array("tokenizer.ggml.merges", list(vocab.merges))
    w.add_uint32("tokenizer.ggml.eos_token_id", vocab.eos)
    w.add_uint32("tokenizer.ggml.padding_token_id", vocab.pad)
    w.add_uint32("tokenizer.ggml.bos_token_id", vocab.bos)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", CHAT_TEMPLATE)
    # provenance
    w.add_string("ggufmtp.synth.spec", json.dumps(spec.to_json(), sort_keys=True))
    w.add_uint32("ggufmtp.synth.version", SYNTH_VERSION)
    w.add_float32("ggufmtp.synth.wrong_successor_fraction", float(_realized_fraction(spec)))


# ----------------------------------------------------------------------------- writing


def plan(spec: SynthSpec) -> list[TensorPlan]:
    """The tensors ``synthesize`` would write (names, ggml shapes, types), without any data."""
    spec.validate()
    return _Builder(spec).plans()


def synthesize(out: str | os.PathLike, spec: SynthSpec = SynthSpec(), progress: bool = True,
               sha256: bool = True) -> SynthResult:
    """Write the model described by ``spec`` to ``out``: streamed tensor by tensor (bounded memory),
    into a temp file in the same directory that is renamed into place only when complete (an
    interruption leaves nothing behind). ``sha256`` hashes the bytes while writing them."""
    import gguf
    from tqdm import tqdm

    spec.validate()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    builder = _Builder(spec)
    plans = builder.plans()
    total = sum(p.nbytes for p in plans)

    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    w = None
    hasher = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        w = gguf.GGUFWriter(path=None, arch=spec.arch)
        _add_metadata(w, spec, builder.vocab)
        for p in plans:
            w.add_tensor_info(p.name, tuple(reversed(p.ne)), np.dtype(np.float32 if p.dtype == F32 else np.float16),
                              p.nbytes, raw_dtype=gguf.GGMLQuantizationType(p.dtype))
        w.write_header_to_file(path=tmp)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        fout = w.fout[0]
        fout.flush()
        h = hashlib.sha256() if sha256 else None
        hasher = _Hasher(h) if h is not None else None
        if hasher is not None:
            with open(tmp, "rb") as fh:
                hasher.put(fh.read(fout.tell()))

        def put(b) -> None:
            if hasher is not None:
                hasher.put(b)  # hashed in a second thread while this one writes
            fout.write(b)

        align = w.data_alignment
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"synth {out.name}", disable=None if progress else True,
                  leave=False) as bar:
            for p in plans:
                if pad := (-fout.tell()) % align:
                    put(b"\x00" * pad)
                written = 0
                for chunk in p.chunks():
                    b = memoryview(np.ascontiguousarray(chunk)).cast("B")
                    put(b)
                    written += len(b)
                    bar.update(len(b))
                if written != p.nbytes:
                    raise SynthError(f"internal error: {p.name} wrote {written} bytes, expected {p.nbytes}")
            if pad := (-fout.tell()) % align:
                put(b"\x00" * pad)
        if hasher is not None:
            hasher.close()
        w.close()
        size = tmp.stat().st_size
        os.replace(tmp, out)
    except BaseException:
        if hasher is not None:
            hasher.close()
        if w is not None:
            with contextlib.suppress(Exception):
                w.close()
        tmp.unlink(missing_ok=True)
        raise
    return SynthResult(path=out, spec=spec, mtp_block=spec.layers if spec.mtp else None,
                       n_tensors=len(plans), size_bytes=size, sha256=h.hexdigest() if h is not None else None)


class _Hasher:
    """sha256 in a worker thread (hashlib releases the GIL), fed through a small bounded queue."""

    def __init__(self, h):
        import queue
        import threading

        self.h = h
        self.q: "queue.Queue" = queue.Queue(maxsize=4)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        while (b := self.q.get()) is not None:
            self.h.update(b)

    def put(self, b) -> None:
        self.q.put(b)

    def close(self) -> None:
        if self.t.is_alive():
            self.q.put(None)
            self.t.join()


def file_sha256(path: str | os.PathLike, bufsize: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(bufsize):
            h.update(chunk)
    return h.hexdigest()
