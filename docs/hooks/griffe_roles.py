"""A griffe extension for the docs build: the Sphinx roles in ggufmtp's docstrings
(``:class:`X```, ``:func:`~a.b.f```, ``:mod:`.sibling```, ``:meth:`C.m```, ``:data:``, ``:attr:``,
``:exc:``, ``:obj:``) become cross-references on the API page, and reST's ``text::`` before a
literal block reads ``text:`` (the block is Markdown's indented code).

The docstrings keep the roles (they read well in the source and in ``help()``); mkdocstrings renders
Markdown, where a role would show literally. Each role is resolved in the scope of the object whose
docstring holds it (its members, then its module's names and imports, as Python resolves them) to the
canonical path of the object it names, and written as an optional autoref: a link where that object
is on the site, its name in code where it is not (a module or helper the API page does not render),
so the build stays strict. A name that does not resolve is shown in code, as written."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|data|meth|attr|mod|exc|obj):`(?P<text>[^`]+)`")
# reST's "text::" before an indented literal block: Markdown shows the block as code and the "::" as is
LITERAL_MARKER = re.compile(r"(?<=\S):(?=:\n\n[ \t]+\S)")
EXPLICIT_TITLE = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")


def _lookup(collection: griffe.ModulesCollection, path: str) -> str | None:
    """The canonical path of ``path`` (an alias followed to what it names), or None if unknown."""
    try:
        obj = collection.get_member(path)
    except (KeyError, ValueError, IndexError):
        return None
    try:
        return obj.final_target.path if obj.is_alias else obj.path
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return obj.path


def _module(obj: griffe.Object) -> griffe.Module:
    return obj if isinstance(obj, griffe.Module) else obj.module


def resolve(obj: griffe.Object, name: str, collection: griffe.ModulesCollection) -> str | None:
    """The canonical path a role's target names, seen from ``obj``'s docstring; None if unknown."""
    if name.startswith("."):  # relative to the current package (Sphinx: search from here)
        mod = _module(obj)
        package = mod if mod.is_package else mod.parent
        if package is not None and (found := _lookup(collection, package.path + name)):
            return found
        name = name.lstrip(".")
    if (found := _lookup(collection, name)) is not None and "." in name:
        return found
    head, _, rest = name.partition(".")
    try:
        base = obj.resolve(head)
    except griffe.NameResolutionError:
        return _lookup(collection, name)
    return _lookup(collection, f"{base}.{rest}" if rest else base) or (f"{base}.{rest}" if rest else base)


def convert(text: str, obj: griffe.Object, collection: griffe.ModulesCollection) -> str:
    """``text`` with every Sphinx role replaced by an optional autoref (or code, when unresolved)."""
    def one(m: re.Match[str]) -> str:
        target = m["text"].strip()
        if explicit := EXPLICIT_TITLE.match(target):
            title, target = explicit["title"], explicit["target"]
        else:
            target = target.lstrip("!")
            title = target.lstrip("~.").rsplit(".", 1)[-1] if target.startswith("~") else target
        path = resolve(obj, target.lstrip("~!"), collection)
        if path is None:
            return f"`{title}`"
        return f'<code><autoref identifier="{path}" optional>{title}</autoref></code>'

    return LITERAL_MARKER.sub("", ROLE.sub(one, text))


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)  # ty: ignore[invalid-argument-type]


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = convert(obj.docstring.value, obj, loader.modules_collection)
