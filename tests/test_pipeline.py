"""ggufmtp run end to end, resume after a failure, input-keyed stage cache, the Python API."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client, write_keypair
from fs_clock import past_the_ctime_of

import ggufmtp
from ggufmtp.cli import main
from ggufmtp.errors import HubRefusedError
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.card import UNVERIFIED_HEADING
from ggufmtp.provenance.receipt import load_receipt, read_receipt, schema_errors
from ggufmtp.provenance.signing import verify_artifact, verify_receipt
from ggufmtp.synth.spec import SynthSpec

# the least a publishable verification measures (#28), so the pipeline can upload what it verified
VERIFY = ggufmtp.VerifyOptions(seeds=(42,), limit=8, max_tokens=64)
NO_VERIFY = ggufmtp.RunOptions(verify=False)
TOKEN = "hf_pipelineTOKEN42"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A local Hub (tests/fakehub.py) that ``run`` reaches through $HF_ENDPOINT, with a token."""
    isolate_hf_client(tmp_path / "hf_home", monkeypatch)
    for var in ("GGUFMTP_SIGNING_KEY", "GGUFMTP_PUBLIC_KEY"):
        monkeypatch.delenv(var, raising=False)
    with FakeHub(tokens=(TOKEN,)) as fh:
        monkeypatch.setenv("HF_ENDPOINT", fh.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield fh


def stages(res):
    return {s.stage: ("cached" if s.cached else "ran") for s in res.stages}


@pytest.mark.runtime
def test_run_end_to_end_then_fully_cached(tmp_path, fake):
    out = tmp_path / "out"
    priv, pub = write_keypair(tmp_path)
    signed = ggufmtp.RunOptions(verify_options=VERIFY, signing_key=priv)
    res = ggufmtp.run("builtin:tiny-qwen35moe", "hifi-q4_k_m-mtp", signed, out_dir=out, progress=False)
    assert set(stages(res).values()) == {"ran"}
    s = res.summary()
    assert s["mtp_status"] == "complete" and s["verdict"] == "pass"
    assert s["acceptance"] == pytest.approx(1.0) and len(s["acceptance_ci95"]) == 2
    st = load_receipt(res.receipt)
    assert schema_errors(st) == [] and st["predicate"]["verification"]["mtp"]["draft_n"] > 0
    assert st["predicate"]["base_model"]["source"]["type"] == "builtin"
    assert audit(res.artifact, res.receipt).ok
    card = res.card.read_text()
    assert "speculative-decoding" in card and "--spec-type draft-mtp" in card and st["subject"][0]["digest"]["sha256"] in card
    # signed: the receipt (DSSE, its verification included) and the artifact (model-signing's ARTIFACT.sig)
    assert read_receipt(res.receipt).signed
    verify_receipt(res.receipt, pub)
    verify_artifact(res.artifact, pub)
    again = ggufmtp.run("builtin:tiny-qwen35moe", "hifi-q4_k_m-mtp", signed, out_dir=out, progress=False)
    assert set(stages(again).values()) == {"cached"}
    # a passing, signed verification is published, signature included, checked against the public key
    up = ggufmtp.run("builtin:tiny-qwen35moe", "hifi-q4_k_m-mtp",
                     dataclasses.replace(signed, upload="me/tiny", public_key=pub, token=TOKEN), out_dir=out,
                     progress=False)
    assert stages(up)["upload"] == "ran" and stages(up)["verify"] == "cached"
    files = fake.history("me/tiny")[0].files
    assert {res.artifact.name, res.artifact.name + ".sig", res.receipt.name, "README.md"} <= set(files)
    assert fake.file("me/tiny", res.receipt.name) == res.receipt.read_bytes()
    assert UNVERIFIED_HEADING not in fake.file("me/tiny", "README.md").decode()
    assert "llama-server -hf me/tiny:" in fake.file("me/tiny", "README.md").decode()  # the card names its repo
    assert up.summary()["uploaded"].endswith(fake.history("me/tiny")[0].oid)


@pytest.mark.runtime
def test_resume_after_failure_in_verify(tmp_path, monkeypatch):
    verify_mod = sys.modules["ggufmtp.measure.verify.run"]
    real = verify_mod.verify
    calls = []

    def broken(*a, **k):
        calls.append(1)
        raise ggufmtp.GgufmtpError("injected failure in verify")

    monkeypatch.setattr(verify_mod, "verify", broken)
    with pytest.raises(ggufmtp.GgufmtpError, match="injected"):
        ggufmtp.run("builtin:tiny-qwen35moe", "q8_0-mtp", ggufmtp.RunOptions(verify_options=VERIFY), out_dir=tmp_path,
                    progress=False)
    assert calls and not (tmp_path / ".ggufmtp" / "stages" / "verify.json").exists()
    monkeypatch.setattr(verify_mod, "verify", real)
    res = ggufmtp.run("builtin:tiny-qwen35moe", "q8_0-mtp", ggufmtp.RunOptions(verify_options=VERIFY), out_dir=tmp_path,
                      progress=False)
    s = stages(res)
    assert [s[k] for k in ("pull", "inspect", "plan", "quantize", "audit")] == ["cached"] * 5
    assert s["verify"] == "ran" and s["receipt"] == "ran" and s["card"] == "ran"


@pytest.mark.runtime
def test_changed_recipe_reruns_quantize_not_pull(tmp_path):
    ggufmtp.run("builtin:tiny-qwen35moe", "q8_0-mtp", NO_VERIFY, out_dir=tmp_path, progress=False)
    res = ggufmtp.run("builtin:tiny-qwen35moe", "hifi-q4_k_m-mtp", NO_VERIFY, out_dir=tmp_path, progress=False)
    s = stages(res)
    assert s["pull"] == "cached" and s["inspect"] == "cached"
    assert s["plan"] == "ran" and s["quantize"] == "ran"
    assert "verify" not in s
    # release names (quant/naming.py): the model's name without its cache digest, the recipe's tag
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == ["tiny-qwen35moe-Q4_K_M_HiFi.gguf",
                                                               "tiny-qwen35moe-Q8_0.gguf"]


@pytest.mark.runtime
def test_deleted_artifact_is_rebuilt(tmp_path):
    res = ggufmtp.run("builtin:tiny-qwen35moe", "q8_0-mtp", NO_VERIFY, out_dir=tmp_path, progress=False)
    res.artifact.unlink()
    again = ggufmtp.run("builtin:tiny-qwen35moe", "q8_0-mtp", NO_VERIFY, out_dir=tmp_path, progress=False)
    assert stages(again)["quantize"] == "ran" and again.artifact.exists()


@pytest.mark.runtime
def test_run_cli_json(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "q8_0-mtp", "--model", "builtin:tiny-qwen35moe", "-o",
                                  str(tmp_path), "--seeds", "42", "--limit", "3", "--max-tokens", "24", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    for key in ("artifact", "receipt", "mtp_status", "acceptance", "acceptance_ci95", "speedup"):
        assert key in d
    assert d["mtp_status"] == "complete" and d["acceptance"] > 0.9


@pytest.mark.runtime
def test_run_refuses_model_without_mtp(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "hifi-q4_k_m-mtp", "--model", "builtin:tiny-qwen35moe-nomtp",
                                  "-o", str(tmp_path), "--no-verify"])
    assert r.exit_code == 1 and "has none" in r.output


def test_bad_model_argument(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "q8_0-mtp", "--model", "not-a-repo", "-o", str(tmp_path)])
    assert r.exit_code == 1 and "not a file" in r.output


