"""The synthetic models' tokenizer: a real GPT-2-style byte-level BPE and a ChatML chat template.

Token ids 0..255 are the 256 bytes (spelled with GPT-2's ``bytes_to_unicode``), then the results of
BPE merges learnt deterministically from a small built-in English corpus (so the merges are consistent
with the vocabulary by construction), then the control tokens. Every synthetic model, tiny or
real-shaped, has the same tokens; the real shapes pad them to 248320 with unused ``[PAD<i>]`` tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import SynthError
from .layout import DIMS, SHAPE_TINY

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

# The pre-tokenizer of Qwen2/Qwen3 (a tokenizer.json Split regex), which llama.cpp's ``qwen2`` pre-tokenizer
# applies: the HF tokenizers ggufmtp writes (synth --format hf, the trained models) split text with it.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


def chatml_template(generation_tail: str = "") -> str:
    """A ChatML chat template over :data:`SPECIAL_TOKENS`' control tokens (Qwen's, without tools or
    thinking); ``generation_tail``: what the generation prompt renders after ``<|im_start|>assistant``."""
    return ("{%- for message in messages -%}"
            "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}"
            "{{- '<|im_start|>assistant\\n' -}}"
            f"{generation_tail}"
            "{%- endif -%}")


# ChatML whose generation prompt ends with the user's own last words (see the ggufmtp.synth docstring).
CHAT_TEMPLATE = chatml_template(
    "{%- if messages|length > 0 and messages[-1]['role'] == 'user' -%}"
    "{{- messages[-1]['content'].rstrip(' \\t\\r\\n.?!') -}}"
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
    """A synthetic model's tokens, as written to ``tokenizer.ggml.*`` and as bytes for decoding."""

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


def _pretokenized_words() -> dict[tuple[str, ...], int]:
    """The corpus split as the ``qwen2`` pre-tokenizer would, each piece spelled in byte symbols."""
    b2u = bytes_to_unicode()
    words: dict[tuple[str, ...], int] = {}
    for piece in _PRETOKENIZE.findall(_CORPUS):
        w = tuple(b2u[b] for b in piece.encode("utf-8"))
        words[w] = words.get(w, 0) + 1
    return words


def _apply_merge(words: dict[tuple[str, ...], int], pair: tuple[str, str]) -> dict[tuple[str, ...], int]:
    joined = pair[0] + pair[1]
    new_words: dict[tuple[str, ...], int] = {}
    for w, c in words.items():
        out: list[str] = []
        i = 0
        while i < len(w):
            if i + 1 < len(w) and w[i] == pair[0] and w[i + 1] == pair[1]:
                out.append(joined)
                i += 2
            else:
                out.append(w[i])
                i += 1
        t = tuple(out)
        new_words[t] = new_words.get(t, 0) + c
    return new_words


def _learn_merges(n_merges: int) -> list[tuple[str, str]]:
    """Classic BPE training: repeatedly merge the most frequent pair (ties: the later spelling)."""
    words = _pretokenized_words()
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
        words = _apply_merge(words, best)
    return merges


@lru_cache(maxsize=4)
def build_vocab(shape: str = SHAPE_TINY) -> Vocab:
    """The tokenizer of a synthetic model (identical for every seed; padded for the real shapes)."""
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
