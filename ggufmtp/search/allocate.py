"""Allocate one type per tensor group under a size budget, from measured costs (issue #43).

The costs come from a :class:`~ggufmtp.search.records.SensitivityTable`: each was measured with one
group at the candidate type and every other tensor at the baseline. The allocator therefore
*predicts* the whole file's KLD as ``baseline_kld + sum(kld(group, type) - baseline_kld)`` over the
groups: additive deltas, which ignores interactions between groups. That is a prediction, never a
result: :mod:`.prove` quantizes the found recipe and measures the real thing.

How: an exact multiple-choice knapsack by a Pareto-frontier dynamic program. Groups are taken one
at a time and the partial allocations kept are exactly the non-dominated (bytes, predicted KLD)
pairs that can still fit the budget (the smallest candidate of each remaining group is reserved).
With tens of groups and a handful of types the frontier stays small (thousands of points) and the
answer is the optimum of the additive model, which a greedy on marginal KLD per byte is not when
costs are not convex in bytes (measured KLDs are noisy, so they often are not). Should the frontier
pass :data:`MAX_FRONTIER` points it is thinned to the best point per byte bucket and the method says
``pareto-dp (thinned)``: within one bucket of the optimum.

Floors (:class:`Floors`), applied before allocating, each exclusion kept with its reason:

- the MTP head's groups must keep the head's acceptance non-inferior to the reference: a head
  candidate whose measured paired acceptance difference has a CI lower bound below
  ``-acceptance_margin`` is excluded; an *unmeasured* head candidate is allowed only at or above
  ``head_floor_type`` in bits per weight (Q4_K, the recipes' ``[mtp] floor``: the learned-head study
  in ``benchmarks/README.md`` found heads down to Q4_K draft as well as BF16's; below it, only a
  measurement may admit a type), raised per head group to ``shipped_heads``: the loosest type any
  shipped recipe gives that group (:func:`~.run.shipped_head_floors`, from their plans on the model:
  ``nextn.eh_proj`` Q8_0 in every one), so an unmeasured head is never looser than every shipped
  recipe's (the KLD does not see the head: without a floor the knapsack took its cheapest type);
- the tensors the head reads but does not own (``output`` and ``token_embd`` where the head falls
  back to them, :attr:`~.records.TensorGroup.head_reads`) likewise, with ``head_reads_floor_type``
  (Q8_0) for an unmeasured candidate: on the trained tiny model an IQ2-budget search that put
  ``output`` at Q5_0 drafted 17.5 points below ``iq2_xxs-mtp`` (CI -26.3 to -6.7) and 7.0 points
  below it with ``output`` back at Q8_0, eh_proj's type making no difference; the head study never
  measured the output, so below Q8_0 only a measurement may admit a type;
- ``as_shipped``: given the recipe to beat (``--against``, or a budget given as a recipe), a head or
  head-read group may keep, unmeasured, a type at least as precise as every type that recipe gives its
  tensors (:func:`group_types`): the proof judges the head against that recipe's file, so its own
  choices are no risk to admit. On the trained tiny model ``iq2_xxs-mtp`` keeps ``token_embd`` at
  Q4_0; the Q8_0 floor alone made an IQ2-budget search spend those bytes there and take them from
  the trunk;
- ``max_kld``, optional: the predicted KLD of the answer must not exceed it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..errors import SearchError
from ..fmt import human_bytes
from ..quant.qtypes import FTYPE_DEFAULT_TYPE, bits_per_weight
from ..quant.recipe import HEAD_FLOOR_TYPE
from .records import Allocation, Budget, Cost, SensitivityTable, TensorGroup

MAX_FRONTIER = 200_000
DEFAULT_ACCEPTANCE_MARGIN = 0.03  # the verdict's default non-inferiority margin (3 points)
EXACT = "pareto-dp"
THINNED = "pareto-dp (thinned)"


@dataclasses.dataclass(frozen=True)
class Floors:
    """What an allocation must keep, whatever the budget (see the module doc)."""

    acceptance_margin: float = DEFAULT_ACCEPTANCE_MARGIN
    head_floor_type: str = HEAD_FLOOR_TYPE
    max_kld: float | None = None
    head_reads_floor_type: str = "Q8_0"
    as_shipped: tuple[tuple[str, str], ...] = ()  # (group, type) the recipe to beat gives it: admitted unmeasured
    shipped_heads: tuple[tuple[str, str], ...] = ()  # (head group, the loosest type a shipped recipe gives it)

    def __post_init__(self) -> None:
        if not 0 <= self.acceptance_margin < 1:
            raise SearchError(f"acceptance margin must be in [0, 1), not {self.acceptance_margin}")
        if self.max_kld is not None and self.max_kld < 0:
            raise SearchError(f"max KLD must be >= 0, not {self.max_kld}")


@dataclasses.dataclass(frozen=True)
class _Point:
    n_bytes: int
    delta: float
    choice: tuple[int, ...]  # index into each allocated group's candidates


def n_params_of(table: SensitivityTable) -> int:
    return sum(g.n_params for g in table.groups)


def budget_bytes(budget: Budget, n_params: int) -> int:
    """The budget in bytes over the groups' tensors (a bpw budget times their weights / 8)."""
    if (budget.n_bytes is None) == (budget.bpw is None):
        raise SearchError("a budget is a size in bytes or bits per weight, exactly one of them")
    if budget.n_bytes is not None:
        if budget.n_bytes <= 0:
            raise SearchError(f"budget must be positive, not {budget.n_bytes} bytes")
        return int(budget.n_bytes)
    assert budget.bpw is not None
    if not 0 < budget.bpw <= 32:
        raise SearchError(f"budget must be in (0, 32] bits per weight, not {budget.bpw}")
    return int(budget.bpw * n_params / 8)


