"""Prompt suites for ``ggufmtp verify``: versioned JSONL files of chat prompts.

One JSON object per line::

    {"id": "code-01", "category": "code", "messages": [{"role": "user", "content": "..."}]}
    {"id": "misc-07", "category": "general", "prompt": "Plain text prompt"}

- ``id``: non-empty string, unique within the file.
- ``category``: non-empty string (the shipped suite uses ``code``, ``math``, ``general``).
- exactly one of ``messages`` (a non-empty list of ``{"role": "system"|"user"|"assistant",
  "content": str}`` ending with a ``user`` message) or ``prompt`` (a non-empty string; sent as one
  user message to ``/v1/chat/completions``).

Blank lines are skipped. Any other problem raises :class:`SuiteError` naming ``file:line``.

The shipped suite is ``chat-v1`` (``ggufmtp/data/suites/chat-v1.jsonl``): 54 prompts, 18 each of
code, math and general, interleaved by category so that the first N prompts (``--limit N``) stay
balanced. A suite's identity is its name plus the sha256 of the file's bytes: any edit gives a new
digest, which receipts record. Ship changes as a new file (``chat-v2``), never edit ``chat-v1``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import SuiteError
from ...gguf.model import template_supports_thinking

SUITES_DIR = Path(__file__).resolve().parents[2] / "data" / "suites"
DEFAULT_SUITE = "chat-v1"
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: tuple[dict[str, str], ...]
    prompt: str | None = None  # set when the line used "prompt" instead of "messages"

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages sent to ``/v1/chat/completions``."""
        return [dict(m) for m in self.messages]

    def raw_text(self) -> str:
        """The text sent to ``/completion`` (no chat template): the ``prompt`` as given, or the
        contents of the messages joined by blank lines."""
        if self.prompt is not None:
            return self.prompt
        return "\n\n".join(m["content"] for m in self.messages)


@dataclass(frozen=True)
class Suite:
    name: str
    version: str | None
    sha256: str
    path: str
    prompts: tuple[Prompt, ...] = field(default_factory=tuple)

    @property
    def categories(self) -> list[str]:
        """Categories in order of first appearance."""
        seen: dict[str, None] = {}
        for p in self.prompts:
            seen.setdefault(p.category, None)
        return list(seen)

    def limit(self, n: int | None) -> Suite:
        """The first ``n`` prompts (same name and digest: the digest names the file the prompts came from)."""
        if n is None or n >= len(self.prompts):
            return self
        if n < 1:
            raise SuiteError(f"limit {n}: must be at least 1")
        return Suite(self.name, self.version, self.sha256, self.path, self.prompts[:n])

    def info(self) -> SuiteInfo:
        """What a result records of the suite: its name, digest and prompt counts."""
        return SuiteInfo(self.name, self.version, self.sha256, self.path, len(self.prompts),
                         dict(Counter(p.category for p in self.prompts)))

    def to_dict(self) -> dict[str, Any]:
        return self.info().to_dict()


@dataclass(frozen=True)
class SuiteInfo:
    """The suite a measurement ran (the ``suite`` section of verify's JSON)."""

    name: str
    version: str | None
    sha256: str
    path: str
    n_prompts: int
    categories: dict[str, int]  # prompts per category, in order of first appearance

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def shipped_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.jsonl"))


def resolve_suite_path(path_or_name: str | os.PathLike) -> Path:
    p = Path(path_or_name).expanduser()
    if p.is_file():
        return p
    name = str(path_or_name)
    if "/" not in name and not name.endswith(".jsonl"):
        cand = SUITES_DIR / f"{name}.jsonl"
        if cand.is_file():
            return cand
        raise SuiteError(f"suite {name!r}: not a file and not a shipped suite (shipped: {', '.join(shipped_suites())})")
    raise SuiteError(f"suite {p}: no such file")


def _fail(path: Path, lineno: int, msg: str) -> SuiteError:
    return SuiteError(f"{path}:{lineno}: {msg}")


def _parse_line(path: Path, lineno: int, line: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise _fail(path, lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise _fail(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    pid = obj.get("id")
    if not isinstance(pid, str) or not pid.strip():
        raise _fail(path, lineno, 'missing or empty "id" (a string)')
    cat = obj.get("category")
    if not isinstance(cat, str) or not cat.strip():
        raise _fail(path, lineno, f'prompt {pid!r}: missing or empty "category" (a string)')
    has_m, has_p = "messages" in obj, "prompt" in obj
    if has_m == has_p:
        raise _fail(path, lineno, f'prompt {pid!r}: needs exactly one of "messages" or "prompt"')
    if has_p:
        text = obj["prompt"]
        if not isinstance(text, str) or not text.strip():
            raise _fail(path, lineno, f'prompt {pid!r}: "prompt" must be a non-empty string')
        return Prompt(pid, cat, ({"role": "user", "content": text},), prompt=text)
    msgs = obj["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise _fail(path, lineno, f'prompt {pid!r}: "messages" must be a non-empty list')
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise _fail(path, lineno, f'prompt {pid!r}: messages[{i}] must be {{"role": one of {"/".join(ROLES)}, '
                                      f'"content": a string}}')
        out.append({"role": m["role"], "content": m["content"]})
    if out[-1]["role"] != "user" or not out[-1]["content"].strip():
        raise _fail(path, lineno, f'prompt {pid!r}: the last message must be a non-empty "user" message')
    return Prompt(pid, cat, tuple(out))


def load_suite(path_or_name: str | os.PathLike = DEFAULT_SUITE) -> Suite:
    """Load and validate a suite: a shipped name (``chat-v1``) or a JSONL file path."""
    path = resolve_suite_path(path_or_name)
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = data[: e.start].count(b"\n") + 1
        raise _fail(path, lineno, "not UTF-8 text") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        p = _parse_line(path, lineno, line)
        if p.id in seen:
            raise _fail(path, lineno, f"duplicate id {p.id!r} (first on line {seen[p.id]})")
        seen[p.id] = lineno
        prompts.append(p)
    if not prompts:
        raise SuiteError(f"{path}: no prompts")
    stem = path.stem
    m = re.search(r"-v(\d+)$", stem)
    return Suite(name=stem, version=m.group(1) if m else None, sha256=sha, path=str(path), prompts=tuple(prompts))


def as_suite(suite: str | os.PathLike | Suite) -> Suite:
    """``suite`` itself, or the suite a name or path names (:func:`load_suite`: SuiteError for a bad one)."""
    return suite if isinstance(suite, Suite) else load_suite(suite)


# --- thinking modes ----------------------------------------------------------------------------

def modes_for_template(chat_template: str | None) -> list[str]:
    """``["thinking", "no-thinking"]`` when the template has a thinking switch, else ``["default"]``.
    The two modes are always reported separately, never averaged."""
    return ["thinking", "no-thinking"] if template_supports_thinking(chat_template) else ["default"]


def mode_request_fields(mode: str) -> dict[str, Any]:
    if mode == "thinking":
        return {"chat_template_kwargs": {"enable_thinking": True}}
    if mode == "no-thinking":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    return {}
