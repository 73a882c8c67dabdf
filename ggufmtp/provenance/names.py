"""What a receipt may hold: plain file names, never local paths; finite numbers only.

A receipt is published: a path is neither portable (another machine has other folders) nor
private (``/home/<name>/...``). The writer turns every absolute local path in a statement's
strings into the file's name (:func:`redact_local_paths`: notes and messages may quote one); the
reader refuses a statement that still holds one (:func:`local_paths`).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def plain_file_name(name: str) -> bool:
    """A file name beside the receipt's artifact: no folder, no parent, no control character."""
    return (bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")
            and not any(ord(c) < 32 or ord(c) == 127 for c in name))


# Absolute local paths: under the usual roots of Unix and macOS machines, a home folder (~/), a
# Windows drive, or this machine's home, temp and working folders. Endpoints (/v1/...) are not.
_ROOTS = ("home", "root", "tmp", "Users", "var", "mnt", "opt", "srv", "data", "work", "workspace", "private",
          "media", "scratch", "run", "dev", "usr", "etc", "nix", "content", "kaggle", "lustre", "gpfs", "cache")
_PATH_RE = re.compile(r"(?:(?<=^)|(?<=[\s'\"=:(\[,]))(?:/(?:" + "|".join(_ROOTS) + r")(?=/)|~/|[A-Za-z]:[\\/])[^\s'\",;)\]]*")


def _machine_folders() -> tuple[str, ...]:
    folders = {str(Path.home()), tempfile.gettempdir(), os.getcwd()}
    return tuple(sorted((f for f in folders if f not in ("", "/")), key=len, reverse=True))


def _leaves(obj: Any) -> Iterator[tuple[str, Any]]:
    """(JSON pointer, value) of every leaf of parsed JSON, without recursion."""
    stack = [(obj, "")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, f"{at}/{k}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(node))
        else:
            yield at or "/", node


def local_paths(obj: Any) -> list[tuple[str, str]]:
    """(JSON pointer, string) of every string in ``obj`` that holds an absolute local path."""
    machine = _machine_folders()
    return sorted((at, v) for at, v in _leaves(obj) if isinstance(v, str)
                  and (_PATH_RE.search(v) or any(f + "/" in v or v == f for f in machine)))


def redact_local_paths(obj: Any) -> Any:
    """``obj`` with every absolute local path in its strings replaced by the file's name (the JSON
    edge of every receipt write: notes and messages may quote a path, a receipt never does)."""
    machine = _machine_folders()

    def scrub(text: str) -> str:
        for f in machine:
            text = re.sub(re.escape(f) + r"/[^\s'\",;)\]]*", lambda m: Path(m.group(0)).name, text)
            if text == f:
                return Path(f).name
        return _PATH_RE.sub(lambda m: Path(m.group(0).rstrip("/\\")).name or m.group(0), text)

    if isinstance(obj, dict):
        return {k: redact_local_paths(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_local_paths(v) for v in obj]
    return scrub(obj) if isinstance(obj, str) else obj


def non_finite_numbers(obj: Any) -> list[tuple[str, float]]:
    """(JSON pointer, value) of every NaN or infinity: Python writes them, strict JSON readers refuse them."""
    return sorted(((at, v) for at, v in _leaves(obj) if isinstance(v, float) and not math.isfinite(v)),
                  key=lambda t: t[0])
