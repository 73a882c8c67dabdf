"""The search keeps the shipped recipes' head types unless ``--acceptance`` measured the head (#51 item 4).

The KLD llama-perplexity measures never runs the MTP head, so a head group's candidates all cost
the baseline's KLD and the knapsack, ties going to the smaller file, took the cheapest: every
shipped recipe keeps ``nextn.eh_proj`` at Q8_0, the search put it at Q4_0.
"""

from __future__ import annotations

from pathlib import Path

from ggufmtp.quant.qtypes import bits_per_weight
from ggufmtp.quant.recipe import shipped_recipes
from ggufmtp.refs import local_model_arg
from ggufmtp.search.allocate import Floors, allocate
from ggufmtp.search.records import Budget, Candidate, Cost, GroupRole, SensitivityTable, TensorGroup

BASE = 0.01
EH = TensorGroup("mtp.eh_proj", GroupRole.MTP_EH_PROJ, r"blk\.{mtp}\.nextn\.eh_proj", ("blk.4.nextn.eh_proj.weight",), 4096)


def _cost(qtype: str, n_bytes: int, acc: tuple[float, float, float] | None = None) -> Cost:
    return Cost(Candidate(EH.name, qtype, n_bytes), BASE, (BASE, BASE), (BASE,) * 4,
                acceptance_diff=acc[0] if acc else None, acceptance_ci=(acc[1], acc[2]) if acc else None)


def test_a_shipped_head_floor_refuses_an_unmeasured_type_and_a_measured_one_passes():
    """Same KLD for every type (the head is invisible to it): unmeasured, eh_proj keeps the shipped
    Q8_0; a Q4_0 whose acceptance was measured non-inferior is admitted (--acceptance decides)."""
    unmeasured = SensitivityTable("ab" * 32, "builtin:eval-v1", "Q8_0", BASE, (BASE,) * 4, (EH,),
                                  (_cost("Q8_0", 4352), _cost("Q4_0", 2304)))
    floors = Floors(shipped_heads=(("mtp.eh_proj", "Q8_0"),))
    assert dict(allocate(unmeasured, Budget(n_bytes=10_000)).types)["mtp.eh_proj"] == "Q4_0"  # Q4_K's bpw: no floor
    a = allocate(unmeasured, Budget(n_bytes=10_000), floors)
    assert dict(a.types)["mtp.eh_proj"] == "Q8_0"
    assert ("mtp.eh_proj", "Q4_0", "head acceptance not measured, and Q4_0 is below the head floor Q8_0") in a.excluded
    measured = SensitivityTable("ab" * 32, "builtin:eval-v1", "Q8_0", BASE, (BASE,) * 4, (EH,),
                                (_cost("Q8_0", 4352, (0.0, -0.01, 0.01)), _cost("Q4_0", 2304, (0.0, -0.01, 0.01))))
    assert dict(allocate(measured, Budget(n_bytes=10_000), floors).types)["mtp.eh_proj"] == "Q4_0"


def test_an_unmeasured_search_keeps_every_head_group_at_the_shipped_recipes_loosest(tmp_path, llama_runtime):
    """End to end on the tiny model, no --acceptance, an ample budget: each head group at least as
    precise as the loosest type a shipped recipe plans for it (eh_proj: Q8_0 in all of them), where
    main put the whole head at the cheapest candidate, Q4_0."""
    from ggufmtp.quality.options import EvalOptions
    from ggufmtp.quant.plan import make_plan
    from ggufmtp.search.allocate import group_types
    from ggufmtp.search.groups import groups_of
    from ggufmtp.search.measure import MeasureOptions
    from ggufmtp.search.run import SearchOptions, search_recipe

    model = Path(local_model_arg("builtin:tiny-qwen35moe"))
    measure = MeasureOptions(eval=EvalOptions(chunks=2, ctx_size=128), cache_dir=tmp_path / "cache",
                             work_dir=tmp_path, progress=False)
    res = search_recipe(model, "8.5bpw", SearchOptions(types=("Q8_0", "Q4_0"), measure=measure, layers_per_group=8))
    chosen = dict(res.allocation.types)
    assert chosen["mtp.eh_proj"] == "Q8_0"
    heads = tuple(g for g in groups_of(model, 8) if g.role.is_head)
    assert len(heads) == 4
    loosest = {g.name: min((dict(group_types(heads, {t.name: t.to_type for t in make_plan(model, r).tensors}))[g.name]
                            for r in shipped_recipes()), key=bits_per_weight) for g in heads}
    assert loosest["mtp.eh_proj"] == "Q8_0"
    for g in heads:
        assert bits_per_weight(chosen[g.name]) >= bits_per_weight(loosest[g.name]), (g.name, chosen, loosest)