def test_summary_json_and_text_from_stage_records(tmp_path):
    from ggufmtp.pipeline import RunResult, StageRecord, StageStatus, format_summary

    verification = {"mtp": {"acceptance": 0.875, "acceptance_ci95": [0.8, 0.9]}, "speedup": 1.5,
                    "speedup_ci95": [1.25, 1.75], "verdict": "pass"}
    records = [StageRecord("pull", "k0", True, {}),
               StageRecord("quantize", "k1", False, {"size_bytes": 1234, "bpw": 4.5,
                                                     "mtp": {"status": "complete", "block": 4}}),
               StageRecord("verify", "k2", False, {"verification": verification})]
    res = RunResult(tmp_path, tmp_path / "a.gguf", tmp_path / "a.gguf.receipt.json", None, records)
    s = res.summary()
    assert list(s) == ["artifact", "receipt", "card", "size_bytes", "bpw", "mtp_status", "mtp_block", "mtp_blocks",
                       "acceptance",
                       "acceptance_ci95", "speedup", "speedup_ci95", "verdict", "uploaded", "stages", "speed_checked",
                       "findings", "head", "reasons", "stage_seconds", "ran_because", "reference"]
    assert s["stages"] == {"pull": "cached", "quantize": "ran", "verify": "ran"}
    assert s["stage_seconds"] == {"pull": 0.0, "quantize": 0.0, "verify": 0.0}  # records made here: none timed
    assert json.loads(json.dumps(s)) == s and records[0].status is StageStatus.CACHED
    text = res.summary_record().format().splitlines()
    assert text[1] == "size        1,234 bytes, 4.500 bpw" and text[2] == "MTP         blk.4 complete"
    assert text[3] == "acceptance  87.5% (95% CI 80.0-90.0%)" and text[4] == "speedup     1.50x (95% CI 1.25-1.75x)"
    assert text[-1] == "stages      pull cached, quantize ran, verify ran"
    # on CPU the summary says what the verdict did not judge (#28: `make demo` printed "verdict pass" beside 0.77x)
    cpu = format_summary({**s, "speedup": 0.77, "speed_checked": False}).splitlines()
    assert cpu[4].endswith("vanilla: speed not verified on this hardware (no GPU offload)")
    assert cpu[5] == "verdict     pass (MTP head verified; speed not verified on this hardware)"


