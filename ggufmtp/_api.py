"""Public functions that join two stages: :func:`verify` measures and records into a receipt.

Every other public name of :mod:`ggufmtp` is a library function itself (see ``__init__``'s map).
This wrapper repeats the parameters of :func:`ggufmtp.measure.verify.verify` so that
``inspect.signature`` and editors show them; ``tests/test_public_api.py`` checks that both lists
stay equal.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .measure import stats
from .measure import verify as _verify_mod
from .measure.suite import DEFAULT_SUITE, Suite
from .provenance.receipt import set_verification

if TYPE_CHECKING:
    from .quant.recipe import Recipe


def verify(
    model: str | os.PathLike,
    draft_n_max: int | None = None,
    draft_n_min: int | None = None,
    seeds: Sequence[int] = _verify_mod.DEFAULT_SEEDS,
    suite: str | os.PathLike | Suite = DEFAULT_SUITE,
    max_tokens: int = _verify_mod.DEFAULT_MAX_TOKENS,
    raw: bool = False,
    ctx_size: int | None = 4096,
    threads: int | None = None,
    gpu_layers: int | str | None = None,
    parallel: int | None = 1,
    llama_cpp_bin: str | os.PathLike | None = None,
    progress: bool = True,
    thresholds: Any = None,
    limit: int | None = None,
    sweep: Iterable[int] | None = None,
    enforce_speedup: bool = False,
    min_identical: float | None = None,
    bootstrap_resamples: int = stats.DEFAULT_RESAMPLES,
    bootstrap_seed: int = stats.DEFAULT_SEED,
    extra_args: Sequence[str] = (),
    on_record: Callable[[_verify_mod.Record], None] | None = None,
    tuned: Any = None,
    peak_bandwidth_gbs: float | None = None,
    server_args: Sequence[str] = (),
    mtp_server_args: Sequence[str] = (),
    vanilla_server_args: Sequence[str] = (),
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    context_fill: int = 0,
    *,
    receipt: str | os.PathLike | None = None,
) -> _verify_mod.VerifyResult:
    """Verify MTP drafting with llama-server (see :func:`ggufmtp.measure.verify.verify`, whose
    parameters these are). With ``receipt``, the results go into that receipt's verification
    section; what tune, curve and profiles added there is kept."""
    args = dict(locals())  # exactly the parameters above, forwarded by name
    del args["receipt"]
    if thresholds is None and receipt is not None:
        rec = verify_recipe(None, receipt)  # the receipt's recipe judges its artifact
        args["thresholds"] = _verify_mod.Thresholds.from_recipe(rec.verify, rec.name)
        if draft_n_max is None and tuned is None:
            args["draft_n_max"] = rec.verify.draft_n_max
    res = _verify_mod.verify(**args)
    if receipt is not None:
        set_verification(receipt, res.to_receipt(), keep_added=True)
    return res


def verify_recipe(recipe_name: str | None, receipt: str | os.PathLike | None) -> Recipe | None:
    """The recipe whose ``[verify]`` table judges a verification: ``recipe_name``, else the recipe
    the receipt names (the one its artifact was made with; refused when the recipe found by that
    name is not the bytes the receipt records), else None (the project's defaults)."""
    from .errors import RecipeError, VerifyError
    from .provenance.receipt import read_receipt
    from .quant.recipe import Recipe

    if recipe_name:
        return Recipe.load(recipe_name)
    if receipt is None:
        return None
    named = read_receipt(receipt).predicate["recipe"]
    try:
        rec = Recipe.load(named["name"])
    except RecipeError as e:
        raise VerifyError(f"{receipt}: its recipe {named['name']!r} cannot be loaded to judge the verification "
                          f"({e}); name the recipe with -r") from None
    if named.get("sha256") and rec.sha256 != named["sha256"]:
        raise VerifyError(f"{receipt}: its recipe {named['name']!r} had sha256 {named['sha256']}; the one found now "
                          f"has {rec.sha256}: name the recipe to judge with (-r)")
    return rec
