"""The review's smaller items (#40, item 5): special files, ladder file types, local paths, the
source section, the publish gate's thresholds and card, and ``receipt sign``.

Every CLI case runs ``python -m ggufmtp`` in a subprocess with a timeout (a hang is a failure,
never a hung test run) and asserts one clear error, no traceback, nothing left behind
(:func:`test_bad_inputs.expect_clean_failure`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from receipt_kit import honest_statement, synth_artifact, verification_record
from test_bad_inputs import expect_clean_failure

from ggufmtp.errors import AuditError
from ggufmtp.files.hashing import sha256_file
from ggufmtp.provenance.receipt import load_receipt, read_receipt, seal, set_verification

# ----------------------------------------------------------------------------- 1. regular files, bounded reads


def _fifo(d: Path, name: str) -> Path:
    p = d / name
    os.mkfifo(p)
    return p


def _zero(d: Path, name: str) -> Path:
    p = d / name
    p.symlink_to("/dev/zero")
    return p


SPECIAL_MAKERS = {"fifo": (_fifo, "fifo"), "dev-zero": (_zero, "device")}

# each command reads the special file as: a receipt, a key, a ladder file, a recipe, a card
SPECIAL_READERS = {
    "receipt-show": lambda d, s: ["receipt", "show", s("r.json")],
    "audit-receipt": lambda d, s: ["audit", d / "x.gguf", "--receipt", s("r.json")],
    "audit-public-key": lambda d, s: ["audit", d / "x.gguf", "--public-key", s("pub.pem")],
    "sign-key": lambda d, s: ["receipt", "sign", d / "r.json", "--signing-key", s("key.pem")],
    "ladder-file": lambda d, s: ["ladder", "--ladder", s("ladder.toml"), "-o", d / "out"],
    "recipe": lambda d, s: ["plan", d / "x.gguf", "-r", s("r.toml")],
    "signature": lambda d, s: ["audit", d / "x.gguf", "--receipt", _honest(d), "--public-key", _public_key(d),
                               "--signature", s("x.gguf.sig")],
}


def _honest(d: Path) -> Path:
    art = synth_artifact(d, "x.gguf")
    rc = d / "x.receipt.json"
    rc.write_text(json.dumps(honest_statement(art, "pass")))
    return rc


def _public_key(d: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pub = d / "pub.pem"
    pub.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pub


@pytest.mark.parametrize("kind", sorted(SPECIAL_MAKERS))
@pytest.mark.parametrize("reader", sorted(SPECIAL_READERS))
def test_a_special_file_is_refused_at_once(reader, kind, tmp_path):
    make, word = SPECIAL_MAKERS[kind]
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    made: list[Path] = []

    def special(name: str) -> Path:
        made.append(make(tmp_path, name))
        return made[-1]

    argv = SPECIAL_READERS[reader](tmp_path, special)
    ran = expect_clean_failure(argv, tmp_path, (made[0].name, word), timeout=30,
                               verdict=reader.startswith("audit") or reader == "signature")
    assert ran.seconds < 30


# ----------------------------------------------------------------------------- 2. ladder file types

LADDER_HEAD = 'recipes = ["q8_0-mtp"]\n'
LADDER_TYPES = {  # name: (the file's text, the key the error must name)
    "model-integer": ('model = 5\n' + LADDER_HEAD, "model"),
    "model-array": ('model = ["a", "b"]\n' + LADDER_HEAD, "model"),
    "model-date": ('model = 1979-05-27\n' + LADDER_HEAD, "model"),
    "model-table": ('model = {repo = "x"}\n' + LADDER_HEAD, "model"),
    "imatrix-table": ('model = "builtin:tiny"\nimatrix = {file = "x"}\n' + LADDER_HEAD, "imatrix"),
    "imatrix-corpus-integer": ('model = "builtin:tiny"\nimatrix_corpus = 3\n' + LADDER_HEAD, "imatrix_corpus"),
    "recipes-string": ('model = "builtin:tiny"\nrecipes = "q8_0-mtp"\n', "recipes"),
    "recipes-of-integers": ('model = "builtin:tiny"\nrecipes = [1, 2]\n', "recipes"),
    "threads-string": ('model = "builtin:tiny"\nthreads = "8"\n' + LADDER_HEAD, "threads"),
    "threads-boolean": ('model = "builtin:tiny"\nthreads = true\n' + LADDER_HEAD, "threads"),
    "chunks-float": ('model = "builtin:tiny"\nimatrix_chunks = 2.5\n' + LADDER_HEAD, "imatrix_chunks"),
    "verify-seeds-string": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\nseeds = "42"\n', "seeds"),
    "verify-seeds-floats": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\nseeds = [1.5]\n', "seeds"),
    "verify-gpu-layers-table": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\ngpu_layers = {a = 1}\n',
                                "gpu_layers"),
    "verify-max-tokens-date": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\nmax_tokens = 1979-05-27\n',
                               "max_tokens"),
    "verify-limit-boolean": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[verify]\nlimit = true\n', "limit"),
    "eval-corpus-integer": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[eval]\ncorpus = 5\n', "corpus"),
    "eval-chunks-string": ('model = "builtin:tiny"\n' + LADDER_HEAD + '[eval]\nchunks = "4"\n', "chunks"),
}


@pytest.mark.parametrize("name", sorted(LADDER_TYPES))
def test_a_ladder_file_value_of_the_wrong_type_is_one_error_naming_the_file_and_the_key(name, tmp_path):
    text, key = LADDER_TYPES[name]
    f = tmp_path / "ladder.toml"
    f.write_text(text)
    ran = expect_clean_failure(["ladder", "--ladder", f, "-o", tmp_path / "out"], tmp_path, ("ladder.toml", key),
                               timeout=60)
    assert "must be" in ran.err, ran.err


# ----------------------------------------------------------------------------- 3. no local path, values and keys


def test_no_local_path_reaches_a_receipt_in_a_value_or_a_key(tmp_path, monkeypatch):
    """A path outside the usual roots (``--chat-template-file /proc/self/cwd/chat.jinja``, given to
    verify as a server argument) was kept in the receipt, and keys were never looked at."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chat.jinja").write_text("{{ messages }}")
    template = "/proc/self/cwd/chat.jinja"  # absolute, exists, under none of the usual roots
    art = synth_artifact(tmp_path / "a")
    rc = tmp_path / "a" / (art.name + ".receipt.json")
    rc.write_text(json.dumps(honest_statement(art, None)))
    v = verification_record(sha256_file(art), art.stat().st_size)
    v["settings"]["server_args"] = {"both": ["--chat-template-file", template], "mtp": [f"--x={template}"]}
    v["settings"][template] = "a key naming a file"
    v["settings"]["endpoint"] = "/v1/chat/completions"  # a server's endpoint is not a path
    set_verification(rc, v)
    assert "/proc/self" not in rc.read_text()
    settings = load_receipt(rc)["predicate"]["verification"]["settings"]
    assert settings["server_args"] == {"both": ["--chat-template-file", "chat.jinja"], "mtp": ["--x=chat.jinja"]}
    assert settings["chat.jinja"] == "a key naming a file" and settings["endpoint"] == "/v1/chat/completions"
    # a receipt edited to hold a path in a key is refused when read
    st = load_receipt(rc)
    st["predicate"]["verification"]["settings"][template] = 1
    rc.write_text(json.dumps(seal(st)))
    with pytest.raises(AuditError, match="local path"):
        read_receipt(rc)


