"""#49 item 6, the publisher's GPU: the memory plan of a verification (ggufmtp.runtime.memory)
against designed numbers and against what the pinned llama-server reports, the refusal before any
work when a phase does not fit, and partial offload (--n-cpu-moe) on every arm."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import VerifyError
from ggufmtp.gguf.reader import read_header, tensor_nbytes
from ggufmtp.measure.core.options import ServerOptions
from ggufmtp.runtime.kv_layout import Cells, cells_per_stream
from ggufmtp.runtime.memory import (
    COMPUTE_TOLERANCE,
    FREE_MEMORY_ENV,
    MIB,
    ModelFacts,
    PlanInputs,
    Role,
    ServerSpec,
    compute_estimate,
    gpu_free,
    plan_memory,
    server_memory,
)
from ggufmtp.runtime.offload import Offload
from ggufmtp.runtime.server import LlamaServer, ServerConfig
from ggufmtp.synth.archs.registry import arch_names
from ggufmtp.synth.builtin import BUILTIN_MODELS

# tiny-qwen35moe (ggufmtp.synth): 5 blocks, blk.4 the MTP block, layers 0-2 Gated DeltaNet, layer 3
# full attention (1 KV head of 128), conv kernel 4, inner 256, state 128, 1 group, BF16 matrices.
KV_LAYER = 4096 * (128 + 128) * 2  # cells x (K + V) x f16
RS_ROW = ((4 - 1) * (256 + 2 * 1 * 128) + 128 * 256) * 4  # conv state + SSM state, F32


def _bytes(path: Path) -> dict[str, int]:
    return {t.name: tensor_nbytes(t.shape, t.type_id)[1] for t in read_header(path).tensors}


def test_weights_are_placed_as_llama_cpp_places_them(tiny_mtp_model):
    """Full offload: every tensor on the GPU but token_embd (the input layer); the vanilla server
    does not load the MTP block. --n-cpu-moe 2 moves layers 0-1's experts to host memory; -ngl 2
    keeps only the last layer (the MTP block) and the output layer on the GPU."""
    sizes, facts = _bytes(tiny_mtp_model), ModelFacts.read(tiny_mtp_model)
    embd = sizes["token_embd.weight"]
    mtp_block = sum(b for n, b in sizes.items() if n.startswith("blk.4."))
    total = sum(sizes.values())
    van = server_memory(ServerSpec(Role.VANILLA, facts, mtp=False), [10**12])
    mtp = server_memory(ServerSpec(Role.MTP, facts, mtp=True, draft_n_max=4), [10**12])
    assert (van.gpus[0].weights, van.host_weights) == (total - embd - mtp_block, embd)
    assert (mtp.gpus[0].weights, mtp.host_weights) == (total - embd, embd)
    exps01 = sum(b for n, b in sizes.items() if re.match(r"blk\.[01]\.ffn_(gate|up|down)_exps", n))
    assert exps01 == 2 * 3 * 524288  # designed: 3 expert tensors of 256x256x4 BF16 per layer
    moe = server_memory(ServerSpec(Role.MTP, facts, mtp=True, offload=Offload(n_cpu_moe=2)), [10**12])
    assert (moe.gpus[0].weights, moe.host_weights) == (total - embd - exps01, embd + exps01)
    last = server_memory(ServerSpec(Role.MTP, facts, mtp=True, gpu_layers=2), [10**12])
    out_layer = sizes["output.weight"] + sizes["output_norm.weight"]
    assert last.gpus[0].weights == mtp_block + out_layer


def test_kv_and_recurrent_state_are_designed_numbers(tiny_mtp_model):
    """The attention layer's KV cache (and the draft context's, for the MTP block) and the three
    recurrent layers' state, one row per slot, 1 + k rows on the MTP server (rollback)."""
    facts = ModelFacts.read(tiny_mtp_model)
    van = server_memory(ServerSpec(Role.VANILLA, facts, mtp=False), [10**12]).gpus[0]
    mtp = server_memory(ServerSpec(Role.MTP, facts, mtp=True, draft_n_max=4), [10**12]).gpus[0]
    assert (van.kv, van.recurrent) == (KV_LAYER, 3 * RS_ROW)
    assert (mtp.kv, mtp.recurrent) == (2 * KV_LAYER, 3 * 5 * RS_ROW)
    q8 = server_memory(ServerSpec(Role.VANILLA, facts, mtp=False, cache_type_k="q8_0", cache_type_v="q8_0",
                                  ctx_size=8192), [10**12]).gpus[0]
    assert q8.kv == 8192 * (128 + 128) // 32 * 34


def _reported(log: str, what: str) -> list[float]:
    return [float(x) for x in re.findall(rf"{what} buffer size =\s*([\d.]+) MiB", log)]


