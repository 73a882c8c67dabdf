"""Chain of trust (#16): model-signing signatures of artifacts, DSSE-signed receipts, and every
claim bound to bytes (the verification to the served file, the imatrix to what the plan read).
Each test forges, tampers or mismatches for real and expects the check to catch it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakehub import write_keypair

from ggufmtp.cli import main
from ggufmtp.constants import LLAMA_CPP_COMMIT
from ggufmtp.errors import AuditError, QuantizeError
from ggufmtp.files.hashing import sha256_file
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import format as imx
from ggufmtp.provenance.audit import Trust, audit, imatrix_check
from ggufmtp.provenance.receipt import (
    load_receipt,
    read_receipt,
    receipt_for_quantize,
    seal,
    set_verification,
    write_statement,
)
from ggufmtp.provenance.signing import (
    ENV_PUBLIC_KEY,
    ENV_SIGNING_KEY,
    UNSIGNED_NOTE,
    resolve_signing_key,
    sign_artifact,
    verify_artifact,
    verify_receipt,
)
from ggufmtp.provenance.toolchain import toolchain
from ggufmtp.provenance.verdict import Thresholds
from ggufmtp.quant.plan import make_plan
from ggufmtp.quant.quantize import quantize

MODEL_SIGNING = Path(sys.executable).parent / "model_signing"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """EC P-256 key pairs made with ``cryptography``: the signer's and an attacker's."""
    d = tmp_path_factory.mktemp("keys")
    priv, pub = write_keypair(d, "signer")
    evil, evil_pub = write_keypair(d, "attacker")
    return {"priv": priv, "pub": pub, "evil": evil, "evil_pub": evil_pub}


@pytest.fixture(scope="module")
def made(llama_runtime, synth_model, tmp_path_factory):
    """A quantized artifact with an imatrix, its plan and result (receipts are written per test)."""
    d = tmp_path_factory.mktemp("signed")
    src = synth_model("tiny-qwen35moe")
    im = d / "imatrix.gguf"
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(src), seed=3), im)
    res = quantize(src, "q8_0-mtp", d / "art.gguf", imatrix=im, progress=False)
    return {"dir": d, "src": src, "imatrix": im, "res": res, "out": d / "art.gguf"}


@pytest.fixture
def art(made, keys, tmp_path):
    """A fresh copy of the artifact with an unsigned receipt (``rc``) and a signed one (``src_signed``)
    plus the artifact's model-signing signature."""
    out = tmp_path / "art.gguf"
    shutil.copy(made["out"], out)
    rc = receipt_for_quantize(made["res"], receipt_path=tmp_path / "art.gguf.receipt.json")
    signed = receipt_for_quantize(made["res"], receipt_path=tmp_path / "signed.receipt.json",
                                  signing_key=keys["priv"])
    sign_artifact(out, keys["priv"])
    return {"out": out, "rc": rc, "signed": signed, "sha": load_receipt(rc)["subject"][0]["digest"]["sha256"]}


def verification(sha256: str | None, speedup: float = 1.25) -> dict:
    v = {"verdict": "pass", "mtp": {"acceptance": 0.9, "acceptance_ci95": [0.85, 0.95], "draft_n": 10,
                                    "draft_n_accepted": 9, "tokens_per_second": 100.0},
         "vanilla": {"tokens_per_second": 80.0}, "speedup": speedup, "speedup_ci95": [1.2, 1.3],
         "identical_output_fraction": 1.0, "suite": {"name": "chat-v1", "sha256": "0" * 64},
         "server": {"build_info": "b1-0c1e570"}, "hardware": {"cpu": "x"}, "settings": {"draft_n_max": 4},
         "model": {"name": "art.gguf", "size_bytes": 1}, "thresholds": Thresholds().to_dict()}
    if sha256 is not None:
        v["model"]["sha256"] = sha256
    return v


def failed(report) -> dict[str, str]:
    return {c.name: c.detail for c in report.checks if not c.ok}


def run_cli(*args: str):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    return res


# ----------------------------------------------------------------------------- artifact signatures


