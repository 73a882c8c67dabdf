"""The trained model's tokenizer: a byte-level BPE learnt from the corpus, and a ChatML template.

Trained with the ``tokenizers`` library (the same trainer Hugging Face tokenizers come from) on the
training split's message texts, with fixed settings (:class:`~ggufmtp.train.config.TokenizerConfig`):
the result is the same for the same corpus (the tests train it twice). The pre-tokenizer is
Qwen2's split regex followed by GPT-2's byte-level mapping, exactly what llama.cpp's ``qwen2``
pre-tokenizer does, so llama-server tokenizes as the trainer did. The control tokens
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` come last, as in Qwen's vocabulary.

The pinned converter recognises a BPE tokenizer by a hash of how it encodes a fixed text and
refuses unknown ones; :mod:`ggufmtp.hfconvert.runner` declares a ggufmtp-trained checkpoint's own
tokenizer as the ``qwen2`` pre-tokenizer it is (the checkpoint's config.json says it was trained
here and names its tokenizer.json's sha256).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TrainDependencyError
from ..files.fsutil import atomic_write_json, atomic_write_text
from ..synth.tokenizer import QWEN2_SPLIT, SPECIAL_TOKENS, chatml_template
from .config import TokenizerConfig
from .data import Conversation

__all__ = ["CHAT_TEMPLATE", "TokenizerFiles", "train_tokenizer", "write_tokenizer_files", "load_tokenizer",
           "TRAIN_INSTALL_HINT"]

TRAIN_INSTALL_HINT = "pip install 'ggufmtp[train]' (torch, transformers)"

# Plain ChatML (Qwen's, without tools or thinking): what the corpus was rendered with.
CHAT_TEMPLATE = chatml_template()


@dataclass(frozen=True)
class TokenizerFiles:
    """A trained tokenizer: its ``tokenizer.json`` text and the ids the model needs."""

    json: str
    vocab_size: int
    eos_id: int  # <|im_end|>: a reply ends there
    pad_id: int  # <|endoftext|>

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.json.encode()).hexdigest()


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise TrainDependencyError(f"training needs the tokenizers library: {TRAIN_INSTALL_HINT}") from None
    return tokenizers


def _texts(conversations: Iterable[Conversation]) -> Iterator[str]:
    for conv in conversations:
        for role, content in conv.messages:
            yield role + "\n"
            yield content


def train_tokenizer(conversations: Iterable[Conversation], cfg: TokenizerConfig) -> TokenizerFiles:
    """A byte-level BPE of ``cfg.vocab_size`` tokens learnt from the conversations' texts."""
    tk_mod = _tokenizers()
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers

    tk = tk_mod.Tokenizer(models.BPE(fuse_unk=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size - len(SPECIAL_TOKENS), min_frequency=cfg.min_frequency,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
                                  special_tokens=[])
    tk.train_from_iterator(_texts(conversations), trainer)
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    vocab = tk.get_vocab()
    return TokenizerFiles(tk.to_str(), tk.get_vocab_size(), eos_id=vocab["<|im_end|>"], pad_id=vocab["<|endoftext|>"])


def write_tokenizer_files(directory: Path, tok: TokenizerFiles) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template) into ``directory``."""
    atomic_write_text(directory / "tokenizer.json", tok.json)
    atomic_write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_prefix_space": False,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": CHAT_TEMPLATE, "model_max_length": 4096})


def load_tokenizer(tok: TokenizerFiles) -> Any:
    """The ``tokenizers.Tokenizer`` of ``tok`` (to encode the corpus)."""
    return _tokenizers().Tokenizer.from_str(tok.json)
