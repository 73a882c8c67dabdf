"""The training corpus: chat turns made from this Python's own standard library.

Nobody on the project wrote it, and every machine with the same Python (patch release included)
builds it byte for byte: each module's source is parsed (``ast``) and every function, class and
method becomes a conversation, "show me the source of ``mod.Name``" answered with its code, and,
when it has a docstring, "what does ``mod.Name`` do?" answered with the docstring; a module's own
docstring answers "what is ``mod`` for?". The questions' wording is picked by a hash of the name.

Held-out split: a definition is held out when the hash of its qualified name falls below
``heldout_fraction`` (its code and doc turns go together, so nothing held out leaks into
training), independent of the order modules are read in.

:attr:`Corpus.digest` hashes the conversations themselves; the cache key of a trained model uses
it, so another Python's standard library is another corpus. A corpus can be written to a JSONL
file and read back (:func:`write_corpus`, :func:`read_corpus`): the way to train on the same data
on a machine with another Python.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Required, TypedDict

from ..errors import TrainError
from ..files.fsutil import atomic_write_text
from .config import DataConfig

__all__ = ["Conversation", "Corpus", "build_corpus", "write_corpus", "read_corpus", "render_chat", "stdlib_dir"]

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Directories of the standard library that are not library code (tests, demos, bundled wheels,
# the IDE) or are machine-specific (the build configuration).
_SKIP_DIRS = frozenset({"test", "tests", "idlelib", "turtledemo", "site-packages", "__pycache__", "ensurepip",
                        "lib2to3"})
_CODE_QUESTIONS = ("Show me the source of `{q}`.", "How is `{q}` implemented?", "Write `{q}` as the standard library does.")
_DOC_QUESTIONS = ("What does `{q}` do?", "Explain `{q}`.", "Document `{q}`.")


@dataclass(frozen=True)
class Conversation:
    """One chat: ``messages`` as (role, content) pairs; ``id`` names what it is about."""

    id: str
    messages: tuple[tuple[str, str], ...]

    def render(self) -> str:
        """The conversation as the model's ChatML template writes it."""
        return render_chat(self.messages)

    def prompt(self) -> list[dict[str, str]]:
        """The messages up to the last assistant turn (what a request sends)."""
        return [{"role": r, "content": c} for r, c in self.messages[:-1]]


class CorpusOrigin(TypedDict, total=False):
    """Where a corpus came from (a corpus file's header repeats it)."""

    source: str  # stdlib
    python: str
    modules: int


class CorpusSummary(CorpusOrigin):
    """A corpus at a glance (``train --json``, ``train.json``): its sizes, digest and origin."""

    train_conversations: Required[int]
    heldout_conversations: Required[int]
    train_chars: Required[int]
    heldout_chars: Required[int]
    digest: Required[str]


@dataclass(frozen=True)
class Corpus:
    """The train and held-out conversations and where they came from."""

    train: tuple[Conversation, ...]
    heldout: tuple[Conversation, ...]
    origin: CorpusOrigin = field(default_factory=lambda: CorpusOrigin())

    @property
    def digest(self) -> str:
        """sha256 of the conversations (train, then held-out), as canonical JSON."""
        h = hashlib.sha256()
        for split in (self.train, self.heldout):
            h.update(json.dumps([[c.id, [list(m) for m in c.messages]] for c in split],
                                ensure_ascii=False, separators=(",", ":")).encode())
            h.update(b"\n")
        return h.hexdigest()

    def summary(self) -> CorpusSummary:
        chars = sum(len(c.render()) for c in self.train)
        return {"train_conversations": len(self.train), "heldout_conversations": len(self.heldout),
                "train_chars": chars, "heldout_chars": sum(len(c.render()) for c in self.heldout),
                "digest": self.digest, **self.origin}