def test_model_signing_cli_accepts_the_signed_artifact_and_rejects_a_one_byte_change(art, keys):
    out, sig = art["out"], Path(str(art["out"]) + ".sig")
    cmd = [str(MODEL_SIGNING), "verify", "key", str(out), "--signature", str(sig), "--public_key", str(keys["pub"])]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "Verification succeeded" in ok.stdout, ok.stdout + ok.stderr
    verify_artifact(out, keys["pub"])
    wrong_key = cmd[:-1] + [str(keys["evil_pub"])]
    assert subprocess.run(wrong_key, capture_output=True, text=True, timeout=120).returncode != 0
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0x01
    out.write_bytes(bytes(data))
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "Verification failed" in (bad.stdout + bad.stderr)
    with pytest.raises(AuditError, match="does not verify"):
        verify_artifact(out, keys["pub"])
    f = failed(audit(out, art["signed"], public_key=keys["pub"]))
    assert "signature of art.gguf" in f and "sha256 art.gguf" in f


# ----------------------------------------------------------------------------- forged receipts


def test_forged_unsigned_receipt_passes_only_as_checksum_and_fails_with_a_public_key(art, keys):
    out, rc = art["out"], art["rc"]
    set_verification(rc, verification(art["sha"]))
    st = json.loads(rc.read_text())
    st["predicate"]["verification"]["speedup"] = 9.99  # the forgery: edit, then recompute the digest
    rc.write_text(json.dumps(seal(st)))
    plain = audit(out, rc)
    assert plain.ok and plain.signed is False and plain.trust == Trust.UNSIGNED
    res = run_cli("audit", out, "--receipt", rc)
    assert res.exit_code == 0 and UNSIGNED_NOTE in res.output
    assert "unsigned: checksum only, detects accidental edits, not forgery" in res.output
    d = json.loads(run_cli("audit", out, "--receipt", rc, "--json").output)
    assert d["signed"] is False and d["trust"] == "unsigned"
    keyed = audit(out, rc, public_key=keys["pub"])
    assert not keyed.ok and "signature of the receipt" in failed(keyed)
    res = run_cli("audit", out, "--receipt", rc, "--public-key", keys["pub"])
    assert res.exit_code == 1 and "✗ signature of the receipt" in res.output
    with pytest.raises(AuditError, match="unsigned"):
        verify_receipt(rc, keys["pub"])


def _payload(envelope: dict) -> dict:
    return json.loads(base64.b64decode(envelope["payload"]))


def test_forged_signed_receipt_fails_audit_with_the_public_key(art, keys, tmp_path):
    out, signed = art["out"], art["signed"]
    assert audit(out, signed, public_key=keys["pub"]).ok, failed(audit(out, signed, public_key=keys["pub"]))
    assert run_cli("audit", out, "--receipt", signed, "--public-key", keys["pub"]).exit_code == 0
    env = json.loads(signed.read_text())
    st = _payload(env)
    st["predicate"]["recipe"]["name"] = "forged"
    env["payload"] = base64.b64encode(json.dumps(seal(st)).encode()).decode()  # old signature kept
    forged = tmp_path / "forged.receipt.json"
    forged.write_text(json.dumps(env))
    assert read_receipt(forged).signed and audit(out, forged).ok  # no key: nothing can prove it
    f = failed(audit(out, forged, public_key=keys["pub"]))
    assert list(f) == ["signature of the receipt"] and "does not verify" in f["signature of the receipt"]
    resigned = tmp_path / "resigned.receipt.json"
    write_statement(resigned, st, keys["evil"])  # the forger signs with a key of their own
    assert "signature of the receipt" in failed(audit(out, resigned, public_key=keys["pub"]))
    res = run_cli("audit", out, "--receipt", resigned, "--public-key", keys["pub"], "--json")
    assert res.exit_code == 1 and json.loads(res.output)["signed"] is True


