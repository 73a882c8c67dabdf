"""#49 item 6: the memory plan's compute buffers. Where ggufmtp's estimate is calibrated (GQA and
hybrid graphs) the plan keeps it; where it is known to be low (MLA, DSA, DeepSeek-V4:
COMPUTE_UNCALIBRATED) it takes the larger of the estimate and llama.cpp's own projection
(``llama-fit-params --fit-print on``, ggufmtp.runtime.fit_params), an upper bound by at most one
logits tensor; a runtime without the tool, or a tool that fails, falls back to the estimate with a
note; an answer is cached by model file, flags and binary."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from ggufmtp.constants import EXTRA_BINARIES, FIT_PARAMS_TOOL, RUNTIME_BINARIES
from ggufmtp.measure.core.options import ServerOptions, VerifyOptions
from ggufmtp.runtime import build as runtime
from ggufmtp.runtime.compute import Source, planned_compute, projected_compute
from ggufmtp.runtime.fit_params import DeviceFigures, Projected, Projection, parse_fit_print, project_memory, sizing_flags, ubatch_of
from ggufmtp.runtime.memory import MIB, ModelFacts, Role, compute_estimate, plan_for_verify
from ggufmtp.runtime.server import LlamaServer, ServerConfig

ROOMY = ((10**12,), "test")  # one GPU with room for anything: the plan's layout, no refusal


def _reported_compute(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"compute buffer size =\s*([\d.]+) MiB", log)]


def _servers(plan) -> dict[Role, object]:
    return {s.role: s for p in plan.phases for s in p.servers}


def _logits_bound(path: Path, ubatch: int, outputs: int) -> float:
    """MiB by which llama.cpp's projection may exceed the server's buffer: the logits of the
    physical batch's tokens that the server does not reserve as outputs."""
    return (ubatch - outputs) * ModelFacts.read(path).n_vocab * 4 / MIB


#: (model, VerifyOptions, the vanilla server's own flags, its physical batch): llama-server's
#: defaults as ggufmtp starts them, and a physical batch and context given as --server-arg, which
#: must reach llama.cpp
CASES = {
    "mla": ("tiny-deepseek2", VerifyOptions(), [], 512),
    "dsa": ("tiny-glm-dsa", VerifyOptions(), [], 512),
    "dsv4": ("tiny-deepseek4", VerifyOptions(), [], 512),
    "mla-ub256-c8192": ("tiny-deepseek2", VerifyOptions(ctx_size=8192, server=ServerOptions(server_args=("-ub", "256"))),
                        ["-ub", "256"], 256),
}


@pytest.mark.parametrize("case", list(CASES))
def test_main_context_compute_is_never_under_what_llama_server_reserves(synth_model, case):
    """The vanilla server's compute buffer in the plan against the pinned llama-server's own
    report (CPU, ``-lv 4``) on graphs the estimate is low for: never below it, and above it by at
    most one logits tensor and llama.cpp's MiB flooring. On main the plan was the estimate alone:
    MLA 8.50 MiB against 12.01 reported, DSA 8.50 against 63.82, DeepSeek-V4 8.50 against 14.19."""
    name, options, args, ub = CASES[case]
    path = synth_model(name)
    vanilla = _servers(plan_for_verify(path, options, free=ROOMY))[Role.VANILLA]
    config = ServerConfig(model=path, ctx_size=options.ctx_size, extra_args=["--fit", "off", "-lv", "4", *args])
    with LlamaServer(config) as srv:
        reported = _reported_compute(Path(srv.log_path).read_text())
    planned = vanilla.gpus[0].compute / MIB
    assert len(reported) == 1, reported
    assert reported[0] - 0.005 <= planned <= reported[0] + _logits_bound(path, ub, 1) + 1.01, (case, planned, reported)
    assert vanilla.compute.source is Source.LLAMA_CPP and vanilla.compute.main == vanilla.gpus[0].compute