def test_quantize_writes_the_imatrix_file_name_into_the_gguf(synth_model, tmp_path):
    """``quantize.imatrix.file`` held the imatrix's absolute path (llama-quantize writes what it is
    given); a GGUF ggufmtp writes carries file names only, and its receipt audits."""
    from ggufmtp.gguf.model import GGUFModel
    from ggufmtp.imatrix import check as imc
    from ggufmtp.imatrix import format as imx

    model = synth_model("tiny-qwen35moe")
    im = tmp_path / "deep" / "folder" / "trunk.imatrix.gguf"
    im.parent.mkdir(parents=True)
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(model), seed=3, mtp_blocks=[]), im)
    out = tmp_path / "q.gguf"
    from test_bad_inputs import _env, run_cli

    env, _ = _env(tmp_path)
    ran = run_cli(["quantize", model, "-r", "hifi-q4_k_m-mtp", "--imatrix", im, "-o", out, "--no-progress"],
                  tmp_path, env, timeout=300)
    assert ran.rc == 0, ran.err[-2000:]
    md = GGUFModel(out).metadata
    assert md["quantize.imatrix.file"] == "trunk.imatrix.gguf"
    assert str(tmp_path) not in out.read_bytes()[:1 << 20].decode("latin-1")
    ran = run_cli(["audit", out], tmp_path, env, timeout=120)
    assert ran.rc == 0, ran.out[-2000:]