def test_model_references(tmp_path):
    from ggufmtp.refs import ModelRef, RefKind, local_model_arg, parse_model_ref

    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert parse_model_ref("builtin:tiny-qwen35moe") == ModelRef(RefKind.BUILTIN, "builtin:tiny-qwen35moe")
    assert parse_model_ref(str(f)) == ModelRef(RefKind.LOCAL, str(f.resolve()))
    assert parse_model_ref("owner/name@v1") == ModelRef(RefKind.HUB, "owner/name", "v1")
    assert parse_model_ref("owner/name") == ModelRef(RefKind.HUB, "owner/name", None)
    for bad in ("not-a-repo", "a/b/c", "./x/y"):
        with pytest.raises(ggufmtp.GgufmtpError, match="not a file"):
            parse_model_ref(bad)
    assert local_model_arg("some/path.gguf") == "some/path.gguf"  # passed on; the command checks it


# ---------------------------------------------------------------------------------------------------
# publish only what passed
# ---------------------------------------------------------------------------------------------------


def test_run_upload_with_a_failing_verdict_leaves_the_hub_untouched(fake, synth_model, tmp_path):
    """A head that mostly drafts wrong tokens (acceptance far below q8_0-mtp's 60 %), judged by the
    recipe's minimum (``--no-reference``: against its own source it would be a faithful quant), fails
    verify: ``run --upload`` exits 1 before any request; the failing verdict is not cached as done."""
    model = synth_model(SynthSpec(wrong_successor_fraction=0.9))
    out = tmp_path / "out"
    argv = ["run", "--recipe", "q8_0-mtp", "--model", str(model), "-o", str(out), "--seeds", "42", "--limit", "3",
            "--max-tokens", "24", "--upload", "me/tiny", "--json", "--no-reference"]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 1, r.output
    assert "error: refusing to publish" in r.stderr and "its verification failed (verdict fail: acceptance" in r.stderr
    assert fake.requests == [] and fake.repos == {}  # not one request: no repo, no commit, no file
    stored = json.loads((out / ".ggufmtp" / "stages" / "verify.json").read_text())
    assert stored["ok"] is False and stored["result"]["verification"]["verdict"] == "fail"
    assert not (out / ".ggufmtp" / "stages" / "upload.json").exists()
    assert UNVERIFIED_HEADING in (out / "README.md").read_text()  # the local card says so too

    r = CliRunner().invoke(main, [*argv, "--allow-unverified"])  # publish it anyway: verified again, card says so
    assert r.exit_code == 1, r.output  # the verdict is still a failure
    d = json.loads(r.stdout)
    assert d["verdict"] == "fail" and d["stages"]["verify"] == "ran" and d["stages"]["upload"] == "ran"
    readme = fake.file("me/tiny", "README.md").decode()
    assert UNVERIFIED_HEADING in readme and "its verification failed" in readme
    assert "NOT VERIFIED" in fake.history("me/tiny")[0].description


# ---------------------------------------------------------------------------------------------------
# cache keys on content
# ---------------------------------------------------------------------------------------------------