def excluded_by_floors(group: TensorGroup, cost: Cost, floors: Floors) -> str | None:
    """Why ``cost``'s candidate may not be allocated (None: it may)."""
    ci = cost.acceptance_ci  # measured: any group (a trunk group named with --acceptance-group too)
    if ci is not None and ci[0] < -floors.acceptance_margin:
        return (f"head acceptance CI [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}] pt reaches below "
                f"-{floors.acceptance_margin * 100:.1f} pt (inferior to the reference)")
    if group.drafts:
        floor = head_floor(group, floors) if group.role.is_head else floors.head_reads_floor_type
        what = "head floor" if group.role.is_head else "floor of a tensor the head reads"
        shipped = dict(floors.as_shipped).get(group.name)
        bits = bits_per_weight(cost.candidate.qtype)
        if ci is None and cost.acceptance_diff is None and bits < bits_per_weight(floor) and (
                shipped is None or bits < bits_per_weight(shipped)):
            also = f" and below {shipped}, the recipe to beat's" if shipped else ""
            return f"head acceptance not measured, and {cost.candidate.qtype} is below the {what} {floor}{also}"
    return None


def head_floor(group: TensorGroup, floors: Floors) -> str:
    """The type an unmeasured candidate of head group ``group`` must reach: ``head_floor_type``, or the
    shipped recipes' loosest for the group where that is more precise."""
    shipped = dict(floors.shipped_heads).get(group.name)
    if shipped is not None and bits_per_weight(shipped) > bits_per_weight(floors.head_floor_type):
        return shipped
    return floors.head_floor_type


def allowed_candidates(table: SensitivityTable, floors: Floors
                       ) -> tuple[list[list[Cost]], tuple[tuple[str, str, str], ...]]:
    """Each group's candidates the floors allow (in the table's group order), and the excluded ones."""
    names = {g.name for g in table.groups}
    stray = sorted({c.candidate.group for c in table.costs} - names)
    if stray:
        raise SearchError(f"sensitivity table: costs for unknown group(s) {', '.join(stray)}")
    allowed: list[list[Cost]] = []
    excluded: list[tuple[str, str, str]] = []
    for g in table.groups:
        costs = [c for c in table.costs if c.candidate.group == g.name]
        if not costs:
            raise SearchError(f"sensitivity table: group {g.name} has no measured candidate")
        keep = []
        for c in costs:
            why = excluded_by_floors(g, c, floors)
            if why is None:
                keep.append(c)
            else:
                excluded.append((g.name, c.candidate.qtype, why))
        if not keep:
            hint = (": an acceptance CI this wide needs more prompts (verify's --limit, seeds) or a wider margin"
                    if g.drafts and any(c.acceptance_ci for c in costs) else "")
            raise SearchError(f"group {g.name}: every candidate is excluded by the floors "
                              f"({'; '.join(f'{t}: {w}' for n, t, w in excluded if n == g.name)}){hint}")
        allowed.append(keep)
    return allowed, tuple(excluded)


def size_text(n_bytes: int, n_params: int) -> str:
    return f"{human_bytes(n_bytes)} ({n_bytes} bytes, {8 * n_bytes / n_params:.3f} bpw)"