@pytest.mark.parametrize("name", ["tiny-deepseek2", "tiny-deepseek4"])
def test_mtp_server_is_never_under_what_llama_server_reserves(synth_model, name):
    """The MTP server's two compute buffers (main context; draft context, whose estimate is 1.7x
    low on these graphs: 6.50 MiB against 11.01 and 11.26) against its own report; the main one
    is projected with the vanilla server's flags (llama-fit-params has no --spec-type: it is the
    same context). The plan's table and JSON say where each came from."""
    path = synth_model(name)
    plan = plan_for_verify(path, VerifyOptions(draft_n_max=3), free=ROOMY)
    servers = _servers(plan)
    van, mtp = servers[Role.VANILLA], servers[Role.MTP]
    config = ServerConfig(model=path, draft_mtp=True, draft_n_max=3, extra_args=["--fit", "off", "-lv", "4"])
    with LlamaServer(config) as srv:
        main, draft = _reported_compute(Path(srv.log_path).read_text())[:2]
    assert main - 0.005 <= mtp.compute.main / MIB <= main + _logits_bound(path, 512, 4) + 1.01, (mtp.compute, main)
    assert draft - 0.005 <= mtp.compute.draft / MIB, (mtp.compute, draft)
    assert mtp.compute.main == van.compute.main and mtp.gpus[0].compute == mtp.compute.main + mtp.compute.draft
    asked = mtp.projected.projection if mtp.projected is not None else None
    assert asked is not None and asked.flags[:2] == ("--fit", "off")
    d = mtp.to_dict()
    assert d["compute"]["source"] == "llama.cpp" and d["compute"]["draft_source"] == "llama.cpp"
    assert str(path.parent) not in str(d["llama_cpp_projection"])  # no local path in the record
    assert "compute: main context llama.cpp's projection" in plan.format()


def test_a_calibrated_graph_keeps_the_estimate_with_the_tool_present(synth_model):
    """qwen35moe: the plan is the estimate, as on main, though llama-fit-params is built; its
    projection (every token of the physical batch an output) is not asked. At a real vocabulary it
    over-states by a logits tensor: 501 MiB projected against 76.02 reported at Qwen3.6's 248,320
    tokens."""
    assert runtime.find_binary(FIT_PARAMS_TOOL).is_file()
    path = synth_model("tiny-qwen35moe")
    facts = ModelFacts.read(path)
    servers = _servers(plan_for_verify(path, VerifyOptions(draft_n_max=3), free=ROOMY))
    for role, outputs in ((Role.VANILLA, 1), (Role.MTP, 4)):
        s = servers[role]
        draft = compute_estimate(facts, 512, 4096, 1, draft=True) if role is Role.MTP else 0
        assert s.compute.main == compute_estimate(facts, 512, 4096, outputs) and s.compute.draft == draft, s.compute
        assert s.gpus[0].compute == s.compute.main + draft and s.compute.source is Source.ESTIMATE
        assert s.projected is None and "calibrated for qwen35moe" in s.compute.note


def _fake_runtime(root: Path, with_fit_params: bool) -> Path:
    """A runtime cache whose bin dir holds the real runtime's binaries (links), with or without
    llama-fit-params: what a runtime built before ggufmtp used the tool looks like."""
    real = runtime.installed_runtime()
    assert real is not None, "the runtime is not built: run `make test`"
    rt = runtime.runtime_dir(real.variant).relative_to(runtime.cache_root())
    bin_dir = root / rt / "bin"
    bin_dir.mkdir(parents=True)
    (root / rt / runtime.RUNTIME_JSON).write_bytes((real.bin_dir.parent / runtime.RUNTIME_JSON).read_bytes())
    names = [*RUNTIME_BINARIES, *(n for n in EXTRA_BINARIES if with_fit_params or n != FIT_PARAMS_TOOL)]
    for item in real.bin_dir.iterdir():
        if item.name in names or item.name.startswith("lib"):
            (bin_dir / item.name).symlink_to(item)
    return bin_dir


