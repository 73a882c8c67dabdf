"""The public API (``ggufmtp.__all__``): lazy names that stay the same functions however often
they are called and whatever has been imported since (issue #15: ``ggufmtp.verify`` used to turn
into the ``ggufmtp.verify`` module after its first call), with their real signatures."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import ggufmtp
from ggufmtp.errors import GgufmtpError, RecipeError
from ggufmtp.measure.verify import run as verify_mod
from ggufmtp.synth.hf import synthesize_hf

FUNCTIONS = ("synthesize", "inspect", "plan", "quantize", "audit", "verify", "write_receipt", "make_card", "pull",
             "upload", "run", "convert", "compute_imatrix", "evaluate", "run_ladder", "search_recipe")
CLASSES = ("Recipe", "SynthSpec", "GgufmtpError", "VerifyOptions", "ServerOptions", "JudgeOptions", "RunOptions",
           "UploadOptions", "EvalOptions", "LadderSpec", "SearchOptions", "MeasureOptions")
# what the functions return, exported beside them (#42): a user can name the type of a result
RESULTS = ("SynthResult", "ModelReport", "Plan", "QuantizeResult", "AuditReport", "VerifyResult", "PullResult",
           "UploadResult", "RunResult", "ConvertResult", "ComputeResult", "QualityResult", "LadderResult",
           "SearchResult")
MAX_PARAMETERS = 10  # issue #32: a function of more settings takes an options object


def _import_every_submodule() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(ggufmtp.__path__, "ggufmtp.") if m.name != "ggufmtp.__main__"]
    for name in names:
        importlib.import_module(name)
    return names


def test_no_public_name_is_also_a_submodule_name():
    submodules = {m.name for m in pkgutil.iter_modules(ggufmtp.__path__)}
    assert not set(ggufmtp.__all__) & submodules


def test_public_names_are_lazy_listed_and_typed():
    proc = subprocess.run([sys.executable, "-c", "import sys, ggufmtp; print(sorted(m for m in sys.modules "
                           "if m.startswith('ggufmtp.') and m not in ('ggufmtp._version', 'ggufmtp.errors')))"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", "import ggufmtp should load no stage module"
    assert set(ggufmtp.__all__) == set(FUNCTIONS) | set(CLASSES) | set(RESULTS) | {"__version__"}
    assert set(ggufmtp.__all__) <= set(dir(ggufmtp))
    for name in FUNCTIONS:
        assert inspect.isfunction(getattr(ggufmtp, name)), name
    for name in CLASSES + RESULTS:
        assert inspect.isclass(getattr(ggufmtp, name)), name
    assert isinstance(ggufmtp.__version__, str)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ggufmtp.nope  # noqa: B018


def test_public_functions_have_real_signatures():
    for name in FUNCTIONS:
        kinds = {p.kind for p in inspect.signature(getattr(ggufmtp, name)).parameters.values()}
        assert not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}, name
    # ggufmtp.verify is the measuring function: the model, one options object, and keyword-only
    # switches; the same parameters, same defaults (``receipt``: the measuring function reads it for
    # the source a reference is bound to, ggufmtp.verify also writes the results into it, signed
    # with ``signing_key`` as ``verify --signing-key`` does).
    P = inspect.Parameter
    shape = lambda f: [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]  # noqa: E731
    assert shape(ggufmtp.verify) == [("model", P.POSITIONAL_OR_KEYWORD, P.empty),
                                     ("options", P.POSITIONAL_OR_KEYWORD, None), ("receipt", P.KEYWORD_ONLY, None),
                                     ("progress", P.KEYWORD_ONLY, True), ("on_record", P.KEYWORD_ONLY, None),
                                     ("profile", P.KEYWORD_ONLY, None), ("signing_key", P.KEYWORD_ONLY, None)]
    assert shape(verify_mod.verify) + [("signing_key", P.KEYWORD_ONLY, None)] == shape(ggufmtp.verify)
    assert inspect.signature(ggufmtp.verify).parameters["options"].annotation == "VerifyOptions | None"
    # upload and evaluate: their inputs, one options object, keyword-only switches
    for f, cls in ((ggufmtp.upload, "UploadOptions"), (ggufmtp.evaluate, "EvalOptions")):
        params = inspect.signature(f).parameters
        assert params["options"].annotation == f"{cls} | None" and params["options"].default is None
        assert params["progress"].kind == P.KEYWORD_ONLY
    assert shape(ggufmtp.run)[:3] == [("model", P.POSITIONAL_OR_KEYWORD, P.empty),
                                      ("recipe", P.POSITIONAL_OR_KEYWORD, P.empty),
                                      ("options", P.POSITIONAL_OR_KEYWORD, None)]


def test_every_result_type_is_exported():
    """Each public function returns a class ``ggufmtp`` exports (the one its annotation names), or a Path."""
    for name in FUNCTIONS:
        f = getattr(ggufmtp, name)
        returned = str(inspect.signature(f).return_annotation).rpartition(".")[2]
        assert returned == "Path" or returned in RESULTS, (name, returned)
        if returned != "Path":  # the very class, not one of the same name
            annotation = str(inspect.signature(f).return_annotation)
            assert eval(annotation, vars(sys.modules[f.__module__])) is getattr(ggufmtp, returned), name


def test_every_function_that_reads_a_model_takes_a_builtin_name(tmp_path):
    """The command line's model references (#42): ``builtin:NAME`` is resolved by :mod:`ggufmtp.refs`
    in every function that reads a model, before any other work (an unknown name is the resolver's
    error, not "no such file"); ``inspect`` reads the built-in model itself."""
    calls = {
        "inspect": lambda m: ggufmtp.inspect(m),
        "plan": lambda m: ggufmtp.plan(m, "q8_0-mtp"),
        "quantize": lambda m: ggufmtp.quantize(m, "q8_0-mtp", tmp_path / "q.gguf", progress=False),
        "verify": lambda m: ggufmtp.verify(m, progress=False),
        "evaluate (base)": lambda m: ggufmtp.evaluate(m, tmp_path / "q.gguf", progress=False),
        "evaluate (quant)": lambda m: ggufmtp.evaluate(tmp_path / "q.gguf", m, progress=False),
        "compute_imatrix": lambda m: ggufmtp.compute_imatrix(m, "builtin:calib-v1", tmp_path / "im.gguf"),
        "search_recipe": lambda m: ggufmtp.search_recipe(m, "8.5bpw", out=tmp_path / "found.toml"),
    }
    for name, call in calls.items():
        with pytest.raises(GgufmtpError, match="unknown built-in model 'builtin:no-such-model'"):
            call("builtin:no-such-model")
        assert not any(tmp_path.iterdir()), name
    assert ggufmtp.inspect("builtin:tiny-qwen35moe").mtp_status == "complete"


@pytest.mark.runtime
def test_plan_takes_a_builtin_name():
    """The issue's case: plan read ``builtin:tiny-qwen35moe`` as a file name (GGUFReadError)."""
    p = ggufmtp.plan("builtin:tiny-qwen35moe", "q8_0-mtp")
    assert p.ok and p.mtp_summary().tensors > 0


