"""ggufmtp: produce, audit and verify MTP (NextN) runtime GGUF models for llama.cpp.

The Python API mirrors the pipeline; every function returns a typed result::

    import ggufmtp

    pulled = ggufmtp.pull("owner/Model-BF16-GGUF", revision="main")        # -> PullResult
    p = ggufmtp.plan(pulled.model_path, "hifi-q4_k_m-mtp")                 # -> Plan (libllama dry run)
    q = ggufmtp.quantize(pulled.model_path, "hifi-q4_k_m-mtp", "out.gguf")  # -> QuantizeResult
    r = ggufmtp.write_receipt(q)                                            # -> Path of out.gguf.receipt.json
    a = ggufmtp.audit("out.gguf", r)                                        # -> AuditReport
    v = ggufmtp.verify("out.gguf", draft_n_max=4, receipt=r)                # -> VerifyResult
    c = ggufmtp.make_card("out.gguf", r)                                    # -> Path of README.md
    ggufmtp.upload("me/Model-MTP-GGUF", ["out.gguf"], r, c)                 # -> UploadResult
    ggufmtp.run("hifi-q4_k_m-mtp", "builtin:tiny-qwen35moe", out_dir="out") # -> RunResult (all stages)

Errors are subclasses of :class:`ggufmtp.errors.GgufmtpError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._version import __version__
from .errors import GgufmtpError

# Submodules are imported first so that the functions bound below keep their names: the
# package attribute ``ggufmtp.plan`` is the function, the module stays ``ggufmtp.plan`` in
# sys.modules (``from ggufmtp.plan import Plan`` works as usual).
from .provenance import audit as _audit_mod  # noqa: E402
from .provenance import card as _card_mod  # noqa: E402
from .gguf import model as _model_mod  # noqa: E402
from . import pipeline as _pipeline_mod  # noqa: E402
from .quant import plan as _plan_mod  # noqa: E402
from .quant import quantize as _quantize_mod  # noqa: E402
from .provenance import receipt as _receipt_mod  # noqa: E402
from .quant.recipe import Recipe  # noqa: E402
from .synth.factory import SynthSpec, synthesize  # noqa: E402

inspect = _model_mod.inspect_model
plan = _plan_mod.make_plan
quantize = _quantize_mod.quantize
audit = _audit_mod.audit
make_card = _card_mod.make_card
run = _pipeline_mod.run


def write_receipt(result: "_quantize_mod.QuantizeResult", receipt_path: str | Path | None = None,
                  imatrix: str | Path | None = None, model_arg: str | None = None,
                  manifest: dict[str, Any] | None = None) -> Path:
    """Write the receipt of a :func:`quantize` result (default ``OUT.gguf.receipt.json``)."""
    return _receipt_mod.receipt_for_quantize(result, model_arg=model_arg, imatrix=imatrix or result.plan.imatrix,
                                             receipt_path=receipt_path, manifest=manifest)


def verify(model: str | Path, *args: Any, receipt: str | Path | None = None, **kwargs: Any):
    """Verify MTP drafting with llama-server (see :func:`ggufmtp.verify.verify`); with
    ``receipt``, the results go into its verification section (what tune, curve and profiles
    added there is kept)."""
    from .measure.verify import verify as _verify

    res = _verify(model, *args, **kwargs)
    if receipt is not None:
        _receipt_mod.set_verification(receipt, res.to_receipt(), keep_added=True)
    return res


def pull(repo_id: str, *args: Any, **kwargs: Any):
    """Pull a checkpoint from the Hub, pinned to a commit (see :func:`ggufmtp.hub.pull`)."""
    from .hub.hub import pull as _pull

    return _pull(repo_id, *args, **kwargs)


def upload(repo_id: str, *args: Any, **kwargs: Any):
    """Publish artifact, receipt(s) and card in one commit (see :func:`ggufmtp.hub.upload`)."""
    from .hub.hub import upload as _upload

    return _upload(repo_id, *args, **kwargs)


__all__ = ["__version__", "GgufmtpError", "Recipe", "SynthSpec", "synthesize", "inspect", "plan", "quantize",
           "audit", "verify", "write_receipt", "make_card", "pull", "upload", "run"]
