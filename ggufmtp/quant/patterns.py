"""Tensor-name patterns that a backtracking matcher finishes quickly, checked before any matching.

llama.cpp matches ``--tensor-type`` patterns with ``std::regex`` (ECMAScript, backtracking), against
every tensor name, in its dry run and again in the real run; ggufmtp's plan matches them with
Python's ``re`` (backtracking too). Neither can be given a time limit, and a short name is no
protection: ``(.*)*x`` never ends in the pinned llama-quantize on a 5-block test model, and
``(\\w+)+$``-like patterns are exponential in the name's length. So a pattern is refused, with the
reason, unless its shape bounds the work (decided on Python's parse of it, which reads the
ECMAScript subset these patterns use the same way):

- no repeated item (``*``, ``+``, ``{m,n}`` with n > 1) contains another repeat or an alternation
  (nested quantifiers, ``(a|ab)*``: exponential), or can match nothing (``()*``, ``(\\b)*``:
  endless in std::regex);
- at most :data:`MAX_REPEATS` repeated items in all: an unanchored search then costs at most about
  ``len(name) ** (MAX_REPEATS + 1)`` steps, and ggml names are at most 64 bytes (measured with
  Python's ``re`` on 50-character names that do not match: three ``.*`` take 0.3 ms a name, four
  4 ms, so a 1500-tensor model would spend about 0.5 s or 6 s a pass; llama-quantize's dry run of
  the tiny model with five took 0.14 s, and ggufmtp's plan of it over 20 s before #51).

Alternations outside repeats, character classes, anchors and bounded repeats of single characters
(``\\d+``, ``[0-9]{1,2}``) are what recipe and ``--tensor-type`` patterns are made of, and are all allowed.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["MAX_REPEATS", "pattern_problem"]

MAX_REPEATS = 3

_sre: Any = importlib.import_module("re._parser")  # Python's own regex parser (sre_parse is deprecated)
_REPEATS = frozenset(getattr(_sre, n) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(_sre, n))


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-patterns of one parsed item (a group's body, an alternation's branches ...)."""
    if op in _REPEATS:
        return [av[2]]
    if op == _sre.SUBPATTERN:
        return [av[3]]
    if op == _sre.BRANCH:
        return list(av[1])
    if op in (_sre.ASSERT, _sre.ASSERT_NOT):
        return [av[1]]
    if op == _sre.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]
    if op == getattr(_sre, "ATOMIC_GROUP", None):
        return [av]
    return []


def _walk(sub: Any, in_loop: bool, repeats: list[int]) -> str | None:
    for op, av in sub:
        looped = op in _REPEATS and av[1] > 1
        if looped:
            if in_loop:
                return "a repeat inside a repeat (nested quantifiers take exponential time)"
            if av[2].getwidth()[0] == 0:
                return "a repeat of something that can match nothing (never ends in llama.cpp's std::regex)"
            repeats[0] += 1
        if op == _sre.BRANCH and in_loop:
            return "an alternation inside a repeat (exponential time when the branches overlap)"
        for child in _children(op, av):
            problem = _walk(child, in_loop or looped, repeats)
            if problem:
                return problem
    return None


def pattern_problem(pattern: str) -> str | None:
    """Why matching ``pattern`` against tensor names could take unbounded time, or None when its
    shape bounds it (see the module doc). ``re.error`` for a pattern that is not a regex."""
    parsed = _sre.parse(pattern)
    repeats = [0]
    problem = _walk(parsed, False, repeats)
    if problem is None and repeats[0] > MAX_REPEATS:
        problem = (f"{repeats[0]} repeated items (at most {MAX_REPEATS}: each one multiplies the time a "
                   f"backtracking match can take)")
    return problem