def _flip_low_byte(path: Path) -> None:
    """Change one byte of the last tensor's data (a low mantissa byte), keep size, atime and mtime."""
    st = path.stat()
    past_the_ctime_of(path)  # an edit after the last hash, in a later tick of the file system's clock
    data = bytearray(path.read_bytes())
    data[-4] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


@pytest.mark.runtime
def test_cache_sees_changed_bytes_behind_restored_size_and_mtime(tmp_path, synth_model):
    model = tmp_path / "m.gguf"
    model.write_bytes(synth_model("tiny-qwen35moe").read_bytes())
    out = tmp_path / "out"
    first = ggufmtp.run(str(model), "q8_0-mtp", NO_VERIFY, out_dir=out, progress=False)
    digest = load_receipt(first.receipt)["subject"][0]["digest"]["sha256"]
    _flip_low_byte(model)
    s = stages(ggufmtp.run(str(model), "q8_0-mtp", NO_VERIFY, out_dir=out, progress=False))
    assert [s[k] for k in ("pull", "inspect", "plan", "quantize", "audit")] == ["ran"] * 5
    assert load_receipt(first.receipt)["subject"][0]["digest"]["sha256"] != digest
    assert set(stages(ggufmtp.run(str(model), "q8_0-mtp", NO_VERIFY, out_dir=out, progress=False)).values()) == {
        "cached"}
    _flip_low_byte(first.artifact)  # the artifact altered behind the cache's back: rebuilt
    s = stages(ggufmtp.run(str(model), "q8_0-mtp", NO_VERIFY, out_dir=out, progress=False))
    assert s["pull"] == "cached" and s["quantize"] == "ran"
    assert audit(first.artifact, first.receipt).ok


@pytest.mark.runtime
def test_hub_model_keyed_on_the_resolved_commit_and_refused_without_checksums(fake, synth_model, tmp_path):
    fake.commit("org/tiny", {"tiny.gguf": synth_model("tiny-qwen35moe").read_bytes()})
    out = tmp_path / "out"
    kw = dict(out_dir=out, progress=False, options=ggufmtp.RunOptions(verify=False, include=["*.gguf"]))
    first = ggufmtp.run("org/tiny", "q8_0-mtp", **kw)
    assert set(stages(first).values()) == {"ran"}
    assert set(stages(ggufmtp.run("org/tiny", "q8_0-mtp", **kw)).values()) == {"cached"}
    moved = fake.commit("org/tiny", {"README.md": b"# tiny\n"})  # main moves; the model's bytes do not
    s = stages(ggufmtp.run("org/tiny", "q8_0-mtp", **kw))
    assert s["pull"] == "ran" and s["quantize"] == "ran"
    assert load_receipt(first.receipt)["predicate"]["base_model"]["source"]["commit"] == moved

    fake.withhold_checksums("org/tiny", "tiny.gguf")  # the Hub no longer gives a checksum to verify against
    other = tmp_path / "other"
    with pytest.raises(HubRefusedError, match=r"no checksum for tiny.gguf.*--allow-unverified"):
        ggufmtp.run("org/tiny", "q8_0-mtp", **{**kw, "out_dir": other})
    assert not (other / ".ggufmtp").exists()
    res = ggufmtp.run("org/tiny", "q8_0-mtp", **{**kw, "out_dir": other,
                                                  "options": dataclasses.replace(kw["options"], allow_unverified=True)})
    assert res.artifact.exists()


def test_run_upload_without_verification_is_refused_before_any_work(tmp_path):
    r = CliRunner().invoke(main, ["run", "--recipe", "q8_0-mtp", "--model", "builtin:tiny-qwen35moe", "-o",
                                  str(tmp_path / "out"), "--no-verify", "--upload", "me/x"])
    assert r.exit_code == 1 and "--allow-unverified" in r.stderr and not (tmp_path / "out").exists()


def test_run_writes_nothing_for_a_model_that_is_not_a_gguf(tmp_path):
    for name, data in (("junk.gguf", b"not a gguf at all"), ("short.gguf", b"GGUF\x03\x00\x00\x00\x01")):
        model = tmp_path / name
        model.write_bytes(data)
        out = tmp_path / f"out-{name}"
        r = CliRunner().invoke(main, ["run", "--recipe", "q8_0-mtp", "--model", str(model), "-o", str(out)])
        assert r.exit_code == 1 and r.stderr.startswith(f"error: {model}") and "Traceback" not in r.output
        assert not out.exists()
