"""``ggufmtp search``: the whole search of one model, and the public API's ``search_recipe``.

The stages: the model's tensor groups (:func:`~.groups.groups_of`), every candidate's cost
(:func:`~.measure.measure_sensitivity`, cached, on Dask when asked), the allocation under the
budget (:func:`~.allocate.allocate`), the recipe (:func:`~.found.allocation_recipe`), and with
``prove`` the proof against the recipe to beat (``shipped``, else a budget given as a recipe, else
the shipped recipe of the nearest size: :func:`~.prove.prove`). The
recipe TOML (with its ``[search]`` table) is written atomically when ``out`` is given, and kept in
the recipe store by its sha256 (:mod:`ggufmtp.provenance.recipe_store`: ``verify --receipt`` finds it).

A budget (:func:`parse_budget`) is a size (``12MB``, ``11.5MiB``, ``1.2G``, ``123456`` bytes), bits
per weight (``4.5bpw``), both over the groups' tensors, or a recipe (``hifi-q4_k_m-mtp``,
``Q4_K_M``, a file): the bytes its plan gives those tensors on this model, so ``--budget
hifi-q4_k_m-mtp`` searches for a file of that recipe's size.

This module resolves model references (``builtin:NAME``, a path) as the pipeline does: like it,
the search sits above ``ggufmtp._api`` in the layers (it quantizes, measures and verifies), so the
API's edge cannot host it (tests/test_architecture.py REF_RESOLVERS names it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import SearchError
from ..files.fsutil import atomic_write_text
from ..ladder.engine import DaskEngine, check_scheduler
from ..measure.core.suite import as_suite
from ..provenance.recipe_store import store_recipe
from ..quant.plan import make_plan
from ..quant.qtypes import bits_per_weight
from ..quant.recipe import Recipe, shipped_recipes
from ..refs import local_model_arg
from .allocate import Floors, allocate, budget_bytes, group_types, size_text
from .found import allocation_recipe, search_toml
from .groups import DEFAULT_LAYERS_PER_GROUP, candidates, groups_of, imatrix_covers
from .measure import MeasureOptions, measure_sensitivity
from .prove import ProofResult, ProveOptions, prove
from .records import Allocation, Budget, SensitivityTable, TensorGroup
from .report import Point, all_points, card_points, with_front

DEFAULT_TYPES = ("Q8_0", "Q6_K", "Q5_K", "Q4_K", "IQ4_XS", "Q3_K", "Q2_K")
_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6, "MIB": 2**20,
          "G": 10**9, "GB": 10**9, "GIB": 2**30}
# a number (sign, exponent, nan and inf too: refused by name, not planned as a recipe file) and a unit
_SIZE = re.compile(r"^\s*([-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[-+]?[0-9]+)?|[-+]?nan|[-+]?inf(?:inity)?)"
                   r"\s*([A-Za-z]*)\s*$", re.IGNORECASE)
_AMOUNTS = "a size (e.g. 18GB, 18.5GiB, 123456 bytes) or bits per weight (e.g. 4.5bpw)"


def parse_budget(text: str) -> Budget | str:
    """A size or bpw as a :class:`Budget`; anything else is returned as a recipe to plan."""
    if not text.strip():  # not the recipe "" (the current folder, "is a directory")
        raise SearchError(f"budget {text!r}: give {_AMOUNTS}, or a recipe")
    m = _SIZE.match(text)
    if not m:
        return text
    value, unit = float(m.group(1)), m.group(2).upper()
    if unit != "BPW" and unit not in _UNITS:
        raise SearchError(f"budget {text!r}: unknown unit {m.group(2)!r} ({_AMOUNTS}; or a recipe: hifi-q4_k_m-mtp)")
    scaled = value if unit == "BPW" else value * _UNITS[unit]
    if not (math.isfinite(scaled) and (scaled > 0 if unit == "BPW" else scaled >= 1)):  # at least one byte
        raise SearchError(f"budget {text!r}: {_AMOUNTS}, positive and finite")
    return Budget(bpw=value) if unit == "BPW" else Budget(n_bytes=int(scaled))


def recipe_budget(model: Path, groups: tuple[TensorGroup, ...], recipe: str | Recipe,
                  imatrix: str | os.PathLike | None) -> tuple[Budget, tuple[tuple[str, str], ...]]:
    """The bytes ``recipe``'s plan gives the groups' tensors on ``model`` (a libllama dry run), and
    each group's most precise planned type (:attr:`.allocate.Floors.as_shipped`)."""
    plan = make_plan(model, recipe, None if imatrix is None else Path(imatrix))
    if plan.errors:
        raise SearchError(f"budget {plan.recipe}: the recipe does not plan on {model.name}: {plan.errors[0]}")
    names = {t for g in groups for t in g.tensors}
    budget = Budget(n_bytes=sum(t.bytes for t in plan.tensors if t.name in names))
    return budget, group_types(groups, {t.name: t.to_type for t in plan.tensors})


