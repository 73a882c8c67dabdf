"""ggufmtp: produce, audit and verify MTP (NextN) runtime GGUF models for llama.cpp.

The Python API mirrors the pipeline; every function returns a typed result, exported here with
the functions (``ggufmtp.Plan``, ``ggufmtp.AuditReport``, ...), and the package ships ``py.typed``
so a user's type checker sees the annotations. A model argument is what the command line takes:
a path or ``builtin:NAME`` (``run`` and ``run_ladder`` also pull ``owner/repo[@rev]``)::

    import ggufmtp

    pulled = ggufmtp.pull("owner/Model-BF16-GGUF", revision="main")        # -> PullResult
    conv = ggufmtp.convert("Qwen/Qwen3.6-35B-A3B", "model-bf16.gguf")     # -> ConvertResult (safetensors)
    im = ggufmtp.compute_imatrix(pulled.model_path, "builtin:calib-v1", "im.gguf", mtp=True)  # -> ComputeResult
    p = ggufmtp.plan(pulled.model_path, "hifi-q4_k_m-mtp", im.path)        # -> Plan (libllama dry run)
    q = ggufmtp.quantize(pulled.model_path, "hifi-q4_k_m-mtp", "out.gguf")  # -> QuantizeResult, its receipt written
    r = q.receipt                                                           # -> Path of out.gguf.receipt.json
    a = ggufmtp.audit("out.gguf", r)                                        # -> AuditReport
    v = ggufmtp.verify("out.gguf", ggufmtp.VerifyOptions(draft_n_max=4), receipt=r)  # -> VerifyResult
    c = ggufmtp.make_card("out.gguf", r)                                    # -> Path of README.md
    ggufmtp.upload("me/Model-MTP-GGUF", ["out.gguf"], r, c)                 # -> UploadResult
    ggufmtp.run("builtin:tiny-qwen35moe", "hifi-q4_k_m-mtp", out_dir="out") # -> RunResult (all stages)
    s = ggufmtp.search_recipe("model-bf16.gguf", "hifi-q4_k_m-mtp", out="found.toml")  # -> SearchResult (#43)

A function of many settings takes one options object, checked when built: :class:`VerifyOptions`
(with :class:`ServerOptions` and :class:`JudgeOptions`) for ``verify``, :class:`RunOptions` for
``run``, :class:`UploadOptions` for ``upload``, :class:`EvalOptions` for ``evaluate``. Errors are
subclasses of :class:`ggufmtp.errors.GgufmtpError`.
"""

from __future__ import annotations

import importlib as _importlib
from types import ModuleType as _ModuleType
from typing import TYPE_CHECKING

from ._version import __version__
from .errors import GgufmtpError