@pytest.mark.parametrize("name", ["tiny-qwen35moe", "tiny-glm4moe"])
def test_plan_matches_what_llama_server_reports(synth_model, name):
    """The pinned llama-server's own report on CPU: KV and recurrent state to its 0.01 MiB
    rounding; each context's compute buffer within the documented tolerance."""
    path = synth_model(name)
    facts = ModelFacts.read(path)
    with LlamaServer(ServerConfig(model=path, draft_mtp=True, draft_n_max=4, extra_args=["-lv", "4"])) as srv:
        log = Path(srv.log_path).read_text()
    kv, rs, compute = _reported(log, "KV"), _reported(log, "RS"), _reported(log, "compute")
    spec = ServerSpec(Role.MTP, facts, mtp=True, draft_n_max=4)
    mem = server_memory(spec, [10**12]).gpus[0]
    assert abs(sum(kv) - mem.kv / MIB) < 0.02 and abs(sum(rs) - mem.recurrent / MIB) < 0.02, (kv, rs, mem)
    target, draft = compute[0], compute[1]
    est = (compute_estimate(facts, 512, spec.cells, 5) / MIB, compute_estimate(facts, 512, spec.cells, 1, True) / MIB)
    for got, want in zip(est, (target, draft), strict=True):
        assert abs(got - want) <= COMPUTE_TOLERANCE * want, (name, est, target, draft)


#: every architecture synth writes with an MTP block, by its built-in tiny model ("tiny-<arch>")
MTP_MODELS = {spec.arch: name for name, spec in BUILTIN_MODELS.items() if name == f"tiny-{spec.arch}"}
#: the pinned llama.cpp loads GLM5-Next's NextN block but has no graph to draft with: vanilla only
NO_MTP_GRAPH = frozenset({"glm5-next"})
#: (ctx, slots, physical batch, KV type): llama-server's defaults as ggufmtp starts it, and a second
#: setting that moves every term (cells per slot, the window's ubatch rounding, streams, row bytes)
SETTINGS = {"defaults": (4096, 1, 512, None), "c8192-np2-ub256-q8_0": (8192, 2, 256, "q8_0")}


def test_every_mtp_architecture_has_a_tiny_model_in_the_check():
    assert set(MTP_MODELS) == set(arch_names()) - {"llama"}  # llama: synth writes it without MTP only


def test_cache_cells_per_layout_are_designed_numbers():
    """llama-kv-cache-iswa.cpp: pad256(min(n_ctx_seq, n_swa + ubatch)); DSV4: pad256(ceil(n / ratio))."""
    assert cells_per_stream(Cells.CONTEXT, 4096, 32, 512) == 4096
    assert cells_per_stream(Cells.WINDOW, 4096, 32, 512) == 768 and cells_per_stream(Cells.WINDOW, 4096, 32, 256) == 512
    assert cells_per_stream(Cells.WINDOW, 256, 4096, 512) == 256  # never more than the context
    assert cells_per_stream(Cells.CSA, 4096, 0, 512) == 1024 and cells_per_stream(Cells.HCA, 4096, 0, 512) == 256


def _reported_sum(log: str, *what: str) -> tuple[float, int]:
    """The MiB of every buffer the log reports of the kinds ``what``, and how many (each printed to 0.01)."""
    found = [x for w in what for x in _reported(log, w)]
    return sum(found), len(found)


@pytest.mark.runtime
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("arch", sorted(MTP_MODELS))
def test_kv_and_state_match_llama_server_for_every_layout(synth_model, arch, setting):
    """Per architecture (plain GQA, hybrid recurrent, MLA, DSA, SWA, DeepSeek-V4's compressed
    caches, GLM5-Next's hybrid indexer): the vanilla and the MTP server's KV caches (the draft
    context's included) and recurrent/compressor states, as the plan has them, against the pinned
    llama-server's own report on CPU, to the 0.01 MiB it prints per buffer."""
    ctx, slots, ub, kv_type = SETTINGS[setting]
    path = synth_model(MTP_MODELS[arch])
    facts = ModelFacts.read(path)
    for mtp in (False,) if arch in NO_MTP_GRAPH else (False, True):
        config = ServerConfig(model=path, draft_mtp=mtp, draft_n_max=3 if mtp else None, ctx_size=ctx, parallel=slots,
                              cache_type_k=kv_type, cache_type_v=kv_type, extra_args=["-lv", "4", "-ub", str(ub)])
        with LlamaServer(config) as srv:
            log = Path(srv.log_path).read_text()
        spec = ServerSpec(Role.MTP if mtp else Role.VANILLA, facts, mtp=mtp, ctx_size=ctx, parallel=slots,
                          cache_type_k=kv_type, cache_type_v=kv_type, draft_n_max=3 if mtp else 0, ubatch=ub)
        mem = server_memory(spec, [10**12]).gpus[0]
        (kv, n_kv), (state, n_state) = _reported_sum(log, "KV"), _reported_sum(log, "RS", r"DSV4 \w+ state")
        assert n_kv and abs(kv - mem.kv / MIB) <= 0.005 * n_kv + 1e-9, (arch, mtp, kv, mem.kv / MIB)
        assert abs(state - mem.recurrent / MIB) <= 0.005 * n_state + 1e-9, (arch, mtp, state, mem.recurrent / MIB)


