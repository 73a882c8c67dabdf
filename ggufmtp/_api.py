"""Public functions that join two stages: :func:`quantize` quantizes and writes the receipt, as
``ggufmtp quantize`` does (the command calls it); :func:`verify` measures and records into a
receipt; :func:`store_in_receipt` adds tune's, curve's and profiles' results to it (the measurement
layer writes no receipt).

Every other public name of :mod:`ggufmtp` is a library function itself (see ``__init__``'s map).
The verify wrapper takes the measuring function's parameters (:func:`ggufmtp.measure.verify.run.verify`:
the model, a :class:`~ggufmtp.measure.core.options.VerifyOptions`, ``progress`` and ``on_record``)
plus ``signing_key`` for the receipt it writes; ``tests/test_public_api.py`` checks that both
signatures stay so. A keyword is
named as the command's option (``quantize_threads`` for ``--quantize-threads``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from .errors import QuantizeError, TuneError
from .files.hashing import sha256_file
from .gguf.model import ModelReport, inspect_model, refuse_later_shard
from .imatrix.compute import ComputeResult
from .imatrix.compute import compute_imatrix as _compute
from .imatrix.corpus import Corpus
from .imatrix.entries import DEFAULT_CHUNK_SIZE
from .jsontypes import JsonObject
from .measure.core.options import VerifyOptions
from .measure.verify import run as _verify_mod
from .provenance.receipt import (
    Receipt,
    default_receipt_path,
    read_receipt,
    receipt_for_quantize,
    set_verification,
)
from .provenance.recipe_store import receipt_recipe
from .provenance.signing import resolve_signing_key, sign_artifact, signature_path
from .provenance.tuned import ProfileSource, is_search
from .quality.eval import QualityResult
from .quality.eval import evaluate as _evaluate
from .quality.options import EvalOptions
from .quant.plan import Plan, make_plan
from .quant.quantize import QuantizeResult, check_quantize_threads
from .quant.quantize import quantize as _quantize
from .quant.recipe import Recipe
from .quant.split import DEFAULT_SPLIT_MAX_SIZE, SplitSize
from .refs import local_model_arg


def verify(model: str | os.PathLike, options: VerifyOptions | None = None, *,
           receipt: str | os.PathLike | None = None, progress: bool = True,
           on_record: Callable[[_verify_mod.Record], None] | None = None,
           profile: ProfileSource | None = None,
           signing_key: str | os.PathLike | None = None) -> _verify_mod.VerifyResult:
    """Verify MTP drafting with llama-server (see :func:`ggufmtp.measure.verify.run.verify`, whose
    parameters these are, and :class:`~ggufmtp.measure.core.options.VerifyOptions`). With
    ``receipt``, a reference is bound to the source it names, and the results go into that
    receipt's verification section; what tune, curve and profiles added there is kept; without
    thresholds in ``options``, the recipe the receipt names judges (and gives the draft window,
    unless a tuned configuration fixes it). ``profile``: the file ``options.tuned`` came from
    (:func:`~ggufmtp.measure.tune.run.load_tuned_profile`): the result then recommends that profile
    as this file is served, with this run's figures. ``signing_key`` (``--signing-key``; default
    ``$GGUFMTP_SIGNING_KEY``) re-signs a signed receipt; it is loaded before any server starts."""
    key = resolve_signing_key(signing_key) if receipt is not None else None  # a bad key fails before the run
    o = options if options is not None else VerifyOptions()
    if o.judge.thresholds is None and receipt is not None:
        rec = verify_recipe(None, receipt)  # the receipt's recipe judges its artifact
        o = o.with_defaults(thresholds=_verify_mod.Thresholds.from_recipe(rec.verify, rec.name),
                            draft_n_max=rec.verify.draft_n_max if o.tuned is None else None)
    path = local_model_arg(model)
    refuse_later_shard(path)  # llama-server loads a split model from its first shard only
    for field_name in ("reference", "sidecar"):  # what the CLI accepts: builtin:NAME, a path
        given = getattr(o, field_name)
        if isinstance(given, str) and given.startswith("builtin:"):
            o = dataclasses.replace(o, **{field_name: local_model_arg(given)})
    res = _verify_mod.verify(path, o, progress=progress, on_record=on_record, receipt=receipt, profile=profile)
    if receipt is not None:
        set_verification(receipt, res.to_receipt(), keep_added=True, signing_key=key)
    return res


def plan(model: str | os.PathLike, recipe: Recipe | str | Path, imatrix: str | Path | None = None, *,
         quantize_threads: int = 0, mtp_optional: bool = False) -> Plan:
    """:func:`ggufmtp.quant.plan.make_plan` of ``model``: a path or ``builtin:NAME``
    (``quantize_threads``: ``--quantize-threads``, as :func:`quantize`)."""
    check_quantize_threads(quantize_threads)
    return make_plan(local_model_arg(model), recipe, imatrix, threads=quantize_threads, mtp_optional=mtp_optional)


def quantize(model: str | os.PathLike, recipe: Recipe | str | Path, out: str | os.PathLike,
             imatrix: str | Path | None = None, *, quantize_threads: int = 0,
             split_max_size: SplitSize | None = DEFAULT_SPLIT_MAX_SIZE, receipt: str | os.PathLike | None = None,
             no_receipt: bool = False, signing_key: str | os.PathLike | None = None, progress: bool = True
             ) -> QuantizeResult:
    """What ``ggufmtp quantize MODEL -r RECIPE -o OUT`` does, with its options' names: quantize
    ``model`` (a path or ``builtin:NAME``) in-process with libllama, audit the output against the
    plan, write its receipt (``receipt``: its path, default ``OUT.receipt.json`` beside the published
    file; ``no_receipt``: none) and, with ``signing_key`` (default ``$GGUFMTP_SIGNING_KEY``), sign
    the receipt and the artifact; only then is ``out`` renamed into place, so the artifact never
    exists without its receipt. ``split_max_size``: the largest file to write
    (:class:`~ggufmtp.quant.split.SplitSize`; None: one file); ``quantize_threads``: 0 for all
    cores. The result's ``receipt`` and ``signature`` name what was written. The quantization
    without a receipt (from a plan already made, the MTP block optional, a step of your own before
    publishing) is :func:`ggufmtp.quant.quantize.quantize`."""
    check_quantize_threads(quantize_threads)
    key = resolve_signing_key(signing_key)  # a bad key fails before any work
    if receipt is not None and Path(receipt).resolve() == Path(out).resolve():
        raise QuantizeError(f"{receipt}: the receipt path is the output path (it would overwrite the artifact)")
    publisher = _receipt_writer(str(model), Path(out), imatrix, receipt, key, write=not no_receipt)
    return _quantize(local_model_arg(model), recipe, out, imatrix, threads=quantize_threads, progress=progress,
                     before_publish=publisher, split=split_max_size)


def _receipt_writer(model_arg: str, out: Path, imatrix: str | Path | None, receipt: str | os.PathLike | None,
                    key: Path | None, *, write: bool) -> Callable[[QuantizeResult], None] | None:
    """The step :func:`quantize` runs on the staged artifact before publishing it: its signatures
    (with ``key``) and its receipt (with ``write``), their paths recorded in the result."""
    if not write and key is None:
        return None

    def publish(staged: QuantizeResult) -> None:
        final = staged.destination or out  # a split output's first shard
        if key is not None:
            for f in staged.files:
                sign_artifact(f, key, signature=signature_path(final.parent / f.name))
            staged.signature = signature_path(final)
        if write:
            staged.receipt = receipt_for_quantize(staged, model_arg=model_arg, imatrix=imatrix, signing_key=key,
                                                  receipt_path=receipt or default_receipt_path(final))
    return publish


def compute_imatrix(model: str | os.PathLike, corpus: str | os.PathLike | Corpus, out: str | os.PathLike, *,
                    chunks: int | None = None, ctx_size: int = DEFAULT_CHUNK_SIZE, gpu_layers: int | str | None = None,
                    threads: int | None = None, mtp: bool = False, progress: bool = True,
                    binary: str | os.PathLike | None = None) -> ComputeResult:
    """:func:`ggufmtp.imatrix.compute.compute_imatrix` of ``model``: a path or ``builtin:NAME``."""
    return _compute(local_model_arg(model), corpus, out, chunks=chunks, ctx_size=ctx_size, gpu_layers=gpu_layers,
                    threads=threads, mtp=mtp, progress=progress, binary=binary)


def evaluate(base: str | os.PathLike, quant: str | os.PathLike, options: EvalOptions | None = None, *,
             progress: bool = True, log: Callable[[str], None] = lambda m: None, hash_quant: bool = True) -> QualityResult:
    """:func:`ggufmtp.quality.eval.evaluate` of ``quant`` against ``base``: paths or ``builtin:NAME``."""
    return _evaluate(local_model_arg(base), local_model_arg(quant), options, progress=progress, log=log,
                     hash_quant=hash_quant)


def inspect(path: str | os.PathLike) -> ModelReport:
    """Read ``path`` (any shard of a split model, or ``builtin:NAME``) and report its MTP
    structure (:func:`ggufmtp.gguf.model.inspect_model` of the resolved path)."""
    return inspect_model(local_model_arg(path))


def verify_recipe(recipe_name: str | None, receipt: str | os.PathLike | Receipt | None) -> Recipe | None:
    """The recipe whose ``[verify]`` table judges a verification: ``recipe_name``, else the recipe
    the receipt names (the one its artifact was made with, found by its sha256:
    :func:`ggufmtp.provenance.recipe_store.receipt_recipe`), else None (the project's defaults)."""
    if receipt is None:
        return Recipe.load(recipe_name) if recipe_name else None
    return receipt_recipe(receipt if isinstance(receipt, Receipt) else read_receipt(receipt), recipe_name)


def store_in_receipt(path: str | os.PathLike, model: str | os.PathLike | None = None,
                     **sections: dict[str, Any] | None) -> dict[str, Any]:
    """Add ``sections`` (e.g. ``tuned=...``, ``profiles=...``, ``acceptance_curve=...``) to the receipt's
    verification section, keeping every key verify wrote (``set_verification`` replaces the whole
    section, so it is loaded and merged first), re-seal and write it back. The receipt must already
    hold a verification (``ggufmtp verify MODEL --receipt R``). ``model``: refuse when its size differs
    from the verified model's."""
    rf = verified_receipt(path, model)  # once: the check and the write below take this object
    v = cast(JsonObject, rf.predicate.get("verification"))
    old_tuned = v.get("tuned")
    if sections.get("tuned") and isinstance(old_tuned, dict) and not is_search(old_tuned) and "profile" not in old_tuned:
        sections["tuned"] = {**sections["tuned"], "verify_sweep": old_tuned}  # verify --sweep's, kept
    merged = dict(v)
    merged.update({k: val for k, val in sections.items() if val is not None})
    return set_verification(rf, merged)


def verified_receipt(path: str | os.PathLike, model: str | os.PathLike | None = None, *,
                     digest: bool = True) -> Receipt:
    """The receipt at ``path``, which must hold the verification that tune, curve and profiles add
    to: TuneError when it has none yet, or when ``model`` is not the model it verified (its size;
    with ``digest``, its sha256 too). The measuring commands call it before their run
    (``digest=False``: the size is enough there), so a run is never spent on a receipt it cannot go into."""
    rf = read_receipt(path)
    v = rf.verification
    if not v:
        raise TuneError(f"{path}: the receipt has no verification section yet; run `ggufmtp verify MODEL "
                        f"--receipt {path}` first (tune, profiles and curve add to it)")
    if model is not None:
        _check_same_model(path, v.get("model") or {}, Path(model), digest=digest)
    return rf


def _check_same_model(receipt: str | os.PathLike, verified: Mapping[str, object], p: Path, *,
                      digest: bool = True) -> None:
    """TuneError unless ``p`` is the model the receipt's verification measured (its size, then its
    sha256 when the verification names one and ``digest``)."""
    if not p.is_file():
        return
    want = verified.get("size_bytes")
    if want is not None and p.stat().st_size != want:
        raise TuneError(f"{receipt}: its verification is of a {want}-byte model, not {p} ({p.stat().st_size} bytes)")
    if not digest:
        return
    digest_want = verified.get("sha256")
    got = sha256_file(p) if digest_want else None
    if got != digest_want:
        raise TuneError(f"{receipt}: its verification is of the model with sha256 {digest_want}, not {p} (sha256 {got})")