def shipped_head_floors(model: Path, groups: tuple[TensorGroup, ...],
                        imatrix: str | os.PathLike | None) -> tuple[tuple[str, str], ...]:
    """Each head group's loosest type among the shipped recipes (``recipes/*.toml``), each recipe's
    type for the group being its most precise planned one (:func:`.allocate.group_types`) as
    llama.cpp's dry run plans it on ``model``: :attr:`.allocate.Floors.shipped_heads`. A recipe's
    plan errors (iq2_xxs-mtp without an imatrix) do not matter: only its types are read."""
    heads = tuple(g for g in groups if g.role.is_head)
    loosest: dict[str, str] = {}
    for name in shipped_recipes() if heads else ():
        plan = make_plan(model, name, None if imatrix is None else Path(imatrix))
        for group, qtype in group_types(heads, {t.name: t.to_type for t in plan.tensors}):
            if group not in loosest or bits_per_weight(qtype) < bits_per_weight(loosest[group]):
                loosest[group] = qtype
    return tuple((g.name, loosest[g.name]) for g in heads if g.name in loosest)


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """What ``search_recipe`` measures and how it allocates. ``types``: the candidate types;
    ``measure``: the measuring side's options (corpus, chunks, baseline, imatrix, acceptance);
    ``floors``: what the allocation keeps; ``prove``: quantize and measure the result against the
    recipe to beat (``shipped``, else a budget given as a recipe, else the shipped recipe of the nearest size), with ``prove_head`` its
    head against the shipped file's in one interleaved verify run (``measure.verify``'s settings); ``workers``/``scheduler``:
    measure on a local Dask cluster of that many processes, or on a running one; ``name``: the
    recipe's name."""

    types: tuple[str, ...] = DEFAULT_TYPES
    measure: MeasureOptions = dataclasses.field(default_factory=MeasureOptions)
    floors: Floors = Floors()
    layers_per_group: int = DEFAULT_LAYERS_PER_GROUP
    prove: bool = False
    prove_head: bool = True  # with prove: the found head against the shipped one, one interleaved verify
    shipped: str | None = None
    workers: int | None = None
    scheduler: str | None = None
    name: str = "searched-mtp"

    def __post_init__(self) -> None:
        object.__setattr__(self, "types", tuple(self.types))
        if not self.types:
            raise SearchError("search: no candidate types")
        if self.workers is not None and self.workers < 1:
            raise SearchError(f"search: workers must be at least 1, not {self.workers}")
        check_scheduler(self.scheduler, SearchError)

    def prove_options(self) -> ProveOptions:
        m = self.measure
        o = ProveOptions(imatrix=None if m.imatrix is None else Path(m.imatrix), eval=m.eval, acceptance=self.prove_head,
                         margin=self.floors.acceptance_margin, workdir=m.work_dir)
        return o if m.verify is None else dataclasses.replace(o, verify=m.verify)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """What a search found: the table it measured, the allocation, the recipe (and its TOML), the proof."""

    table: SensitivityTable
    allocation: Allocation
    recipe: Recipe
    toml: str
    out: Path | None = None
    proof: ProofResult | None = None

    def points(self) -> list[Point]:
        """Everything measured and predicted, by size, the Pareto front marked (:mod:`.report`)."""
        return with_front(all_points(self.table, self.allocation, self.proof))

    def to_dict(self) -> dict[str, object]:
        a = self.allocation
        return {"recipe": self.recipe.name, "out": str(self.out) if self.out else None,
                "allocation": {"types": dict(a.types), "n_bytes": a.n_bytes, "bpw": a.bpw, "budget_bytes": a.budget_bytes,
                               "predicted_kld": a.predicted_kld, "predicted_acceptance_diff": a.predicted_acceptance_diff,
                               "method": a.method, "excluded": [list(e) for e in a.excluded]},
                "baseline": {"recipe": self.table.baseline_recipe, "kld": self.table.baseline_kld},
                "proof": self.proof.to_dict() if self.proof else None,
                "pareto": [p.to_dict() for p in self.points()]}


