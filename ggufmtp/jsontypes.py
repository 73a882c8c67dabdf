"""The one name for a JSON document at the package's edge (issue #32).

``JsonObject`` is a JSON object as it is read or written: the return of a ``to_dict()`` /
``to_receipt()``, the argument of a ``from_dict()``, what ``json.load`` gives, a receipt's
statement as parsed from disk, a schema, a ``--json`` output. Inside the package, values cross
function and module boundaries as typed records (dataclasses, ``NamedTuple``, ``TypedDict`` where
a JSON shape must stay, enums), never as this alias: ``tools/count_any_dicts.py`` counts it with
``dict[str, Any]`` wherever it is not at the edge.
"""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = ["JsonObject"]

JsonObject: TypeAlias = dict[str, Any]
