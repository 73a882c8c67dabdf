"""An MTP model's trunk as content: what stays the same between variants that differ only in the head.

A head-precision ladder (one trunk recipe, the ``[mtp]`` roles at Q4_K, Q8_0 or BF16) makes files
whose bytes differ only inside the MTP block(s); everything the trunk computes is the same. Two
readings of that, one implementation:

- :func:`trunk_digests`: the sha256 of every tensor outside the MTP block(s), by name (head-sweep
  names the first tensor that differs);
- :func:`trunk_digest`: one sha256 of the trunk (those tensors by name, type, shape and bytes, in
  name order, so the same trunk split into other shards or written in another order is the same
  trunk) and of the metadata the server computes with (:func:`computes_with`), over every shard.

Hashing a 20 GB trunk costs a read, so :func:`trunk_digest` can be memoized by the files' sha256
(a :class:`~ggufmtp.files.memo.JsonMemo`): a file's bytes fix its trunk, so once per artifact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from gguf.constants import Keys

from ..errors import GGUFReadError
from ..files.memo import JsonMemo
from .model import GGUFModel, tensor_array
from .reader import read_header

__all__ = ["TRUNK_DIGEST_VERSION", "computes_with", "is_mtp_tensor", "trunk_digest", "trunk_digests"]

#: What :func:`trunk_digest` hashes; a change to it changes this (and so every memoized entry's meaning).
TRUNK_DIGEST_VERSION = 1
# Metadata the server does not compute with (a key-value pair under these prefixes, except the
# architecture): ``general.*`` names, licences, the file type label (llama.cpp reads each tensor's own
# type, and prints ``general.file_type`` only), the quantization version and the data alignment (the
# tensors are hashed by content, not by offset); ``quantize.*``, the imatrix's bookkeeping (file name,
# dataset, entry and chunk counts: the imatrix acts through the tensors' bytes); ``split.*``, how the
# set is cut into files. Every other key (architecture hyperparameters, tokenizer, chat template,
# rope, ``nextn_predict_layers``) is hashed: a change to any of them may change what the server does.
_LABELS = ("general.", "quantize.", "split.")
_KEPT = frozenset({Keys.General.ARCHITECTURE})


def computes_with(key: str) -> bool:
    """Whether a metadata key belongs to the trunk's content (see ``_LABELS``)."""
    return key in _KEPT or not key.startswith(_LABELS)


def is_mtp_tensor(name: str, blocks: Sequence[int]) -> bool:
    """Whether tensor ``name`` lies in one of the MTP ``blocks``."""
    return any(name.startswith(f"blk.{b}.") for b in blocks)


def _tensor_sha256(model: GGUFModel, name: str) -> str:
    """sha256 of one tensor's type, shape and bytes; GGUFReadError naming the shard when they cannot be read."""
    t = model.tensors[name]
    h = hashlib.sha256(f"{t.type}\0{list(t.shape)}\0".encode())
    try:
        h.update(tensor_array(model, name).data)
    except (OSError, ValueError) as e:  # a shard cut short or unreadable since its header was read
        raise GGUFReadError(f"{model.shards[t.shard]}: cannot read tensor {name} ({e})") from None
    return h.hexdigest()


def _trunk_tensors(model: GGUFModel) -> dict[str, str]:
    blocks = model.mtp_blocks
    return {name: _tensor_sha256(model, name) for name in model.tensors if not is_mtp_tensor(name, blocks)}


def trunk_digests(path: str | Path) -> dict[str, str]:
    """sha256 of every tensor outside the MTP block(s) (its type, shape and bytes), by name: what must
    not change between head variants."""
    return _trunk_tensors(GGUFModel(path))


def _metadata_sha256(shard: Path) -> str:
    """sha256 of the first shard's key-value pairs the server computes with, each as its key and the
    type and value bytes as written (a 248k-token vocabulary included, not its summary)."""
    header = read_header(shard)
    h = hashlib.sha256()
    try:
        with open(shard, "rb") as fh:
            for key in sorted(k for k in header.fields if computes_with(k)):
                start, end = header.fields[key].value_span
                fh.seek(start)
                h.update(f"{key}\0{end - start}\0".encode() + fh.read(end - start))
    except OSError as e:
        raise GGUFReadError(f"{shard}: cannot read its metadata ({e.strerror or e})") from None
    return h.hexdigest()


def _compute(path: Path) -> str:
    model = GGUFModel(path)
    h = hashlib.sha256(f"ggufmtp trunk v{TRUNK_DIGEST_VERSION}\0{_metadata_sha256(model.shards[0])}\0".encode())
    for name, sha in sorted(_trunk_tensors(model).items()):
        h.update(f"{name}\0{sha}\0".encode())
    return h.hexdigest()


def trunk_digest(path: str | Path, files: Sequence[str] = (), memo: JsonMemo | None = None) -> str:
    """One sha256 of the trunk of the model at ``path`` (a split model: any shard, all are read).
    With ``memo`` and ``files`` (the sha256 of every file of the model, in order), looked up by those
    digests first and remembered after. GGUFReadError naming the file when it cannot be read."""
    if memo is None or not files:
        return _compute(Path(path))
    key = f"v{TRUNK_DIGEST_VERSION}:" + ",".join(files)
    found = memo.get(key)
    if isinstance(found, dict) and isinstance(found.get("trunk"), str):
        return found["trunk"]
    digest = _compute(Path(path))
    memo.put(key, {"trunk": digest})
    return digest