@contextlib.contextmanager
def _client(options: SearchOptions) -> Iterator[Any]:
    """A Dask client for the measurements (None: in sequence here)."""
    if not (options.workers or options.scheduler):
        yield None
        return
    client = DaskEngine(options.workers or 1, 0, options.scheduler)._client()
    try:
        yield client
    finally:
        cluster = getattr(client, "cluster", None)
        client.close()
        if cluster is not None and not options.scheduler:
            cluster.close()


def refuse_before_measuring(model: Path, groups: tuple[TensorGroup, ...], budget: Budget, o: SearchOptions) -> None:
    """SearchError, before hours of measuring, for a budget below every group at its smallest candidate
    (the floors can only raise that) or a group with no candidate among ``o.types``; SuiteError for a
    suite the acceptance measurements would read (as verify refuses it at once)."""
    if o.measure.verify is not None and (o.measure.acceptance or (o.prove and o.prove_head)):
        as_suite(o.measure.verify.suite)
    unknown = sorted(set(o.measure.acceptance_groups) - {g.name for g in groups})
    if unknown:
        raise SearchError(f"{model.name}: no group named {', '.join(unknown)} for --acceptance-group "
                          f"(its groups: {', '.join(g.name for g in groups)})")
    cands = candidates(model, groups, o.types, imatrix=imatrix_covers(o.measure.imatrix))
    smallest = {g.name: min((c.n_bytes for c in cands if c.group == g.name), default=None) for g in groups}
    missing = sorted(name for name, b in smallest.items() if b is None)
    if missing:
        raise SearchError(f"{model.name}: no candidate type for {', '.join(missing)} among {', '.join(o.types)} "
                          "(a type's block size must divide the rows; the IQ types need --imatrix with statistics for the group's tensors)")
    n_params = sum(g.n_params for g in groups)
    limit, least = budget_bytes(budget, n_params), sum(b for b in smallest.values() if b is not None)
    if least > limit:
        raise SearchError(f"budget {size_text(limit, n_params)} is below the smallest feasible allocation, "
                          f"{size_text(least, n_params)}: every group at its smallest candidate among {', '.join(o.types)}")


def search_recipe(model: str | os.PathLike, budget: str | Budget, options: SearchOptions | None = None, *,
                  out: str | os.PathLike | None = None, log: Callable[[str], None] = lambda m: None) -> SearchResult:
    """Search ``model`` (a path or ``builtin:NAME``: the BF16 source) for the recipe of least KLD
    within ``budget`` (see the module doc); write it to ``out`` when given. SearchError for an
    impossible budget (naming the smallest feasible size), RecipeError for a bad type or recipe."""
    o = options or SearchOptions()
    parsed = parse_budget(budget) if isinstance(budget, str) else budget  # the text first: before the model is read
    src = Path(local_model_arg(model))
    groups = groups_of(src, o.layers_per_group)
    # the recipe to beat (--against, else a budget given as a recipe): the proof's other arm, and its
    # own types are admitted where the head's floors would refuse them unmeasured
    beat = o.shipped or (parsed if isinstance(parsed, str) else None)
    planned = {r: recipe_budget(src, groups, r, o.measure.imatrix) for r in {beat, parsed} if isinstance(r, str)}
    limit = parsed if isinstance(parsed, Budget) else planned[parsed][0]
    floors = o.floors if beat is None else dataclasses.replace(o.floors, as_shipped=planned[beat][1])
    if not o.measure.acceptance:  # unmeasured, the head keeps what every shipped recipe keeps
        floors = dataclasses.replace(floors, shipped_heads=shipped_head_floors(src, groups, o.measure.imatrix))
    refuse_before_measuring(src, groups, limit, o)
    with _client(o) as client:
        table = measure_sensitivity(src, groups, o.types, o.measure, client=client, log=log)
    allocation = allocate(table, limit, floors)
    recipe = allocation_recipe(table, allocation, Recipe.load(o.measure.baseline), o.name,
                               measured_with_imatrix=o.measure.imatrix is not None)
    log(f"allocated: {allocation.n_bytes} bytes ({allocation.bpw:.3f} bpw), predicted KLD {allocation.predicted_kld:.6f}")
    proof = prove(src, recipe, beat, o.prove_options(), log=log) if o.prove else None
    points = card_points(all_points(table, allocation, proof))
    text = search_toml(recipe, table, allocation, proof.toml_table() if proof else None, points)
    if out is not None:
        atomic_write_text(out, text)
        store_recipe(text)  # a receipt of a file quantized with it finds it by its sha256, wherever `out` goes
    return SearchResult(table, allocation, recipe, text, Path(out) if out is not None else None, proof)
