"""The recipe a receipt names, found by its sha256 (#51 item 4).

A receipt records its recipe by name, file name and sha256 (``predicate.recipe``). A shipped recipe
or a llama-quantize type loads by its name; a recipe ``ggufmtp search`` wrote has a name nothing
resolves (``searched-mtp``) and lives wherever the user put it. So the search also keeps every
recipe it writes in a content-addressed store, ``cache_root()/recipes/<sha256>.toml``
(:func:`store_recipe`), and :func:`receipt_recipe` looks, in order, at the recipe the user names
(``-r``), the recipe of that name, the recorded file beside the receipt, and the store: the first
whose bytes have the recorded sha256 is the one. A file of the receipt's recipe name with other
bytes is refused naming both digests; a recipe of another name given with ``-r`` is the user's
choice of thresholds and is taken as it is.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import RecipeError, VerifyError
from ..files.fsutil import atomic_write_bytes
from ..quant.recipe import Recipe
from ..runtime.build import cache_root
from .receipt import Receipt

__all__ = ["receipt_recipe", "store_recipe", "stored_recipe_path"]


def stored_recipe_path(sha256: str) -> Path:
    """Where the store keeps the recipe of ``sha256`` (it may not be there)."""
    return cache_root() / "recipes" / f"{sha256.lower()}.toml"


def store_recipe(text: str) -> Path:
    """Keep ``text`` (a recipe's TOML, as written) in the store under its sha256; the path."""
    data = text.encode("utf-8")
    path = stored_recipe_path(hashlib.sha256(data).hexdigest())
    if not path.is_file():
        atomic_write_bytes(path, data)
    return path


def _places(rf: Receipt, name: str, file: str | None, sha256: str) -> list[str | Path]:
    """Where the recipe may be, in the order they are tried (see the module doc)."""
    out: list[str | Path] = [name]
    if file:
        out.append(rf.path.parent / Path(file).name)  # beside it: a file name, never a path to follow
    out.append(stored_recipe_path(sha256))
    return list(dict.fromkeys(out))


def _load(place: str | Path) -> Recipe | None:
    """The recipe at ``place`` (a name or a file), None where there is none."""
    if isinstance(place, Path) and not place.is_file():
        return None
    try:
        return Recipe.load(place)
    except RecipeError:
        return None


def receipt_recipe(rf: Receipt, given: str | None = None) -> Recipe:
    """The recipe the receipt ``rf`` was made with (see the module doc); ``given``: the user's ``-r``.
    VerifyError naming both digests for a file of the recipe's name with other bytes, or naming the
    places looked at when none has the recorded bytes."""
    named = rf.predicate["recipe"]
    name, want = named["name"], (named.get("sha256") or "").lower()
    if given:
        rec = Recipe.load(given)
        if want and rec.sha256 and rec.name == name and rec.sha256 != want:
            raise VerifyError(f"{rf.path}: its recipe {name!r} had sha256 {want}; {rec.path} has sha256 {rec.sha256}: "
                              "another recipe of that name (give the file with those bytes)")
        return rec
    if not want:  # a llama-quantize type: nothing to bind, the name is the recipe
        return _named(rf, name)
    places = _places(rf, name, named.get("file"), want)
    other: Recipe | None = None
    for place in places:
        found = _load(place)
        if found is not None and found.sha256 == want:
            return found
        other = other or found
    if other is not None:
        raise VerifyError(f"{rf.path}: its recipe {name!r} had sha256 {want}; the one found now ({other.path or name}) "
                          f"has {other.sha256}: give the recipe with those bytes, or the one to judge with (-r)")
    raise VerifyError(f"{rf.path}: its recipe {name!r} (sha256 {want}) is neither a shipped recipe nor at "
                      f"{', '.join(str(p) for p in places[1:])}: give the recipe file with -r")


def _named(rf: Receipt, name: str) -> Recipe:
    try:
        return Recipe.load(name)
    except RecipeError as e:
        raise VerifyError(f"{rf.path}: its recipe {name!r} cannot be loaded to judge the verification ({e}); "
                          "name the recipe with -r") from None