# Each function's inputs, the ones taken by position (#42); every other parameter is keyword-only.
POSITIONAL: dict[str, tuple[str, ...] | None] = {
              "synthesize": ("out", "spec"), "inspect": ("path",), "plan": ("model", "recipe", "imatrix"),
              "quantize": ("model", "recipe", "out", "imatrix"), "audit": ("artifact", "receipt"),
              "verify": ("model", "options"), "write_receipt": ("result", "receipt_path"),
              "pull": ("repo_id",), "upload": ("repo_id", "files", "receipt", "card", "options"),
              "run": ("model", "recipe", "options"), "convert": ("source", "output"),
              "compute_imatrix": ("model", "corpus", "out"), "evaluate": ("base", "quant", "options"),
              "run_ladder": ("spec", "engine"), "make_card": ("artifact", "receipt", "output"),
              "search_recipe": ("model", "budget", "options")}


def test_options_are_keyword_only_and_progress_has_one_default():
    """Inputs by position, options by name; ``progress`` is True everywhere (a bar is drawn only on a
    terminal and not under ``--no-progress``/``$GGUFMTP_NO_PROGRESS``: :mod:`ggufmtp.progress`)."""
    P = inspect.Parameter
    assert set(POSITIONAL) == set(FUNCTIONS)
    for name in FUNCTIONS:
        params = inspect.signature(getattr(ggufmtp, name)).parameters.values()
        positional = tuple(p.name for p in params if p.kind == P.POSITIONAL_OR_KEYWORD)
        assert POSITIONAL[name] is None or positional == POSITIONAL[name], name
        progress = next((p for p in params if p.name == "progress"), None)
        assert progress is None or (progress.default is True and progress.kind == P.KEYWORD_ONLY), name