def test_a_runtime_without_llama_fit_params_falls_back_to_the_estimate(synth_model, tmp_path, monkeypatch):
    """A runtime built before ggufmtp used llama-fit-params keeps working: the plan is the
    estimate's, with a note that says how to add the tool; nothing is built meanwhile."""
    path = synth_model("tiny-deepseek2")
    bin_dir = _fake_runtime(tmp_path / "cache", with_fit_params=False)
    monkeypatch.setenv(runtime.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv(runtime.ENV_BIN, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no llama-fit-params elsewhere either
    plan = plan_for_verify(path, VerifyOptions(), free=ROOMY)
    for s in _servers(plan).values():
        assert s.compute.source is Source.ESTIMATE and "ggufmtp runtime build" in s.compute.note, s.compute
        assert "the estimate is low for deepseek2 graphs" in s.compute.note
    assert "compute: main context estimated (llama-fit-params is not built" in plan.format()
    assert not (bin_dir / FIT_PARAMS_TOOL).exists()  # not built by the plan


def _stub(folder: Path, body: str) -> Path:
    """A llama-fit-params that misbehaves as ``body`` says (a shell script), in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / FIT_PARAMS_TOOL
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.mark.parametrize(("body", "says"), [
    ("echo 'error: invalid argument: -x' >&2; exit 3", "exit status 3"),
    ("echo 'CUDA0 12 oops'; exit 0", "printed no memory projection"),
])
def test_a_failing_llama_fit_params_is_a_note_not_an_error(tmp_path, monkeypatch, body, says):
    model = tmp_path / "models" / "m.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF")
    monkeypatch.setenv(runtime.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv(runtime.ENV_BIN, str(_stub(tmp_path / "bin", body).parent))
    got = project_memory(model, ["-c", "4096"])
    assert got.projection is None and says in got.note and "m.gguf" in got.note, got
    assert str(tmp_path) not in got.note  # the note may reach a receipt: no local path


def test_a_projection_is_asked_once_per_model_flags_and_binary(tmp_path, monkeypatch):
    """A ladder plans every arm against one source model: one run of the tool for the same file,
    flags and binary; a changed file or other flags ask again."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    calls = tmp_path / "calls"
    monkeypatch.setenv(runtime.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv(runtime.ENV_BIN, str(_stub(tmp_path / "bin", f"echo x >> {calls}; echo 'Host 5 6 7'").parent))
    for _ in range(2):
        got = project_memory(model, ["-c", "4096"])
        assert got.projection is not None and got.projection.host.compute_mib == 7
    assert calls.read_text().count("x") == 1
    project_memory(model, ["-c", "8192"])
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    project_memory(model, ["-c", "4096"])
    assert calls.read_text().count("x") == 3


def test_sizing_flags_and_the_physical_batch():
    """Only the flags that size memory reach llama-fit-params, values kept, in order."""
    args = ["--temp", "0.5", "-ub", "256", "--metrics", "-fa", "on", "--swa-full", "--ctx-size=8192", "-ts", "3,1",
            "--spec-draft-n-max", "4", "-cmoe"]
    assert sizing_flags(args) == ["-ub", "256", "-fa", "on", "--swa-full", "--ctx-size=8192", "-ts", "3,1", "-cmoe"]
    assert ubatch_of(["-ub", "1024"]) == 1024 and ubatch_of(["-ub", "1024", "-b", "256"]) == 256 and ubatch_of([]) == 512


def test_fit_print_per_device_and_its_bound():
    """Two GPUs: each device's compute MiB + 1 (the figures are floored); a projection of another
    device count (a CPU build's Host only) puts its figure on the output layer's GPU; a GPU that
    holds nothing of the server gets nothing."""
    gpus, host = parse_fit_print("CUDA0 100 20 300\nCUDA1 90 20 200\nHost 1000 0 12\n")
    assert [g.device for g in gpus] == ["CUDA0", "CUDA1"] and host.compute_mib == 12
    two = Projection(gpus, host, ())
    assert projected_compute(two, 2, 1) == [301 * MIB, 201 * MIB]
    assert projected_compute(two, 1, 0) == [501 * MIB]
    assert projected_compute(Projection((), host, ()), 2, 1) == [0, 13 * MIB]
    idle = Projection((gpus[0], DeviceFigures("CUDA1", 0, 0, 0)), host, ())
    assert projected_compute(idle, 2, 0) == [301 * MIB, 0]
    with pytest.raises(ValueError):
        parse_fit_print("CUDA0 100 20 300\n")  # no Host line: not the tool's output


def test_the_policy_per_device_and_per_architecture():
    """Uncalibrated graph on two GPUs: each device the larger of the estimate (on the output
    layer's GPU) and the projection; the draft context at least the largest projected buffer. A
    calibrated graph keeps the estimate whatever a projection says; a missing one leaves the
    estimate with the tool's note and that it is low."""
    host = DeviceFigures("Host", 0, 0, 0)
    two = Projected(Projection((DeviceFigures("CUDA0", 9, 1, 40), DeviceFigures("CUDA1", 9, 1, 10)), host, ()))
    main, f = planned_compute("glm-dsa", 20 * MIB, 5 * MIB, two, 2, 1)
    assert main == [41 * MIB, 20 * MIB] and f.main == 61 * MIB and f.draft == 41 * MIB
    assert (f.source, f.draft_source) == (Source.LLAMA_CPP, Source.LLAMA_CPP) and "upper bound" in f.note
    main, f = planned_compute("deepseek2", 90 * MIB, 50 * MIB, two, 2, 1)  # the estimate already above
    assert main == [41 * MIB, 90 * MIB] and f.draft == 50 * MIB and f.draft_source is Source.ESTIMATE
    main, f = planned_compute("qwen35moe", 20 * MIB, 5 * MIB, two, 2, 1)
    assert main == [0, 20 * MIB] and (f.main, f.draft, f.source) == (20 * MIB, 5 * MIB, Source.ESTIMATE)
    main, f = planned_compute("deepseek4", 20 * MIB, 0, Projected(None, "m.gguf: exit status 3"), 1, 0)
    assert main == [20 * MIB] and f.source is Source.ESTIMATE
    assert f.note == "m.gguf: exit status 3; the estimate is low for deepseek4 graphs"


@pytest.mark.runtime
def test_a_real_failure_of_llama_fit_params_falls_back(tmp_path):
    """The real tool, refusing a flag value: the answer is a note with its exit status."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    got = project_memory(model, ["-ctk", "no-such-type"])
    assert got.projection is None and "exit status" in got.note, got


@pytest.mark.runtime
def test_an_older_runtime_gets_llama_fit_params_with_its_library(tmp_path, monkeypatch):
    """`ggufmtp runtime build` on a runtime built before ggufmtp used llama-fit-params builds that
    one target (in the cached build folder: up to date, seconds) and installs it with the shared
    library it links (libllama-fit-params-impl.so): the binary then runs from the runtime's bin dir."""
    real = runtime.installed_runtime()
    assert real is not None, "the runtime is not built: run `make test`"
    cache = tmp_path / "cache"
    bin_dir = _fake_runtime(cache, with_fit_params=False)
    (bin_dir / "libllama-fit-params-impl.so").unlink(missing_ok=True)  # what an older runtime lacks
    for folder in ("build", "src"):  # the real build folder and source tree: nothing to configure or compile
        (cache / folder).symlink_to(runtime.cache_root() / folder)
    monkeypatch.setenv(runtime.ENV_CACHE, str(cache))
    info = runtime.installed_runtime()
    assert info is not None and info.bin_dir == bin_dir
    exe = runtime.ensure_extra_binary(info, FIT_PARAMS_TOOL)
    assert exe == bin_dir / FIT_PARAMS_TOOL and (bin_dir / "libllama-fit-params-impl.so").is_file()
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--fit-print" in proc.stdout + proc.stderr, proc.stderr[-500:]