def _frontier(allowed: Sequence[Sequence[Cost]], baseline: float, limit: int) -> tuple[list[_Point], bool]:
    """The non-dominated (bytes, sum of KLD deltas) allocations within ``limit`` bytes."""
    reserve = [0] * (len(allowed) + 1)  # the smallest bytes the groups from i on need
    for i in range(len(allowed) - 1, -1, -1):
        reserve[i] = reserve[i + 1] + min(c.candidate.n_bytes for c in allowed[i])
    frontier = [_Point(0, 0.0, ())]
    thinned = False
    for i, costs in enumerate(allowed):
        grown = [_Point(p.n_bytes + c.candidate.n_bytes, p.delta + (c.kld - baseline), p.choice + (j,))
                 for p in frontier for j, c in enumerate(costs)
                 if p.n_bytes + c.candidate.n_bytes + reserve[i + 1] <= limit]
        frontier = _pareto(grown)
        if len(frontier) > MAX_FRONTIER:
            frontier, thinned = _thin(frontier, limit), True
    return frontier, thinned


def _pareto(points: list[_Point]) -> list[_Point]:
    """Points with strictly less KLD than every smaller one (ties go to the smaller file)."""
    out: list[_Point] = []
    for p in sorted(points, key=lambda p: (p.n_bytes, p.delta)):
        if not out or p.delta < out[-1].delta:
            out.append(p)
    return out


def _thin(points: list[_Point], limit: int) -> list[_Point]:
    width = max(1, limit // (MAX_FRONTIER // 2))
    best: dict[int, _Point] = {}
    for p in points:  # sorted by bytes with falling KLD: the last of each bucket is its best
        best[p.n_bytes // width] = p
    return list(best.values())


def allocate(table: SensitivityTable, budget: Budget, floors: Floors = Floors()) -> Allocation:
    """The allocation of least predicted KLD within ``budget`` that keeps ``floors``; SearchError
    naming the smallest feasible size when none fits (see the module doc for the method)."""
    n_params = n_params_of(table)
    if n_params <= 0:
        raise SearchError("sensitivity table: no tensor groups with weights")
    limit = budget_bytes(budget, n_params)
    allowed, excluded = allowed_candidates(table, floors)
    smallest = sum(min(c.candidate.n_bytes for c in costs) for costs in allowed)
    if smallest > limit:
        raise SearchError(f"budget {size_text(limit, n_params)} is below the smallest feasible allocation, "
                          f"{size_text(smallest, n_params)}: every group at its smallest allowed type")
    frontier, thinned = _frontier(allowed, table.baseline_kld, limit)
    best = frontier[-1]
    predicted = table.baseline_kld + best.delta
    if floors.max_kld is not None and predicted > floors.max_kld:
        raise SearchError(f"no allocation within {size_text(limit, n_params)} reaches the max KLD "
                          f"{floors.max_kld:.6f}: the best predicted is {predicted:.6f}")
    chosen = [costs[j] for costs, j in zip(allowed, best.choice)]
    return Allocation(
        types=tuple((c.candidate.group, c.candidate.qtype) for c in chosen), n_bytes=best.n_bytes,
        predicted_kld=predicted, predicted_acceptance_diff=predicted_acceptance(table, chosen),
        n_params=n_params, budget_bytes=limit, method=THINNED if thinned else EXACT, excluded=excluded)


def baseline_type(table: SensitivityTable) -> str:
    """The type the baseline recipe gives a tensor (``Q8_0`` for ``Q8_0``, ``Q4_K`` for ``Q4_K_M``)."""
    name = table.baseline_recipe.upper()
    return FTYPE_DEFAULT_TYPE.get(name, name)


def predicted_acceptance(table: SensitivityTable, chosen: Sequence[Cost]) -> float | None:
    """The head's acceptance difference against the reference, predicted as the KLD is: the
    baseline's (a head group measured at the baseline type *is* the baseline) plus each chosen head
    candidate's delta from it; without a baseline measurement, the worst chosen one. None when no
    chosen candidate was measured."""
    measured = [c.acceptance_diff for c in chosen if c.acceptance_diff is not None]
    if not measured:
        return None
    base = [c.acceptance_diff for c in table.costs
            if c.acceptance_diff is not None and c.candidate.qtype == baseline_type(table)]
    if not base:
        return min(measured)
    a0 = sum(base) / len(base)
    return a0 + sum(a - a0 for a in measured)


def chosen_costs(table: SensitivityTable, allocation: Allocation) -> list[Cost]:
    """The measured cost of each group's allocated type, in the allocation's order."""
    out = []
    for group, qtype in allocation.types:
        cost = table.cost(group, qtype)
        if cost is None:
            raise SearchError(f"allocation: {group} at {qtype} was not measured in this table")
        out.append(cost)
    return out


def group_types(groups: Sequence[TensorGroup], planned: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """Each group's most precise type in ``planned`` (tensor name -> type, a recipe's plan): the type
    at or above which a uniform type gives no tensor of the group less than that plan does."""
    out = []
    for g in groups:
        types = [planned[t] for t in g.tensors if t in planned]
        if types:
            out.append((g.name, max(types, key=bits_per_weight)))
    return tuple(out)