# ----------------------------------------------------------------------------- 4. the source section

CKPT_FILE = "model-00001-of-00001.safetensors"


def _source_receipt(tmp_path: Path, change=None) -> tuple[Path, Path]:
    """An artifact and its receipt with a base model converted from a checkpoint and an honest
    ``source`` section; ``change(statement)`` edits the statement before it is sealed."""
    art = synth_artifact(tmp_path / "s")
    st = honest_statement(art, None)
    files = [{"path": "config.json", "sha256": "c0" * 32}, {"path": CKPT_FILE, "sha256": "d1" * 32}]
    st["predicate"]["base_model"]["converted_from"] = {"format": "safetensors", "name": "ckpt", "repo_id": None,
                                                      "commit": None, "files": files}
    st["predicate"]["source"] = {"format": "safetensors", "name": "ckpt", "repo_id": None, "revision": None,
                                 "scope": "mtp", "ok": True, "files": [dict(f) for f in files],
                                 "tensors": [{"name": "blk.4.nextn.eh_proj.weight", "match": True, "type": "F32"}],
                                 "artifact_sha256": sha256_file(art)}
    if change is not None:
        change(st)
    rc = art.with_name(art.name + ".receipt.json")
    rc.write_text(json.dumps(seal(st)))
    return art, rc


def _src(st):
    return st["predicate"]["source"]


FORGED_SOURCES = {
    "bound-to-other-bytes": (lambda st: _src(st).update(artifact_sha256="ab" * 32), "not the artifact's"),
    "a-mismatch-recorded-as-a-pass": (lambda st: _src(st)["tensors"].append(
        {"name": "blk.4.nextn.enorm.weight", "match": False}), "do not match"),
    "another-trunk": (lambda st: _src(st)["files"][1].update(sha256="e2" * 32), "converted from"),
    "a-shard-missing": (lambda st: _src(st)["files"].pop(1), "missing"),
    "no-tensor": (lambda st: _src(st).update(tensors=[]), "tensors"),
    "only-the-required-fields": (lambda st: st["predicate"].update(source={
        "format": "safetensors", "ok": True, "artifact_sha256": _src(st)["artifact_sha256"]}), "source"),
    "files-not-a-list": (lambda st: _src(st).update(files="x"), "files"),
    "converted-from-files-not-a-list": (lambda st: st["predicate"]["base_model"]["converted_from"].update(
        files={"a": 1}), "converted_from"),
}


@pytest.mark.parametrize("name", sorted(FORGED_SOURCES))
def test_audit_fails_a_broken_or_forged_source_section(name, tmp_path):
    from ggufmtp.provenance.audit import audit

    art, rc = _source_receipt(tmp_path)
    assert audit(art, rc).ok, [c for c in audit(art, rc).failures]
    change, word = FORGED_SOURCES[name]
    art, rc = _source_receipt(tmp_path, change)
    report = audit(art, rc)
    assert not report.ok
    assert any(word in c.detail for c in report.failures), [c.detail for c in report.failures]


