"""Shared pytest fixtures. Add yours below; keep fixtures cheap or session-scoped."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from ggufmtp.errors import RuntimeMissingError
from ggufmtp.runtime import build as runtime
from ggufmtp.synth.builtin import BUILTIN_MODELS
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.writer import synthesize

# Tests that need the llama.cpp runtime (a llama-server, llama-imatrix or llama-perplexity process,
# libllama in process for quantize and plan's dry run, the pinned tree's convert_hf_to_gguf.py (a
# process that spends its 4-5 s of CPU importing torch and transformers), or the built runtime itself) carry the
# ``runtime`` marker; ``make test-fast`` runs the others (``pytest -m "not runtime"``). A test is
# marked when it uses one of these fixtures, directly or through a fixture of its own (a module
# fixture that quantizes requests ``llama_runtime``); a test that reaches the runtime with no
# fixture carries ``@pytest.mark.runtime`` itself. So does a test that takes more than about a second
# on its own (a simulation, a wheel build, torch, a fuzz loop): make test-fast has a 2-minute budget on
# a 2-core machine, and make test still runs everything.
RUNTIME_FIXTURES = frozenset({"llama_runtime", "llama_server_bin", "synth_model", "tiny_mtp_model"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if RUNTIME_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.runtime)


@pytest.fixture(scope="session")
def _no_runtime_here(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("no-runtime")


@pytest.fixture(autouse=True)
def _runtime_only_where_marked(request, monkeypatch, _no_runtime_here):
    """A test without the ``runtime`` marker finds no llama.cpp binary and no libllama (both point at
    an empty folder): one that reaches the runtime anyway fails in every run, instead of passing
    unmarked and spending make test-fast's time. Where libllama is already loaded (make test, after a
    runtime test), only the binaries are hidden: make test-fast is the run that tells."""
    if request.node.get_closest_marker("runtime") is None:
        monkeypatch.setenv(runtime.ENV_BIN, str(_no_runtime_here))
        monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(_no_runtime_here))


@pytest.fixture(scope="session", autouse=True)
def _server_logs_in_pytest_tmp(tmp_path_factory):
    """llama-server logs are kept when a run fails (error messages point at them), and many tests
    fail servers on purpose: keep those logs in pytest's temp tree (pruned after a few runs), not /tmp."""
    mp = pytest.MonkeyPatch()
    d = str(tmp_path_factory.mktemp("tmp"))
    mp.setattr(tempfile, "tempdir", d)
    mp.setenv("TMPDIR", d)  # for the ggufmtp subprocesses some tests start
    yield
    mp.undo()


@pytest.fixture(scope="session")
def llama_runtime() -> None:
    """Declares that a test (or fixture) uses the llama.cpp runtime: libllama in process, a
    llama.cpp binary or the pinned converter. It only marks the test ``runtime``; a missing runtime fails where it is used."""


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    """The pinned llama-server (``make test`` builds it). Missing runtime = failure, not a skip."""
    try:
        return runtime.find_binary("llama-server")
    except RuntimeMissingError as e:
        pytest.fail(f"llama-server is not built ({e}); run `make test` or `ggufmtp runtime build`")


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory) -> Callable[..., Path]:
    """``synth_model("tiny-qwen35moe-f50")`` or ``synth_model(SynthSpec(...))`` -> path of a
    synthetic GGUF written once per test session (into a session temp dir)."""
    root = tmp_path_factory.mktemp("synth")
    made: dict[str, Path] = {}

    def make(spec: str | SynthSpec = "tiny-qwen35moe") -> Path:
        if isinstance(spec, str):
            spec = BUILTIN_MODELS[spec.removeprefix("builtin:")]
        key = spec.digest()
        if key not in made:
            made[key] = synthesize(root / f"{key[:16]}.gguf", spec, progress=False).path
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_mtp_model(synth_model) -> Path:
    """The default synthetic tiny qwen35moe with an MTP block (acceptance 100% at temperature 0)."""
    return synth_model("tiny-qwen35moe")