def test_receipt_sign_signs_an_intact_receipt_and_refuses_an_edited_one(art, keys, monkeypatch):
    out, rc = art["out"], art["rc"]
    Path(str(out) + ".sig").unlink()
    monkeypatch.setenv(ENV_SIGNING_KEY, str(keys["priv"]))
    res = run_cli("receipt", "sign", rc)
    assert res.exit_code == 0, res.output
    assert read_receipt(rc).signed
    monkeypatch.setenv(ENV_PUBLIC_KEY, str(keys["pub"]))
    res = run_cli("audit", out)
    assert res.exit_code == 0 and "signed: signatures verified" in res.output, res.output
    cmd = [str(MODEL_SIGNING), "verify", "key", str(out), "--signature", str(out) + ".sig",
           "--public_key", str(keys["pub"])]
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    show = run_cli("receipt", "show", rc)
    assert show.exit_code == 0 and "DSSE envelope" in show.output
    st = load_receipt(rc)
    st["predicate"]["recipe"]["name"] = "edited"  # not resealed
    rc.write_text(json.dumps(st))
    res = run_cli("receipt", "sign", rc)
    assert res.exit_code == 1 and "edited after it was written" in res.output


# ----------------------------------------------------------------------------- verification bound to bytes


def test_verification_of_another_file_is_refused_naming_both_digests(art):
    rc, sha = art["rc"], art["sha"]
    before = rc.read_bytes()
    other = "ab" * 32
    with pytest.raises(AuditError) as e:
        set_verification(rc, verification(other))
    assert other in str(e.value) and sha in str(e.value)
    with pytest.raises(AuditError, match="model.sha256"):
        set_verification(rc, verification(None))  # a hand-written verification names no bytes
    assert rc.read_bytes() == before
    set_verification(rc, verification(sha))
    assert audit(art["out"], rc).ok
    st = load_receipt(rc)
    st["predicate"]["verification"]["model"]["sha256"] = other
    rc.write_text(json.dumps(seal(st)))
    f = failed(audit(art["out"], rc))
    assert list(f) == ["verification of these bytes"] and other in f["verification of these bytes"]


def test_verify_cli_refuses_another_models_receipt(art, synth_model, llama_server_bin):
    rc = art["rc"]
    before = rc.read_bytes()
    b = synth_model("tiny-qwen35moe-f20")
    res = run_cli("verify", b, "--receipt", rc, "--limit", "1", "--max-tokens", "4", "--seeds", "42",
                  "--llama-cpp-bin", llama_server_bin.parent)
    assert res.exit_code == 1, res.output
    assert sha256_file(b) in res.output and art["sha"] in res.output
    assert "before any server starts" in res.output  # refused up front, not after a wasted run
    assert rc.read_bytes() == before


def test_a_signed_receipt_stays_signed(art, keys, monkeypatch):
    signed, sha = art["signed"], art["sha"]
    monkeypatch.delenv(ENV_SIGNING_KEY, raising=False)
    with pytest.raises(AuditError, match="signed"):
        set_verification(signed, verification(sha))
    with pytest.raises(AuditError, match="does not verify"):
        set_verification(signed, verification(sha), signing_key=keys["evil"])
    set_verification(signed, verification(sha), signing_key=keys["priv"])
    assert read_receipt(signed).signed and audit(art["out"], signed, public_key=keys["pub"]).ok


# ----------------------------------------------------------------------------- imatrix bound to bytes


def _other_imatrix(made, path: Path) -> None:
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(made["src"]), seed=99), path)


def test_imatrix_changed_between_plan_and_quantize_is_refused(made, tmp_path):
    im = tmp_path / "im.gguf"
    shutil.copy(made["imatrix"], im)
    plan = make_plan(made["src"], "q8_0-mtp", im)
    assert plan.imatrix_sha256 == sha256_file(made["imatrix"])
    _other_imatrix(made, im)
    out = tmp_path / "x.gguf"
    with pytest.raises(QuantizeError, match="changed after the plan") as e:
        quantize(made["src"], "q8_0-mtp", out, imatrix=im, plan=plan, progress=False)
    assert str(im) in str(e.value) and not out.exists()


def test_imatrix_changed_between_quantize_and_receipt_is_refused(made, tmp_path):
    im = tmp_path / "im.gguf"
    shutil.copy(made["imatrix"], im)
    res = quantize(made["src"], "q8_0-mtp", tmp_path / "x.gguf", imatrix=im, progress=False)
    _other_imatrix(made, im)
    with pytest.raises(AuditError, match="changed after the plan") as e:
        receipt_for_quantize(res)
    assert str(im) in str(e.value) and not (tmp_path / "x.gguf.receipt.json").exists()
    with pytest.raises(AuditError, match="used no imatrix"):
        receipt_for_quantize(quantize(made["src"], "q8_0-mtp", tmp_path / "y.gguf", progress=False), imatrix=im)