def test_a_malformed_conversion_record_is_refused_naming_it(tmp_path):
    """The ``.source.json`` sidecar of a converted GGUF is read strictly (it was copied into the
    receipt as it was, whatever it held)."""
    from ggufmtp.provenance.receipt import converted_from

    sidecar = tmp_path / "m.gguf.source.json"
    assert converted_from(tmp_path / "m.gguf") is None
    good = {"format": "safetensors", "repo_id": None, "commit": None, "path": "/somewhere/ckpt",
            "converter": "convert_hf_to_gguf.py", "outtype": "bf16", "files": [{"path": CKPT_FILE, "sha256": "d1" * 32}]}
    sidecar.write_text(json.dumps(good))
    assert converted_from(tmp_path / "m.gguf")["name"] == "ckpt"
    for bad in ({**good, "files": "x"}, {**good, "extra": 1}, [1, 2], {**good, "files": [{"path": 1}]}):
        sidecar.write_text(json.dumps(bad))
        with pytest.raises(AuditError, match="m.gguf.source.json"):
            converted_from(tmp_path / "m.gguf")


@pytest.mark.parametrize("sidecar", ["not-json", "wrong-shape", "fifo"])
def test_quantize_refuses_a_bad_conversion_record_before_any_work(sidecar, synth_model, tmp_path):
    model = tmp_path / "m.gguf"
    model.symlink_to(synth_model("tiny-qwen35moe"))
    record = tmp_path / "m.gguf.source.json"
    if sidecar == "fifo":
        os.mkfifo(record)
    else:
        record.write_text("{broken" if sidecar == "not-json" else json.dumps({"format": "safetensors", "files": 5}))
    ran = expect_clean_failure(["quantize", model, "-r", "q8_0-mtp", "-o", tmp_path / "out" / "q.gguf",
                                "--no-progress"], tmp_path, ("m.gguf.source.json",), timeout=120)
    assert "Quantizing" not in ran.out


# ----------------------------------------------------------------------------- 5. the publish gate

VACUOUS = {"min_acceptance": 0.0, "min_speedup": 0.0, "min_identical": 0.0, "enforce_speedup": False,
           "source": "flags"}


def _gated(tmp_path: Path, verification="pass", **figures) -> tuple[Path, Path, str]:
    art = synth_artifact(tmp_path / "g")
    rc = art.with_name(art.name + ".receipt.json")
    rc.write_text(json.dumps(honest_statement(art, verification, **figures)))
    return art, rc, sha256_file(art)


def _card(tmp_path: Path, text: str) -> Path:
    card = tmp_path / "README.md"
    card.write_text("---\nlibrary_name: gguf\n---\n# my model\n\n" + text)
    return card


def test_the_gate_refuses_thresholds_that_judge_nothing_unless_the_card_says_so(tmp_path):
    """Thresholds 0/0/0 passed the gate: a verdict "pass" that claims nothing."""
    from ggufmtp.errors import HubRefusedError
    from ggufmtp.hub.gate import check_publishable
    from ggufmtp.provenance.card import card_text

    heading = "## Thresholds that judge nothing"
    art, rc, sha = _gated(tmp_path, thresholds=dict(VACUOUS), identical=0.0)
    for card in (None, _card(tmp_path, "A fine model.\n"),
                 _card(tmp_path, f"<!--\n{heading}\nmin_acceptance min_speedup min_identical\n-->\n"),
                 _card(tmp_path, f"{heading}\n\nmin_acceptance is 0.\n")):  # two of three unsaid
        with pytest.raises(HubRefusedError, match="judge nothing.*min_identical"):
            check_publishable({art: sha}, [rc], card)
    from ggufmtp.provenance.vacuous import VACUOUS_HEADING

    assert VACUOUS_HEADING == heading
    # the card ggufmtp writes says so, naming each: published
    _, body = card_text(load_receipt(rc))
    assert VACUOUS_HEADING in body
    assert check_publishable({art: sha}, [rc], _card(tmp_path, body)).unverified == []
    # the recipe's thresholds judge something: no statement needed
    art2, rc2, sha2 = _gated(tmp_path / "2")
    assert check_publishable({art2: sha2}, [rc2], None).unverified == []


