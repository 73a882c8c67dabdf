"""Reading a JSON file ggufmtp is handed (a receipt, a signature bundle, a conversion record, a
tune result), safely: a regular file of bounded size, strict JSON (no repeated key, no NaN or
Infinity, which two readers may read differently), bounded nesting; one AuditError naming the file
for anything else, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import AuditError
from ..jsontypes import JsonObject
from .fsutil import read_regular_file

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "json_depth", "one_line", "parse_json_bytes", "read_json_file"]

MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_JSON_DEPTH = 64


def read_json_file(path: str | os.PathLike, what: str = "file") -> Any:
    """Parse the JSON file ``path``; one clear AuditError for a missing, unreadable, oversized,
    malformed or absurdly nested file (never a traceback)."""
    p = Path(path)
    try:
        raw = read_regular_file(p, MAX_JSON_BYTES)
    except FileNotFoundError:
        raise AuditError(f"{p}: no such {what}") from None
    except OSError as e:
        raise AuditError(f"{p}: cannot read the {what} ({e.strerror or type(e).__name__})") from None
    return parse_json_bytes(raw, p, what)


class _Ambiguous(ValueError):
    """JSON that two readers may read differently: a repeated key, NaN or Infinity."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> JsonObject:
    """The JSON parser's object hook: one JSON object, refused when a key repeats."""
    seen: JsonObject = {}
    for k, v in pairs:
        if k in seen:
            raise _Ambiguous(f"the key {k[:80]!r} appears twice in one object (readers disagree on which counts)")
        seen[k] = v
    return seen


def _no_constant(name: str) -> Any:
    raise _Ambiguous(f"{name} is not JSON (strict readers refuse it)")


def parse_json_bytes(raw: bytes, where: str | os.PathLike, what: str = "receipt") -> Any:
    """Parse JSON strictly: a repeated key in an object, or NaN / Infinity, is refused, since
    another reader (another language's, a future version's) could read them otherwise."""
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except _Ambiguous as e:
        raise AuditError(f"{where}: ambiguous JSON {what}: {e}") from None
    except RecursionError:
        raise AuditError(f"{where}: JSON nested too deeply to be a {what}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise AuditError(f"{where}: not a JSON {what} ({one_line(e)})") from None
    if json_depth(data) > MAX_JSON_DEPTH:
        raise AuditError(f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep; not a {what}")
    return data


def json_depth(data: Any) -> int:
    """Nesting depth of parsed JSON, computed without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def one_line(e: BaseException) -> str:
    """An exception's message on one line, at most 300 characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:300] + "..."
