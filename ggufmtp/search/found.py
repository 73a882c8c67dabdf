"""The recipe a search found: an ordinary :class:`~ggufmtp.quant.recipe.Recipe` and its TOML.

:func:`allocation_recipe` turns an allocation into a recipe of the baseline's ftype with one
``[[rules]]`` entry per group (the group's pattern, ``{mtp}`` placeholders kept, its allocated
type). Its ``[mtp]`` table sets no roles and no floor: the head's groups are rules like the others
(a role rule would come first and win over them) and the floors were applied by the allocator.
``plan``, ``quantize``, ``ladder`` and the card take it as any recipe file.

:func:`search_toml` writes it with a ``[search]`` table the recipe loader accepts and ignores: how
it was found (the method, the budget, the model's sha256, the corpus by name, the baseline recipe,
the sensitivity table's digest, the versions) and what was measured of each group's chosen type
(``[[search.groups]]``), and, after :mod:`.prove`, the proof (``[search.proof]``), and the Pareto
table's front with the prediction and the proved files (``[[search.points]]``), which a receipt of a
file quantized with the recipe carries into its card. No local path is written: a corpus given as a
file is named by its file name.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence

from .._version import __version__
from ..constants import LLAMA_CPP_COMMIT
from ..imatrix.check import needs_imatrix
from ..provenance.search_card import SearchPoint
from ..quant.recipe import Recipe, Rule
from .allocate import chosen_costs
from .records import Allocation, SensitivityTable

TomlValue = str | int | float | bool | list[float] | None


def _plain(obj: object) -> object:
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def table_digest(table: SensitivityTable) -> str:
    """sha256 of the table's canonical JSON (every group and cost): the ``[search]`` table names it."""
    text = json.dumps(_plain(dataclasses.asdict(table)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def public_name(corpus: str) -> str:
    """A corpus as a receipt may name it: ``builtin:NAME`` as is, a file by its name only."""
    return corpus if corpus.startswith("builtin:") or os.sep not in corpus else os.path.basename(corpus)


def release_tag(ftype: str) -> str:
    """The variant's release tag (``<Model>-Q4_K_M_Searched.gguf``): the base's file type with
    ``_Searched``, a name the Hub labels as it is (``Q4_K_M_SEARCHED``, huggingface.js
    parseGGUFQuantLabel: no digit may follow the type) and llama.cpp's ``-hf REPO:Q4_K_M_SEARCHED``
    resolves, apart from a shipped ``Q4_K_M``; the bits per weight are in the description and the card."""
    return f"{ftype}_Searched"


def allocation_recipe(table: SensitivityTable, allocation: Allocation, base: Recipe, name: str = "searched-mtp", *,
                      measured_with_imatrix: bool = False) -> Recipe:
    """The allocation as a recipe on ``base`` (its ftype, output/embedding types, MTP requirement and
    ``[verify]``): one rule per group; ``imatrix = "required"`` when a chosen type needs one, else
    ``"recommended"`` when the costs were measured with an imatrix (an IQ4_XS chosen for its KLD
    with statistics is another file without them: quantize then warns)."""
    patterns = {g.name: g.pattern for g in table.groups}
    rules = tuple(Rule(patterns[group], qtype) for group, qtype in allocation.types)
    imatrix = ("required" if any(needs_imatrix(t, base.ftype) for _, t in allocation.types)
               else "recommended" if measured_with_imatrix and base.imatrix == "none" else base.imatrix)
    return dataclasses.replace(
        base, name=name, tag=release_tag(base.ftype), path=None, sha256=None, mtp_roles=(), mtp_floor=None, rules=rules,
        overrides=(), imatrix=imatrix,
        description=(f"searched by ggufmtp {__version__}: {len(rules)} groups, {allocation.bpw:.3f} bpw over them, "
                     f"predicted KLD {allocation.predicted_kld:.6f} (baseline {table.baseline_recipe})"))


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return repr(v)


def _lines(items: Mapping[str, object]) -> Iterable[str]:
    return (f"{k} = {_value(v)}" for k, v in items.items() if v is not None)


def provenance(table: SensitivityTable, allocation: Allocation) -> dict[str, TomlValue]:
    """The ``[search]`` table's keys: how the recipe was found."""
    return {
        "method": allocation.method, "model_sha256": table.model_sha256, "corpus": public_name(table.corpus),
        "baseline_recipe": table.baseline_recipe, "baseline_kld": table.baseline_kld,
        "table_sha256": table_digest(table), "budget_bytes": allocation.budget_bytes,
        "n_bytes": allocation.n_bytes, "n_params": allocation.n_params, "bpw": round(allocation.bpw, 4),
        "predicted_kld": allocation.predicted_kld, "predicted_acceptance_diff": allocation.predicted_acceptance_diff,
        "prediction": "baseline KLD + the sum of each group's measured delta (one group at a time); see the proof",
        "ggufmtp_version": __version__, "llama_cpp_commit": LLAMA_CPP_COMMIT,
    }


def group_rows(table: SensitivityTable, allocation: Allocation) -> list[dict[str, TomlValue]]:
    """Each group's chosen type and what was measured of it (``[[search.groups]]``)."""
    roles = {g.name: g.role.value for g in table.groups}
    return [{"group": c.candidate.group, "role": roles[c.candidate.group], "type": c.candidate.qtype,
             "n_bytes": c.candidate.n_bytes, "kld": c.kld, "kld_ci": list(c.kld_ci), "same_top_p": c.same_top_p,
             "acceptance_diff": c.acceptance_diff,
             "acceptance_ci": list(c.acceptance_ci) if c.acceptance_ci else None}
            for c in chosen_costs(table, allocation)]


def search_toml(recipe: Recipe, table: SensitivityTable, allocation: Allocation,
                proof: Mapping[str, TomlValue] | None = None,
                points: Sequence[SearchPoint] = ()) -> str:
    """The recipe's TOML with its ``[search]`` table (and ``[search.proof]`` when proven); ``points``:
    the Pareto table's rows the card shows (``[[search.points]]``: label, kind, n_bytes, kld, pareto)."""
    lines = [recipe.to_toml().rstrip("\n"), "", "[search]", *_lines(provenance(table, allocation))]
    if proof:
        lines += ["", "[search.proof]", *_lines(proof)]
    for row in group_rows(table, allocation):
        lines += ["", "[[search.groups]]", *_lines(row)]
    for point in points:
        lines += ["", "[[search.points]]", *_lines(point)]
    return "\n".join(lines) + "\n"