def test_phases_and_what_would_fit(tiny_mtp_model, synth_model):
    """The reference alone in its phase; main = vanilla + MTP + default vanilla. With room for the
    main phase but not with its default-vanilla arm, the advice names dropping that arm."""
    facts = ModelFacts.read(tiny_mtp_model)
    inputs = PlanInputs(variant=facts, reference=ModelFacts.read(synth_model("tiny-qwen35moe-f20")),
                        default_vanilla=True)
    roomy = plan_memory(inputs, [10**12])
    assert [(p.name, [s.role for s in p.servers]) for p in roomy.phases] == [
        ("reference", [Role.REFERENCE]), ("main", [Role.VANILLA, Role.MTP, Role.DEFAULT_VANILLA])]
    assert roomy.fits is True and roomy.to_dict()["phases"][1]["fits"] is True
    main = roomy.phases[1]
    two_arms = main.need[0] - main.servers[2].gpu_total
    tight = plan_memory(inputs, [two_arms + MIB])
    assert tight.fits is False and tight.phases[0].fits is True
    assert any("no default-vanilla arm" in a for a in tight.advice), tight.advice
    with pytest.raises(VerifyError, match="main phase .* Would fit: .*default-vanilla"):
        tight.refuse_unless_fits("serving")
    assert plan_memory(inputs, None).fits is None  # no GPU: informational


def test_free_memory_from_the_environment():
    assert gpu_free({FREE_MEMORY_ENV: "81920,24576"}) == ((81920 * MIB, 24576 * MIB), f"${FREE_MEMORY_ENV}")
    with pytest.raises(VerifyError, match=FREE_MEMORY_ENV):
        gpu_free({FREE_MEMORY_ENV: "lots"})


def test_fit_is_refused_and_offload_reaches_every_arms_base():
    """--fit in any arm's flags is refused (it would size each arm to the memory free at its
    start); every arm's base starts with --fit off and the partial offload."""
    for field in ("server_args", "mtp_server_args", "vanilla_server_args", "extra_args"):
        with pytest.raises(VerifyError, match="--fit"):
            ServerOptions(**{field: ("--fit", "on")})
    base = ServerOptions(n_cpu_moe=3, override_tensor=("exps=CPU",)).base_fields(model="m.gguf")
    assert base["extra_args"][:6] == ["--fit", "off", "--override-tensor", "exps=CPU", "--n-cpu-moe", "3"]
    with pytest.raises(VerifyError, match="PATTERN=BUFFER_TYPE"):
        ServerOptions(override_tensor=("exps",))


def _cli(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)


def test_verify_refuses_before_serving_when_a_phase_does_not_fit(tiny_mtp_model, tmp_path):
    out = tmp_path / "v.json"
    r = _cli("verify", str(tiny_mtp_model), "--limit", "1", "-o", str(out), env={FREE_MEMORY_ENV: "64"})
    assert r.exit_code != 0
    assert "GPU memory: the main phase" in r.output and "refused before serving" in r.output
    assert "Traceback" not in r.output and not out.exists()


def test_run_refuses_before_quantizing(tiny_mtp_model, tmp_path):
    out = tmp_path / "out"
    r = _cli("run", "-r", "q8_0-mtp", "-m", str(tiny_mtp_model), "-o", str(out), env={FREE_MEMORY_ENV: "64"})
    assert r.exit_code != 0 and "refused before quantizing" in r.output, r.output
    assert not list(out.glob("*.gguf")) and not list(out.glob("*.receipt.json"))


def test_n_cpu_moe_reaches_every_arm_and_the_receipt(tiny_mtp_model, synth_model, tmp_path):
    """A real verify with --n-cpu-moe 1 and a default-vanilla arm (--server-arg): the flag is on the
    vanilla, MTP and default-vanilla command lines, in the settings and the memory plan."""
    out = tmp_path / "v.json"
    r = _cli("verify", str(tiny_mtp_model), "--n-cpu-moe", "1", "--server-arg", "-b 512", "--limit", "1",
             "--seeds", "42", "--max-tokens", "8", "--reference", str(synth_model("tiny-qwen35moe-f20")),
             "-o", str(out), "--json", env={FREE_MEMORY_ENV: "1000000"})
    d = json.loads(out.read_text())
    for args in (d["vanilla"]["server_args"], d["mtp"]["server_args"], d["default_vanilla"]["server_args"]):
        i = args.index("--n-cpu-moe")
        assert args[i + 1] == "1" and args[args.index("--fit") + 1] == "off", args
    assert d["settings"]["offload"] == {"override_tensor": [], "cpu_moe": False, "n_cpu_moe": 1}
    phases = d["settings"]["memory"]["phases"]
    assert [p["name"] for p in phases] == ["reference", "main"] and d["settings"]["memory"]["fits"] is True
    assert r.exit_code in (0, 1)
