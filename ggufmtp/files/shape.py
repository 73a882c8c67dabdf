"""Whether a value read from a file (TOML, JSON) has the type a typed record's field declares: one
reading of the annotations for every reader that turns a file into a record (the ladder file's
tables, ``tune-joint --heads-from``'s rows), so a wrong type is one error naming the key, not a
TypeError later (or a record holding a string where its users compute with a number)."""

from __future__ import annotations

import collections.abc
import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["fits", "json_kind", "record_problem", "wanted"]


def fits(value: Any, hint: Any) -> bool:
    """Whether a parsed value fits the type annotation ``hint`` (bool is not a number here)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin in (list, tuple, collections.abc.Sequence):
        return isinstance(value, list) and all(fits(v, args[0]) for v in value) if args else isinstance(value, list)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return hint in (str, bool) and isinstance(value, hint)


def wanted(hint: Any) -> str:
    """``hint`` in words: ``an integer``, ``an array of integers``, ``an integer or a string``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(wanted(a) for a in args if a is not type(None) and a is not os.PathLike)
    if origin in (list, tuple, collections.abc.Sequence):
        return "an array of " + wanted(args[0]).split(" ", 1)[1] + "s"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(hint, str(hint))


_JSON_NAMES = ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"),
               (list, "an array"), (dict, "an object"), (type(None), "null"))


def json_kind(value: Any) -> str:
    """A parsed JSON value's kind in words (``an array``, ``null``)."""
    return next((name for t, name in _JSON_NAMES if isinstance(value, t)), type(value).__name__)


def record_problem(cls: type, d: Any, nested: tuple[str, ...] = ()) -> str | None:
    """What keeps the JSON value ``d`` from being the dataclass ``cls`` (an object with each field
    that has no default, each of its type; unknown keys pass; the values of the fields in ``nested``,
    records themselves, are the caller's to check), or None where it can be one."""
    if not isinstance(d, Mapping):
        return f"{json_kind(d)}, not an object"
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields if f.name not in d
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        return f"lacks {', '.join(missing)}"
    hints = typing.get_type_hints(cls)
    for f in fields:
        if f.name in d and f.name not in nested and not fits(d[f.name], hints[f.name]):
            return f"{f.name} must be {wanted(hints[f.name])}, not {json_kind(d[f.name])}"
    return None