# Public name -> (module, attribute in it). Names are imported on first use (module __getattr__),
# so ``import ggufmtp`` stays cheap; no public name is also the name of a submodule of this
# package, so importing a submodule never replaces a function (``tests/test_public_api.py``).
_LAZY: dict[str, tuple[str, str]] = {
    "Recipe": ("ggufmtp.quant.recipe", "Recipe"),
    "SynthSpec": ("ggufmtp.synth.spec", "SynthSpec"),
    "synthesize": ("ggufmtp.synth.writer", "synthesize"),
    "inspect": ("ggufmtp._api", "inspect"),
    "plan": ("ggufmtp._api", "plan"),
    "quantize": ("ggufmtp._api", "quantize"),
    "audit": ("ggufmtp.provenance.audit", "audit"),
    "verify": ("ggufmtp._api", "verify"),
    "write_receipt": ("ggufmtp.provenance.receipt", "write_receipt"),
    "make_card": ("ggufmtp.provenance.card", "make_card"),
    "pull": ("ggufmtp.hub.pull", "pull"),
    "upload": ("ggufmtp.hub.upload", "upload"),
    "run": ("ggufmtp.pipeline", "run"),
    "convert": ("ggufmtp.hfconvert.convert", "convert"),
    "compute_imatrix": ("ggufmtp._api", "compute_imatrix"),
    "evaluate": ("ggufmtp._api", "evaluate"),
    "run_ladder": ("ggufmtp.ladder.run", "run_ladder"),
    "search_recipe": ("ggufmtp.search.run", "search_recipe"),
    "VerifyOptions": ("ggufmtp.measure.core.options", "VerifyOptions"),
    "ServerOptions": ("ggufmtp.measure.core.options", "ServerOptions"),
    "JudgeOptions": ("ggufmtp.measure.core.options", "JudgeOptions"),
    "RunOptions": ("ggufmtp.run_options", "RunOptions"),
    "UploadOptions": ("ggufmtp.hub.upload", "UploadOptions"),
    "EvalOptions": ("ggufmtp.quality.options", "EvalOptions"),
    "LadderSpec": ("ggufmtp.ladder.spec", "LadderSpec"),
    "SearchOptions": ("ggufmtp.search.run", "SearchOptions"),
    "MeasureOptions": ("ggufmtp.search.measure", "MeasureOptions"),
    # what the functions return (each function's return annotation names one of these, or Path)
    "SynthResult": ("ggufmtp.synth.writer", "SynthResult"),
    "ModelReport": ("ggufmtp.gguf.model", "ModelReport"),
    "Plan": ("ggufmtp.quant.plan", "Plan"),
    "QuantizeResult": ("ggufmtp.quant.quantize", "QuantizeResult"),
    "AuditReport": ("ggufmtp.provenance.audit", "AuditReport"),
    "VerifyResult": ("ggufmtp.measure.verify.report", "VerifyResult"),
    "PullResult": ("ggufmtp.hub.manifest", "PullResult"),
    "UploadResult": ("ggufmtp.hub.upload", "UploadResult"),
    "RunResult": ("ggufmtp.pipeline", "RunResult"),
    "ConvertResult": ("ggufmtp.hfconvert.convert", "ConvertResult"),
    "ComputeResult": ("ggufmtp.imatrix.compute", "ComputeResult"),
    "QualityResult": ("ggufmtp.quality.eval", "QualityResult"),
    "LadderResult": ("ggufmtp.ladder.run", "LadderResult"),
    "SearchResult": ("ggufmtp.search.run", "SearchResult"),
}

__all__ = ["__version__", "GgufmtpError", "Recipe", "SynthSpec", "synthesize", "inspect", "plan", "quantize",
           "audit", "verify", "write_receipt", "make_card", "pull", "upload", "run", "convert",
           "compute_imatrix", "evaluate", "run_ladder", "VerifyOptions", "ServerOptions", "JudgeOptions", "RunOptions",
           "UploadOptions", "EvalOptions", "LadderSpec", "SynthResult", "ModelReport", "Plan", "QuantizeResult",
           "AuditReport", "VerifyResult", "PullResult", "UploadResult", "RunResult", "ConvertResult", "ComputeResult",
           "QualityResult", "LadderResult", "search_recipe", "SearchOptions", "MeasureOptions", "SearchResult"]


def __getattr__(name: str) -> object:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(_importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    """The public names, loaded or not, and the submodules imported so far."""
    loaded = {k for k, v in globals().items() if isinstance(v, _ModuleType) and not k.startswith("_")}
    return sorted(set(__all__) | loaded)


if TYPE_CHECKING:  # what editors and type checkers see; at run time the names above are lazy
    # the functions as _LAZY maps them (the _api wrappers take builtin:NAME and write receipts)
    from ._api import compute_imatrix, evaluate, inspect, plan, quantize, verify
    from .gguf.model import ModelReport
    from .hfconvert.convert import ConvertResult, convert
    from .hub.manifest import PullResult
    from .hub.pull import pull
    from .hub.upload import UploadOptions, UploadResult, upload
    from .imatrix.compute import ComputeResult
    from .ladder.run import LadderResult, run_ladder
    from .ladder.spec import LadderSpec
    from .measure.core.options import JudgeOptions, ServerOptions, VerifyOptions
    from .measure.verify.report import VerifyResult
    from .pipeline import RunResult, run
    from .provenance.audit import AuditReport, audit
    from .provenance.card import make_card
    from .provenance.receipt import write_receipt
    from .quality.eval import QualityResult
    from .quality.options import EvalOptions
    from .quant.plan import Plan
    from .quant.quantize import QuantizeResult
    from .quant.recipe import Recipe
    from .run_options import RunOptions
    from .search.measure import MeasureOptions
    from .search.run import SearchOptions, SearchResult, search_recipe
    from .synth.spec import SynthSpec
    from .synth.writer import SynthResult, synthesize