def _public_functions() -> dict[str, object]:
    """Every public function: those ``ggufmtp`` exports, and those in the ``__all__`` of its modules."""
    out = {f"ggufmtp.{name}": getattr(ggufmtp, name) for name in FUNCTIONS}
    for name in _import_every_submodule():
        mod = sys.modules[name]
        for attr in getattr(mod, "__all__", ()):
            obj = getattr(mod, attr, None)
            if inspect.isfunction(obj) and not attr.startswith("_"):
                out[f"{name}.{attr}"] = obj
    return out


# Not yet given their options objects (#32; their modules were being reworked in parallel): the
# list may only shrink, and a function leaves it when it takes at most MAX_PARAMETERS.
PENDING: dict[str, int] = {}


def test_no_public_function_takes_more_than_ten_parameters():
    """More settings go into an options object (``VerifyOptions``, ``RunOptions``, ``TuneOptions``, ...)."""
    funcs = _public_functions()
    assert "ggufmtp.verify" in funcs and "ggufmtp.measure.tune.run.tune" in funcs
    assert "ggufmtp.quality.eval.base_logits" in funcs  # had 12 (#42): its settings are EvalOptions'
    many = {name: n for name, f in funcs.items() if (n := len(inspect.signature(f).parameters)) > MAX_PARAMETERS}
    assert {k: v for k, v in many.items() if k not in PENDING} == {}, \
        f"public functions with more than {MAX_PARAMETERS} parameters: {many}"
    done = {k for k in PENDING if k not in many or many[k] > PENDING[k]}
    assert not done, f"{done}: no longer (or more) over {MAX_PARAMETERS} parameters: update PENDING"


def _shape(obj: object) -> object:
    """What must not change between calls: the type, and a record's field names."""
    if dataclasses.is_dataclass(obj):
        return type(obj), tuple(f.name for f in dataclasses.fields(obj))
    return type(obj)


