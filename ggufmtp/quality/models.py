"""What ``eval`` checks about its two models before running anything: that they are the same model
(architecture and vocabulary, read from the GGUF headers), and how many tokens the corpus makes
with their tokenizer (libllama, vocabulary only: no weights are loaded)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from ..errors import ModelMismatchError, QualityError
from ..gguf.model import split_shards
from ..gguf.reader import read_header
from ..runtime.libllama import capture_log, llama_cpp_module

TOKENS_KEY = "tokenizer.ggml.tokens"


@dataclasses.dataclass(frozen=True)
class ModelIdentity:
    """The parts of a GGUF header that must agree for a KL-divergence to mean anything."""

    path: Path
    architecture: str
    tokenizer: str
    n_vocab: int
    vocab_sha256: str  # of the tokens array's bytes in the file


def model_identity(path: str | Path) -> ModelIdentity:
    """Architecture and vocabulary of the GGUF at ``path`` (first shard's header)."""
    path = Path(path)
    first = split_shards(path)[0]
    header = read_header(first)
    field = header.fields.get(TOKENS_KEY)
    if field is None:
        raise QualityError(f"{path}: no tokenizer ({TOKENS_KEY}) in the GGUF; llama-perplexity cannot evaluate it")
    start, end = field.value_span
    with open(first, "rb") as fh:
        fh.seek(start)
        digest = hashlib.sha256(fh.read(end - start)).hexdigest()
    return ModelIdentity(path=path, architecture=str(header.metadata.get("general.architecture", "unknown")),
                         tokenizer=str(header.metadata.get("tokenizer.ggml.model", "unknown")),
                         n_vocab=int(field.length or 0), vocab_sha256=digest)


def refuse_different_models(base: ModelIdentity, quant: ModelIdentity) -> None:
    """ModelMismatchError naming both files when architecture or vocabulary differ."""
    problems = []
    if base.architecture != quant.architecture:
        problems.append(f"architecture {base.architecture} vs {quant.architecture}")
    if base.n_vocab != quant.n_vocab:
        problems.append(f"vocabulary of {base.n_vocab} vs {quant.n_vocab} tokens")
    elif base.tokenizer != quant.tokenizer or base.vocab_sha256 != quant.vocab_sha256:
        problems.append("the same number of tokens but different vocabularies")
    if problems:
        raise ModelMismatchError(f"{quant.path} is not a quantization of {base.path}: " + "; ".join(problems))


def count_tokens(model: str | Path, text: str) -> int:
    """Tokens ``text`` makes with ``model``'s tokenizer, as llama-perplexity tokenizes its ``-f``
    file (special tokens added, not parsed; the file's one trailing newline dropped)."""
    lc = llama_cpp_module()
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    with capture_log() as log:  # the loader's metadata dump is not for the user's terminal
        handle = lc.llama_model_load_from_file(str(model).encode(), params)
    if not handle:
        raise QualityError(f"{model}: libllama could not load its vocabulary ({(log or ['no log'])[-1].strip()})")
    try:
        vocab = lc.llama_model_get_vocab(handle)
        data = text.removesuffix("\n").encode()
        # With room for no token, llama_tokenize returns minus the count it needs.
        n = lc.llama_tokenize(vocab, data, len(data), (lc.llama_token * 1)(), 0, True, False)
        return -n if n < 0 else n
    finally:
        lc.llama_model_free(handle)
