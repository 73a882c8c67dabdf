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
import shlex
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


# Any other absolute path ("/srv2/x/tmpl.jinja"): local when its top folder exists on this machine
# and it goes deeper (a server's endpoints, /v1/chat/completions, do not; "/usr" alone is a word).
_ANY_ABS_RE = re.compile(r"(?:(?<=^)|(?<=[\s'\"=:(\[,]))/[^\s'\",;)\]/]+(?:/[^\s'\",;)\]]*)?")


def _is_local(path: str) -> bool:
    top = path.split("/")[1]
    try:
        return path.rstrip("/").count("/") > 1 and os.path.isdir("/" + top)
    except (OSError, ValueError):  # a name too long or with a NUL: not a path here
        return False


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


def _keys(obj: Any) -> Iterator[tuple[str, str]]:
    """(JSON pointer, key) of every object key in parsed JSON, without recursion."""
    stack = [(obj, "")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            yield from ((f"{at}/{k}", k) for k in node if isinstance(k, str))
            stack.extend((v, f"{at}/{k}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(node))


def _holds_path(text: str, machine: tuple[str, ...]) -> bool:
    return bool(_PATH_RE.search(text) or any(f + "/" in text or text == f for f in machine)
                or any(_is_local(m.group(0)) for m in _ANY_ABS_RE.finditer(text)))


def local_paths(obj: Any) -> list[tuple[str, str]]:
    """(JSON pointer, string) of every string in ``obj``, object keys included, that holds an
    absolute local path."""
    machine = _machine_folders()
    strings = [(at, v) for at, v in _leaves(obj) if isinstance(v, str)] + list(_keys(obj))
    return sorted((at, v) for at, v in strings if _holds_path(v, machine))


def _scrub(text: str, machine: tuple[str, ...]) -> str:
    for f in machine:
        text = re.sub(re.escape(f) + r"/[^\s'\",;)\]]*", lambda m: Path(m.group(0)).name, text)
        if text == f:
            return Path(f).name
    text = _PATH_RE.sub(lambda m: Path(m.group(0).rstrip("/\\")).name or m.group(0), text)
    return _ANY_ABS_RE.sub(lambda m: Path(m.group(0)).name if _is_local(m.group(0)) else m.group(0), text)


# llama.cpp flags whose value is a file: a recorded command line names it by its name alone (a
# RELATIVE path, `tune out/m.gguf`, passes the absolute-path redaction: the files lie beside the artifact)
_FILE_FLAGS = frozenset({"-m", "--model", "-md", "--model-draft", "--spec-draft-model", "--imatrix",
                         "--chat-template-file", "--tensor-type-file"})


def command_file_names(text: str) -> str:
    """``text``, when it is a llama.cpp command line (``llama-server ...``, after any ``VAR=value``),
    with the value of each file flag (:data:`_FILE_FLAGS`) as the file's name; any other text as is."""
    if "llama-" not in text or "\n" in text:
        return text
    try:
        args = shlex.split(text)
    except ValueError:
        return text
    program = next((a for a in args if "=" not in a), "")
    if not Path(program).name.startswith("llama-"):
        return text
    named = [Path(a).name if i and args[i - 1] in _FILE_FLAGS and Path(a).name else a for i, a in enumerate(args)]
    return text if named == args else shlex.join(named)


def redact_local_paths(obj: Any) -> Any:
    """``obj`` with every absolute local path in its strings and object keys replaced by the file's
    name, and every file a recorded command line names by its name (:func:`command_file_names`):
    the JSON edge of every receipt write (notes and messages may quote a path, a receipt never
    does; a key may name a file)."""
    machine = _machine_folders()

    def redact(node: Any) -> Any:
        if isinstance(node, dict):
            return {(_scrub(k, machine) if isinstance(k, str) else k): redact(v) for k, v in node.items()}
        if isinstance(node, list):
            return [redact(v) for v in node]
        return _scrub(command_file_names(node), machine) if isinstance(node, str) else node

    return redact(obj)


def non_finite_numbers(obj: Any) -> list[tuple[str, float]]:
    """(JSON pointer, value) of every NaN or infinity: Python writes them, strict JSON readers refuse them."""
    return sorted(((at, v) for at, v in _leaves(obj) if isinstance(v, float) and not math.isfinite(v)),
                  key=lambda t: t[0])