def test_audit_fails_when_metadata_and_receipt_disagree_on_the_imatrix(art):
    out, rc = art["out"], art["rc"]
    assert "imatrix metadata" not in failed(audit(out, rc))
    st = load_receipt(rc)
    im = st["predicate"]["imatrix"]
    st["predicate"]["imatrix"] = None  # "no imatrix", while the file's metadata names one
    rc.write_text(json.dumps(seal(st)))
    f = failed(audit(out, rc))
    assert list(f) == ["imatrix metadata"] and "says no imatrix" in f["imatrix metadata"]
    st["predicate"]["imatrix"] = {**im, "entries": im["entries"] + 1, "file": "other.gguf"}
    rc.write_text(json.dumps(seal(st)))
    f = failed(audit(out, rc))["imatrix metadata"]
    assert "entries_count" in f and "other.gguf" in f


def test_imatrix_check_without_metadata():
    im = {"file": "a.gguf", "entries": 3, "chunk_count": 5, "datasets": ["d.txt"]}
    assert imatrix_check({}, None).ok
    assert not imatrix_check({}, im).ok
    md = {"quantize.imatrix.file": "/x/a.gguf", "quantize.imatrix.entries_count": 3,
          "quantize.imatrix.chunks_count": 5, "quantize.imatrix.dataset": "d.txt"}
    assert imatrix_check(md, im).ok
    assert "chunks_count" in imatrix_check({**md, "quantize.imatrix.chunks_count": 6}, im).detail
    assert "dataset" in imatrix_check({**md, "quantize.imatrix.dataset": "e.txt"}, im).detail
    long_name = {**md, "quantize.imatrix.file": "/" + "d" * 130}  # cut to 127 bytes by llama.cpp: not compared
    assert imatrix_check(long_name, im).ok


# ----------------------------------------------------------------------------- llama.cpp commit of what is loaded


def test_receipt_commit_is_the_loaded_librarys(llama_runtime, monkeypatch):
    from ggufmtp.runtime import libllama

    lib = libllama.loaded_libllama()
    q = toolchain()["quantizer"]
    assert q["llama_cpp_commit"] == lib.commit and "lib_path" not in q  # no local path in a receipt (#28)
    assert lib.commit == LLAMA_CPP_COMMIT and "pinned_commit" not in q
    assert libllama._common_commit(lib.path) == lib.commit  # the build's own LLAMA_COMMIT agrees
    other = libllama.LoadedLibllama(path=Path("/elsewhere/bin/libllama.so"), commit="feedbee",
                                    commit_source="runtime record")
    monkeypatch.setattr(libllama, "loaded_libllama", lambda: other)
    q = toolchain()["quantizer"]
    assert q["llama_cpp_commit"] == "feedbee" and q["pinned_commit"] == LLAMA_CPP_COMMIT


# ----------------------------------------------------------------------------- keys