def test_a_card_names_every_unverified_artifact_where_a_reader_sees_it(tmp_path):
    """The gate took a card whose only "## Not verified" was inside an HTML comment, or that never
    named the unverified file."""
    from ggufmtp.errors import HubRefusedError
    from ggufmtp.hub.gate import check_publishable
    from ggufmtp.provenance.card import UNVERIFIED_HEADING

    art, rc, sha = _gated(tmp_path, None)
    for card in (_card(tmp_path, f"<!-- {UNVERIFIED_HEADING} {art.name} -->\nAll good.\n"),
                 _card(tmp_path, f"<!-- {UNVERIFIED_HEADING}\n\n{art.name}\n"),  # never closed: all hidden
                 _card(tmp_path, f"{UNVERIFIED_HEADING}\n\nSome file was not checked.\n"),
                 None):
        with pytest.raises(HubRefusedError, match=f"{art.name} is not verified"):
            check_publishable({art: sha}, [rc], card, allow_unverified=True)
    ok = check_publishable({art: sha}, [rc], _card(tmp_path, f"{UNVERIFIED_HEADING}\n\n`{art.name}`: no runtime "
                                                             f"verification.\n"), allow_unverified=True)
    assert [a.artifact for a in ok.unverified] == [art]


# ----------------------------------------------------------------------------- 6. receipt sign


def _ec_key(path: Path, mode: int) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(mode)
    return path


def _sign(tmp_path: Path, rc: Path, key: Path):
    from test_bad_inputs import _env, run_cli

    env, _ = _env(tmp_path)
    return run_cli(["receipt", "sign", rc, "--signing-key", key], tmp_path, env, timeout=120)


def _lie_about_the_verdict(st) -> None:
    st["predicate"]["verification"]["mtp"]["acceptance"] = 0.12  # "pass" recorded, its figures fail it


def _retype_a_tensor(st) -> None:
    types = st["predicate"]["result"]["tensor_types"]
    name = next(iter(types))
    types[name] = "Q4_K" if types[name] != "Q4_K" else "Q8_0"


@pytest.mark.parametrize("edit", [_lie_about_the_verdict, _retype_a_tensor], ids=["verdict", "tensor-type"])
def test_receipt_sign_refuses_a_receipt_its_own_audit_fails(edit, tmp_path):
    """`receipt sign` signed any sealed receipt whose files had the recorded digests, a "pass" its
    own figures fail included: the audit runs first."""
    art = synth_artifact(tmp_path / "r")
    st = honest_statement(art, "pass")
    edit(st)
    rc = art.with_name(art.name + ".receipt.json")
    rc.write_text(json.dumps(seal(st)))  # sealed: the checksum holds
    before = rc.read_bytes()
    ran = _sign(tmp_path, rc, _ec_key(tmp_path / "key.pem", 0o600))
    assert ran.rc == 1 and "audit fails" in ran.err and "Traceback" not in ran.err, ran.err
    assert rc.read_bytes() == before and not art.with_name(art.name + ".sig").exists()


@pytest.mark.runtime  # three signing processes: ~2 s
def test_a_private_key_others_can_read_is_used_with_one_warning_line(tmp_path):
    art = synth_artifact(tmp_path / "w")
    rc = art.with_name(art.name + ".receipt.json")
    rc.write_text(json.dumps(honest_statement(art, "pass")))
    ran = _sign(tmp_path, rc, _ec_key(tmp_path / "open.pem", 0o644))
    assert ran.rc == 0, ran.err
    warnings = [line for line in ran.err.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning:") and "open.pem" in warnings[0], ran.err
    assert "anyone" in warnings[0] and "0644" in warnings[0]
    rc.write_text(json.dumps(honest_statement(art, "pass")))
    ran = _sign(tmp_path, rc, _ec_key(tmp_path / "group.pem", 0o640))
    assert ran.rc == 0 and "group" in ran.err, ran.err
    rc.write_text(json.dumps(honest_statement(art, "pass")))
    ran = _sign(tmp_path, rc, _ec_key(tmp_path / "private.pem", 0o600))
    assert ran.rc == 0 and ran.err.strip() == "", ran.err
