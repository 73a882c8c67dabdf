"""Model cards: built from the receipt; sections without data are left out, never placeholders."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.provenance.card import UNVERIFIED_HEADING, card_text

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "receipts" / "tiny-qwen35moe-0fef400b9589-hifi-q4_k_m-mtp.gguf.receipt.json"


def statement():
    return json.loads(REF.read_text())


def test_verified_card_has_claim_tables_and_provenance():
    st = statement()
    meta, body = card_text(st)
    assert set(meta["tags"]) >= {"gguf", "llama.cpp", "mtp", "speculative-decoding"}
    v = st["predicate"]["verification"]
    assert f"{100 * v['mtp']['acceptance']:.1f}%" in body and "95% CI" in body
    assert "| code |" in body and "Per seed:" in body
    assert "--spec-type draft-mtp --spec-draft-n-max 4" in body and "/v1/chat/completions" in body
    assert st["subject"][0]["digest"]["sha256"] in body and st["predicate"]["recipe"]["sha256"] in body
    assert "Draft window" not in body and "Serving profiles" not in body and "Speedup versus" not in body


def test_unverified_card_leaves_sections_out():
    st = statement()
    st["predicate"]["verification"] = None
    meta, body = card_text(st)
    for absent in ("One-line claim", "## Measured", "Per seed", "None", "n/a", "TODO"):
        assert absent not in body, absent
    assert "## Provenance" in body and "## How to run" in body


def test_curve_and_profiles_rendered_when_present():
    st = statement()
    curve = json.loads((ROOT / "benchmarks/gpu/results-2026-11-21-h200/curve.json").read_text())
    st["predicate"]["verification"]["acceptance_curve"] = curve
    st["predicate"]["verification"]["profiles"] = {"decision_table": [
        {"workload": "C", "title": "contention", "shape": "2048 in / 512 out, 16 concurrent",
         "vanilla_tokens_per_second": 900.0, "mtp_tokens_per_second": 700.0, "mtp_helps": "no",
         "reasoning": "-22% throughput"}]}
    _, body = card_text(st)
    assert "Break-even acceptance: 41.9%" in body and "| C contention |" in body


def test_card_cli_writes_valid_yaml(tmp_path):
    art = tmp_path / "tiny-qwen35moe-0fef400b9589-hifi-q4_k_m-mtp.gguf"
    art.write_bytes(b"")
    out = tmp_path / "README.md"
    r = CliRunner().invoke(main, ["card", str(art), "--receipt", str(REF), "-o", str(out), "--license", "apache-2.0"])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    meta = yaml.safe_load(text.split("---")[1])
    assert meta["license"] == "apache-2.0" and meta["pipeline_tag"] == "text-generation"


def test_tuned_verification_and_bandwidth_from_the_h200_run():
    """The H200 run's tuned verify and profiles, as the receipt holds them, render into the card."""
    res = ROOT / "benchmarks/gpu/results-2026-11-21b-h200"
    v = json.loads((res / "verify-tuned.json").read_text())
    v.pop("requests", None)
    prof = json.loads((res / "profiles.json").read_text())
    st = statement()
    st["predicate"]["verification"] = {**v, "profiles": prof}
    _, body = card_text(st)
    assert "MTP arm run with the tuned flags `--spec-draft-n-max 3 --spec-draft-n-min 0 -bs" in body
    bw = v["bandwidth"]
    assert f"limit {bw['limit_tokens_per_second']:,.0f} tok/s at 4.80 TB/s" in body
    assert f"vanilla {bw['fraction_of_limit']['vanilla'] * 100:.1f}%" in body
    assert "| A single decode |" in body and "| B prefill-bound |" in body
    assert "--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-n-min 0 -bs --spec-draft-backend-sampling\n" in body


def test_card_states_when_the_artifact_has_no_passing_verification_of_its_bytes():
    """A card says "Not verified" (what ``upload --allow-unverified`` requires) unless the receipt
    holds a passing verification of the artifact's own bytes."""
    def body_with(change) -> str:
        st = statement()
        v = st["predicate"]["verification"]
        v["model"]["sha256"] = st["subject"][0]["digest"]["sha256"]  # bound to the artifact
        change(st, v)
        return card_text(st)[1]

    assert UNVERIFIED_HEADING not in body_with(lambda st, v: None)
    cases = [
        (lambda st, v: v.update(verdict="fail", reasons=["acceptance 12.0 % is below the minimum 60.0 %"]),
         "its verification failed (verdict fail: acceptance 12.0 % is below the minimum 60.0 %)"),
        (lambda st, v: v["model"].pop("sha256"), "does not name the sha256 of the file it served"),
        (lambda st, v: v["model"].update(sha256="ab" * 32), f"served file has sha256 {'ab' * 32}"),
        (lambda st, v: st["predicate"].update(verification=None), "the receipt holds no runtime verification"),
    ]
    for change, reason in cases:
        body = body_with(change)
        assert UNVERIFIED_HEADING in body and reason in body, reason
        assert body.index(UNVERIFIED_HEADING) < body.index("## How to run")
        assert "One-line claim" not in body or body.index(UNVERIFIED_HEADING) < body.index("One-line claim")


def test_card_puts_the_fair_speedup_first_and_unknowns_as_n_a():
    st = statement()
    v = st["predicate"]["verification"]
    v["hardware"].update(offloaded=True, gpu="NVIDIA H100")  # a GPU run: the verdict judged the speed
    v.update(speedup=1.41, speedup_ci95=[1.38, 1.44], speedup_vs_default_vanilla=1.62,
             speedup_vs_default_vanilla_ci95=[1.58, 1.66],
             default_vanilla={"tokens_per_second": 210.7, "server_args": ["--ctx-size", "4096"], "label": "defaults"})
    v["vanilla"]["server_args"] = ["--ctx-size", "4096", "-bs"]
    v["mtp"]["server_args"] = ["--ctx-size", "4096", "-bs", "--spec-type", "draft-mtp"]
    v["mtp"]["mean_acceptance_length"] = 3.9
    v["mtp"]["acceptance_by_position"] = [0.9, 0.8, 0.7, 0.5]
    v["mtp"]["tokens_per_second"] = None
    _, body = card_text(st)
    claim = body.split("## One-line claim", 1)[1].split("##", 1)[0]
    assert claim.index("1.41×") < claim.index("1.62×") and "same non-speculative settings" in claim
    assert "against vanilla with llama-server's defaults" in claim and "mean acceptance length 3.90" in claim
    assert "| vs default vanilla |" in body and "Arms: vanilla `--ctx-size 4096 -bs`" in body
    assert "| overall |" in body and "| n/a |" in body and "| 0.0 |" not in body
    assert "acceptance by position (accepted at i / steps): 1: 90.0%" in body
    # without a default vanilla arm the label is absent
    st2 = statement()
    _, body2 = card_text(st2)
    assert "llama-server's defaults" not in body2.split("## How to run")[0]