@pytest.fixture
def bad_keys(tmp_path, keys):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    (tmp_path / "dir.pem").mkdir()
    (tmp_path / "garbage.pem").write_text("TOPSECRET-CONTENT not a key\n")
    def pem(key, encryption=serialization.NoEncryption()) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)

    (tmp_path / "rsa.pem").write_bytes(pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
    (tmp_path / "encrypted.pem").write_bytes(pem(ec.generate_private_key(ec.SECP256R1()),
                                                 serialization.BestAvailableEncryption(b"pw")))
    k1 = tmp_path / "k1.pem"
    k1.write_bytes(pem(ec.generate_private_key(ec.SECP256K1())))  # a curve model-signing does not take
    return {"missing": (tmp_path / "missing.pem", "cannot read"), "dir": (tmp_path / "dir.pem", "directory"),
            "garbage": (tmp_path / "garbage.pem", "not a PEM private key"),
            "public": (keys["pub"], "not a PEM private key"), "rsa": (tmp_path / "rsa.pem", "elliptic-curve"),
            "encrypted": (tmp_path / "encrypted.pem", "encrypted"), "curve": (k1, "not supported")}


@pytest.mark.parametrize("kind", ["missing", "dir", "garbage", "public", "rsa", "encrypted", "curve"])
def test_a_bad_signing_key_is_one_clear_error_naming_the_file(bad_keys, kind, tmp_path):
    path, why = bad_keys[kind]
    with pytest.raises(AuditError, match=why) as e:
        resolve_signing_key(path)
    assert str(path) in str(e.value) and "TOPSECRET" not in str(e.value) and "BEGIN" not in str(e.value)
    out = tmp_path / "never.gguf"
    res = run_cli("quantize", "builtin:tiny-qwen35moe", "-r", "q8_0-mtp", "-o", out, "--signing-key", path)
    assert res.exit_code == 1 and str(path) in res.output and "TOPSECRET" not in res.output
    assert not out.exists() and not any(tmp_path.glob(".never.gguf*"))


# ----------------------------------------------------------------------------- receipts that are not receipts


def _bad_receipts(folder: Path) -> dict[str, Path]:
    base = {"_type": "https://in-toto.io/Statement/v1", "predicateType": "https://ggufmtp.dev/receipt/v1"}
    cases = {
        "wrong-shape": {**base, "subject": "x.gguf", "predicate": []},
        "subject-digest-list": {**base, "subject": [{"name": "x", "digest": [], "annotations": {}}], "predicate": {}},
        "list": [1, 2, 3],
        "deep-dicts": {**base, "subject": [], "predicate": json.loads('{"a":' * 200 + "1" + "}" * 200)},
        "envelope-bad-b64": {"payloadType": "application/vnd.in-toto+json", "payload": "%%%", "signatures": []},
        "envelope-deep": {"payloadType": "application/vnd.in-toto+json", "signatures": [],
                          "payload": base64.b64encode(b"[" * 5000 + b"]" * 5000).decode()},
    }
    out = {}
    for name, data in cases.items():
        p = folder / f"{name}.json"
        p.write_text(json.dumps(data))
        out[name] = p
    (folder / "very-deep.json").write_text("[" * 200000 + "]" * 200000)
    out["very-deep"] = folder / "very-deep.json"
    (folder / "adir.json").mkdir()
    out["directory"] = folder / "adir.json"
    return out


def test_receipts_of_the_wrong_shape_or_depth_are_one_clear_error(tmp_path):
    artifact = tmp_path / "x.gguf"
    artifact.write_bytes(b"GGUF" + b"\0" * 64)
    for name, path in _bad_receipts(tmp_path).items():
        with pytest.raises(AuditError) as e:
            read_receipt(path)
        assert str(path) in str(e.value), name
        show = run_cli("receipt", "show", path)
        assert show.exit_code != 0 and "rror" in show.output, (name, show.output)
        res = run_cli("audit", artifact, "--receipt", path, "--json")
        assert res.exit_code == 1, (name, res.output)
        checks = {c["name"]: c for c in json.loads(res.output)["checks"]}
        assert checks["receipt readable"]["ok"] is False, name


def test_unwritable_receipt_paths_are_clear_errors(art, tmp_path):
    rc, sha = art["rc"], art["sha"]
    before = rc.read_bytes()
    os.chmod(rc, stat.S_IRUSR | stat.S_IRGRP)
    try:
        with pytest.raises(AuditError, match="read-only"):
            set_verification(rc, verification(sha))
    finally:
        os.chmod(rc, stat.S_IRUSR | stat.S_IWUSR)
    assert rc.read_bytes() == before
    (tmp_path / "into-dir").mkdir()
    with pytest.raises(AuditError, match="is a directory"):
        write_statement(tmp_path / "into-dir", load_receipt(rc))


def test_a_bad_public_key_is_one_clear_error_naming_the_file(tmp_path, keys):
    garbage = tmp_path / "pub.pem"
    garbage.write_text("TOPSECRET-CONTENT\n")
    for path, why in ((garbage, "not a PEM public key"), (keys["priv"], "not a PEM public key"),
                      (tmp_path / "none.pem", "cannot read")):
        res = run_cli("audit", tmp_path / "x.gguf", "--public-key", path)
        assert res.exit_code == 1 and why in res.output and str(path) in res.output
        assert "TOPSECRET" not in res.output and "BEGIN" not in res.output
