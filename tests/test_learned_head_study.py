"""benchmarks/learned_head_study.py (issue #29) cannot rot: its plan, its paired statistics and its
tables from canned arm JSONs. Nothing here starts llama.cpp or a ggufmtp subprocess."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "learned_head_study.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("learned_head_study", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def test_dry_run_plans_every_part(study, tmp_path, capsys):
    assert study.main(["model.gguf", "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "52 arms, 19 distinct quantizations" in out
    for arm in ("head--bf16", "head--iq2_xxs", "head--untrained", "imatrix--q4_k-trunk", "imatrix--iq3_xxs-trunk ",
                "imatrix--iq2_xxs-trunk-fallback-q4_0", "trunk--q3_k_m", "window--k6", "template--chat-raw",
                "kv--d768-q4_0-q8_0"):
        assert arm in out
    assert out.count("(expects a refusal)") == 2  # IQ3_XXS and IQ2_XXS on a trunk-only imatrix
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_kv_cells_put_the_reference_and_single_axis_cells_first(study):
    cells = study.kv_cells(["f16", "q8_0", "q4_0"], ["f16", "q8_0", "q4_0"])
    assert cells[:5] == [("f16", "f16"), ("q8_0", "f16"), ("q4_0", "f16"), ("f16", "q8_0"), ("f16", "q4_0")]
    assert len(cells) == 9


def _requests(prompts: dict[str, tuple[int, int]], mtp_ms: float = 10.0, vanilla_ms: float = 20.0,
              endpoint: str = "chat") -> list[dict]:
    """Per prompt (drafted, accepted): one MTP and one vanilla request of 32 tokens each."""
    out = []
    for pid, (drafted, accepted) in prompts.items():
        out.append({"arm": "mtp", "k": 3, "endpoint": endpoint, "mode": "default", "prompt_id": pid, "seed": 42,
                    "predicted_n": 32, "predicted_ms": mtp_ms, "draft_n": drafted, "draft_n_accepted": accepted})
        out.append({"arm": "vanilla", "k": 3, "endpoint": endpoint, "mode": "default", "prompt_id": pid, "seed": 42,
                    "predicted_n": 32, "predicted_ms": vanilla_ms, "draft_n": None, "draft_n_accepted": None})
    return out


def test_paired_difference_by_prompt(study):
    ids = [f"p{i}" for i in range(12)]
    a = study.per_prompt(_requests({p: (20, 10) for p in ids}))
    b = study.per_prompt(_requests({p: (20, 15) for p in ids}, mtp_ms=5.0))
    assert a["p0"] == [20, 10, 32, 10.0, 32, 20.0, 1]
    p = study.paired(a, b)
    assert p["n_prompts"] == 12
    assert p["acceptance_diff"] == pytest.approx(0.25)
    assert p["acceptance_diff_ci95"] == [pytest.approx(0.25), pytest.approx(0.25)]
    assert p["speedup_ratio"] == pytest.approx(2.0)  # MTP twice as fast, vanilla the same
    # only shared prompts are paired
    assert study.paired(a, study.per_prompt(_requests({"p0": (10, 5), "zz": (10, 5)})))["n_prompts"] == 1
    assert study.per_prompt(_requests({"p0": (1, 1)}, endpoint="raw"), endpoint="chat") == {}


def _arm(part: str, key: str, label: dict, *, acc: float, speedup: float, prompts: dict, ref: str | None = None,
         status: str = "ok", views: list | None = None, **extra) -> dict:
    pp = study_per_prompt(prompts)
    d = {"part": part, "arm": key, "label": label, "ref": ref, "status": status,
         "artifact": {"name": f"{part}-{key}", "size_bytes": 1_000_000, "head_bytes": 250_000,
                      "head_types": {"Q4_K": 11, "F32": 9}, "trunk_types": {"Q4_K": 900, "Q6_K": 100}, "bpw": 4.9,
                      "trunk_digest": "ab" * 32},
         "kld": {"kld_mean": 0.0123, "kld_mean_err": 0.0004, "same_top_p": 0.95, "ln_ppl_ratio": 0.01},
         "views": views or [{"endpoint": "chat", "mode": "default", "acceptance": acc, "acceptance_ci95": [acc - 0.02, acc + 0.02],
                             "speedup": speedup, "speedup_ci95": [speedup - 0.1, speedup + 0.1],
                             "mean_acceptance_length": 2.5, "acceptance_by_position": [0.8, 0.6, 0.4],
                             "identical_output_fraction": 1.0, "vanilla_tokens_per_second": 500.0,
                             "mtp_tokens_per_second": 500.0 * speedup}],
         "per_prompt": {"chat/default": pp}, "thinking_modes": ["default"], "chat_template_sha256": "cd" * 32}
    d.update(extra)
    return d


def study_per_prompt(prompts: dict) -> dict:
    return {p: [d, a, 32, 10.0, 32, 20.0, 1] for p, (d, a) in prompts.items()}


def test_tables_from_canned_arms(study, tmp_path):
    out = tmp_path / "out"
    arms = out / "arms"
    arms.mkdir(parents=True)
    ids = [f"p{i}" for i in range(10)]
    canned = [
        _arm("head", "bf16", {"head": "BF16", "trunk": "Q4_K_M", "imatrix": "MTP"}, acc=0.70, speedup=1.3,
             prompts={p: (30, 21) for p in ids}),
        _arm("head", "q4_k", {"head": "Q4_K", "trunk": "Q4_K_M", "imatrix": "MTP"}, acc=0.60, speedup=1.2,
             prompts={p: (30, 18) for p in ids}, ref="bf16"),
        _arm("imatrix", "iq2_xxs-trunk", {"head": "IQ2_XXS", "imatrix": "trunk-only", "what": "refused"}, acc=0,
             speedup=0, prompts={}, status="refused",
             error="exit 1: error: 11 tensor(s) planned as a type that needs an imatrix, but im.gguf has no "
                   "statistics for them"),
        _arm("template", "chat-raw", {"endpoints": "chat + raw", "suite": "the study's suite"}, acc=0.7, speedup=1.3,
             prompts={p: (30, 21) for p in ids},
             views=[{"endpoint": "chat", "mode": "default", "acceptance": 0.7, "acceptance_ci95": [0.68, 0.72],
                     "speedup": 1.3, "speedup_ci95": [1.2, 1.4], "identical_output_fraction": 1.0},
                    {"endpoint": "raw", "mode": "default", "acceptance": None, "acceptance_ci95": [None, None],
                     "speedup": 1.0, "speedup_ci95": [1.0, 1.0], "identical_output_fraction": 1.0}]),
    ]
    canned[-1]["per_prompt"]["raw/default"] = {p: [0, 0, 1, 0.001, 1, 0.001, 1] for p in ids}
    for d in canned:
        (arms / f"{d['part']}--{d['arm']}.json").write_text(json.dumps(d))
    assert study.main(["model.gguf", "--out", str(out), "--tables-only", "--parts", "head,imatrix,template"]) == 0
    md = (out / "study.md").read_text()
    assert "| BF16 | Q4_K_M | Q4_K x11 | 250.00 kB | 1.00 MB | 70.0% [68.0, 72.0%] | - |" in md
    assert "| Q4_K | Q4_K_M | Q4_K x11 | 250.00 kB | 1.00 MB | 60.0% [58.0, 62.0%] | -10.0 pt [-10.0, -10.0] |" in md
    assert "refused: 11 tensor(s) planned as a type that needs an imatrix" in md
    assert "| Q5_K | Q4_K_M | - | - | - | not run |" in md  # planned, never measured: still a row
    assert "not measurable on this model" in md and "no decoding to time" in md
    doc = json.loads((out / "study.json").read_text())
    assert [r["arm"] for r in doc["parts"]["head"]][:3] == ["bf16", "q8_0", "q6_k"]
    q4 = next(r for r in doc["parts"]["head"] if r["arm"] == "q4_k")
    assert q4["paired"]["chat/default"]["acceptance_diff"] == pytest.approx(-0.1)
    assert doc["facts"]["needs_imatrix_types"] == ["IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_XXS"]