def render_chat(messages: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> str:
    return "".join(f"{IM_START}{role}\n{content}{IM_END}\n" for role, content in messages)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _module_files(root: Path, modules: tuple[str, ...] | None) -> list[tuple[str, Path]]:
    """(module name, file) for the named modules, or every library module under ``root``."""
    if modules is not None:
        out = []
        for name in modules:
            base = root.joinpath(*name.split("."))
            path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            if not path.is_file():
                raise TrainError(f"standard-library module {name!r}: no {path} (another Python version?)")
            out.append((name, path))
        return out
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        dirs = rel.parts[:-1]
        if _SKIP_DIRS.intersection(dirs) or any(d.startswith("config-") for d in dirs) \
                or rel.name.startswith("_sysconfigdata"):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            found.append((".".join(parts), path))
    return found


def _definitions(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, ast.AST]]:
    """Functions and classes in source order, methods under their class (``Class.method``)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qual = f"{prefix}{node.name}"
            yield qual, node
            if isinstance(node, ast.ClassDef):
                yield from _definitions(node.body, qual + ".")


def _pick(options: tuple[str, ...], key: str) -> str:
    return options[hashlib.sha256(key.encode()).digest()[0] % len(options)]


def _code(lines: list[str], node: Any) -> str:
    """The definition's source, decorators included, dedented."""
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return textwrap.dedent("\n".join(lines[start - 1:node.end_lineno])).strip("\n")


def _module_conversations(name: str, source: str, max_chars: int) -> list[Conversation]:
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a module written for another Python: not library code here
        return []
    lines, out = source.splitlines(), []
    doc = ast.get_docstring(tree)
    if doc and len(doc) <= max_chars:
        out.append(Conversation(name, (("user", f"What is the `{name}` module for?"), ("assistant", doc))))
    for qual, node in _definitions(tree.body, ""):
        q = f"{name}.{qual}"
        code = _code(lines, node)
        if len(code) <= max_chars:
            reply = f"```python\n{code}\n```"
            out.append(Conversation(q, (("user", _pick(_CODE_QUESTIONS, q).format(q=q)), ("assistant", reply))))
        doc = ast.get_docstring(node)  # type: ignore[arg-type]
        if doc and len(doc) <= max_chars:
            out.append(Conversation(q + "#doc", (("user", _pick(_DOC_QUESTIONS, q).format(q=q)), ("assistant", doc))))
    return out


def _held_out(conv_id: str, fraction: float) -> bool:
    name = conv_id.removesuffix("#doc")
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") < fraction * 2**32


def build_corpus(cfg: DataConfig) -> Corpus:
    """The corpus ``cfg`` describes, from this interpreter's standard library."""
    if cfg.source != "stdlib":
        raise TrainError(f"data source {cfg.source!r}: only 'stdlib' is built in (or give a corpus file)")
    root = stdlib_dir()
    train: list[Conversation] = []
    heldout: list[Conversation] = []
    files = _module_files(root, cfg.modules)
    for name, path in files:
        for conv in _module_conversations(name, path.read_text(encoding="utf-8", errors="replace"), cfg.max_chars):
            (heldout if _held_out(conv.id, cfg.heldout_fraction) else train).append(conv)
    if not train or not heldout:
        raise TrainError(f"the corpus from {root} is empty or has no held-out part ({len(train)} train, "
                         f"{len(heldout)} held out)")
    origin: CorpusOrigin = {"source": "stdlib", "python": platform.python_version(), "modules": len(files)}
    return Corpus(tuple(train), tuple(heldout), origin)


def write_corpus(corpus: Corpus, path: str | os.PathLike) -> Path:
    """The corpus as JSONL: one header line (origin, digest), then one line per conversation."""
    lines = [json.dumps({"ggufmtp_corpus": 1, "origin": corpus.origin, "digest": corpus.digest})]
    for split, convs in (("train", corpus.train), ("heldout", corpus.heldout)):
        lines += [json.dumps({"split": split, "id": c.id, "messages": [list(m) for m in c.messages]},
                             ensure_ascii=False) for c in convs]
    atomic_write_text(Path(path), "\n".join(lines) + "\n")
    return Path(path)


def read_corpus(path: str | os.PathLike) -> Corpus:
    """A corpus :func:`write_corpus` wrote; its digest must still be the recorded one."""
    path = Path(path)
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        head = rows[0]
        if head.get("ggufmtp_corpus") != 1:
            raise ValueError("no ggufmtp_corpus header")
        split: dict[str, list[Conversation]] = {"train": [], "heldout": []}
        for r in rows[1:]:
            split[r["split"]].append(Conversation(r["id"], tuple((m[0], m[1]) for m in r["messages"])))
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise TrainError(f"{path}: not a ggufmtp corpus file ({e})") from None
    corpus = Corpus(tuple(split["train"]), tuple(split["heldout"]), CorpusOrigin(**(head.get("origin") or {})))
    if corpus.digest != head.get("digest"):
        raise TrainError(f"{path}: the conversations' digest is {corpus.digest[:12]}, the file says "
                         f"{str(head.get('digest'))[:12]} (edited or truncated)")
    return corpus
