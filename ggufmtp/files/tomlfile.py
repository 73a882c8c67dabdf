"""TOML of bounded nesting: the one parser of the TOML files ggufmtp is handed (recipes, ladder
files, a searched recipe's ``[search]`` table).

``tomllib`` parses nested arrays and inline tables by recursion, so ``a = [[[[...]]]]`` a few
hundred deep ends in a RecursionError; dotted keys nest tables without recursing but as deep as the
line is long. No ggufmtp file needs more than a handful of levels: anything deeper than
:data:`MAX_TOML_DEPTH` is refused as malformed, with the reason.
"""

from __future__ import annotations

import tomllib

from ..errors import TomlError

__all__ = ["MAX_TOML_DEPTH", "loads_toml"]

MAX_TOML_DEPTH = 16


def loads_toml(data: bytes) -> dict[str, object]:
    """The document in ``data``; TomlError saying why it is not one."""
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TomlError(f"not UTF-8 ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise TomlError(str(e)) from None
    except RecursionError:
        raise TomlError(f"nested deeper than {MAX_TOML_DEPTH} levels") from None
    if _depth(doc) > MAX_TOML_DEPTH:
        raise TomlError(f"nested deeper than {MAX_TOML_DEPTH} levels")
    return doc


def _depth(doc: object) -> int:
    """How many tables and arrays deep ``doc`` goes (iteratively: no recursion to exhaust)."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level + 1)
        if deepest > MAX_TOML_DEPTH:
            return deepest
        stack.extend((c, level + 1) for c in children)
    return deepest