def _call_every_function(model: Path, work: Path) -> dict[str, object]:
    """Each public function once, on the tiny synthetic model, with the cheapest settings."""
    work.mkdir()
    out: dict[str, object] = {}
    out["synthesize"] = ggufmtp.synthesize(work / "synth.gguf", ggufmtp.SynthSpec(), progress=False)
    out["inspect"] = ggufmtp.inspect(model)
    out["plan"] = ggufmtp.plan(model, "q8_0-mtp")
    q = out["quantize"] = ggufmtp.quantize(model, "q8_0-mtp", work / "q8.gguf", progress=False)
    receipt = out["write_receipt"] = ggufmtp.write_receipt(q)
    out["audit"] = ggufmtp.audit(q.output, receipt)
    out["verify"] = ggufmtp.verify(q.output, ggufmtp.VerifyOptions(draft_n_max=2, seeds=(42,), limit=1, max_tokens=8,
                                                                   server=ggufmtp.ServerOptions(threads=2)),
                                   progress=False, receipt=receipt)
    card = out["make_card"] = ggufmtp.make_card(q.output, receipt)
    base = work / "base"
    base.mkdir()
    shutil.copy(model, base / model.name)
    out["pull"] = ggufmtp.pull(str(base), progress=False)
    # a 1-prompt x 8-token verification is not publishable (#28): the card says so, and the flag allows it
    options = ggufmtp.UploadOptions(dry_run=True, allow_unverified=True, endpoint="http://127.0.0.1:9")
    out["upload"] = ggufmtp.upload("me/model", [q.output], [receipt], card, options, progress=False)
    out["run"] = ggufmtp.run(str(model), "q8_0-mtp", ggufmtp.RunOptions(verify=False), out_dir=work / "run",
                             progress=False)
    hf = synthesize_hf(work / "hf", ggufmtp.SynthSpec())
    out["convert"] = ggufmtp.convert(hf.directory, work / "converted.gguf", progress=False)
    out["compute_imatrix"] = ggufmtp.compute_imatrix(model, "builtin:calib-v1", work / "imatrix.gguf", chunks=2,
                                                     ctx_size=128, mtp=True)
    out["evaluate"] = ggufmtp.evaluate(model, q.output, ggufmtp.EvalOptions("builtin:calib-v1", ctx_size=128, chunks=2,
                                                                            threads=2), progress=False)
    from ggufmtp.ladder.spec import LadderSpec

    out["run_ladder"] = ggufmtp.run_ladder(LadderSpec(str(model), ("q8_0-mtp",), work / "ladder", verify=False),
                                           progress=False)
    measure = ggufmtp.MeasureOptions(ggufmtp.EvalOptions("builtin:calib-v1", ctx_size=128, chunks=2, threads=2),
                                     progress=False)
    out["search_recipe"] = ggufmtp.search_recipe(model, "8.5bpw", ggufmtp.SearchOptions(types=("Q8_0",), measure=measure),
                                                 out=work / "found.toml")
    return out


def test_every_function_twice_and_after_importing_every_submodule(tiny_mtp_model, tmp_path):
    before = {name: getattr(ggufmtp, name) for name in ggufmtp.__all__}
    first = _call_every_function(tiny_mtp_model, tmp_path / "first")
    second = _call_every_function(tiny_mtp_model, tmp_path / "second")
    assert _import_every_submodule()
    third = _call_every_function(tiny_mtp_model, tmp_path / "third")
    assert {name: getattr(ggufmtp, name) for name in ggufmtp.__all__} == before
    assert set(first) == set(FUNCTIONS)
    for name in FUNCTIONS:
        assert not isinstance(first[name], (dict, types.ModuleType)), f"{name} returned {type(first[name])}"
        assert _shape(first[name]) == _shape(second[name]) == _shape(third[name]), name
    assert first["audit"].ok and third["audit"].ok
    assert first["verify"].to_receipt()["mtp"]["draft_n"] > 0
    assert [s.stage for s in first["run"].stages] == [s.stage for s in third["run"].stages]
    # verify(receipt=...) wrote the verification section
    assert ggufmtp.write_receipt is before["write_receipt"]
    from ggufmtp.provenance.receipt import load_receipt
    assert load_receipt(third["write_receipt"])["predicate"]["verification"]["verdict"] == third["verify"].verdict


def test_run_takes_the_model_first_and_refuses_the_old_order_by_name(tmp_path):
    """#42 item 3: every function takes the model first; run(recipe, model), the former
    order, is refused with a message that says so, before anything is written."""
    out = tmp_path / "out"
    with pytest.raises(RecipeError, match=r"model first: run\('builtin:tiny-qwen35moe', 'q8_0-mtp'\)"):
        ggufmtp.run("q8_0-mtp", "builtin:tiny-qwen35moe", out_dir=out, progress=False)
    assert not out.exists()
    with pytest.raises(RecipeError, match="no-such-recipe") as e:
        ggufmtp.run("builtin:tiny-qwen35moe", "no-such-recipe", out_dir=out, progress=False)
    assert "model first" not in str(e.value)
    params = list(inspect.signature(ggufmtp.run).parameters)
    assert params[:2] == ["model", "recipe"]

