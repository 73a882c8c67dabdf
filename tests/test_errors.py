"""Errors carry their facts as fields (issue #32), not only in prose: the file at fault, the two
digests of a mismatch, the server's log."""

from __future__ import annotations

import json
import shutil

import pytest
from receipt_kit import honest_statement, synth_artifact, verification_record

from ggufmtp.errors import AuditDigestMismatch, AuditError, DigestMismatch, GgufmtpError, HubDigestMismatchError, ServerError
from ggufmtp.files.hashing import sha256_file
from ggufmtp.provenance.receipt import refuse_other_file, set_verification
from ggufmtp.runtime.server import LlamaServer, ServerConfig


def test_the_fields_and_the_classes_they_belong_to():
    e = HubDigestMismatchError("m", path="/x/a.gguf", expected="aa", actual="bb")
    assert isinstance(e, DigestMismatch) and isinstance(e, ValueError) and isinstance(e, GgufmtpError)
    assert (e.path, e.expected, e.actual, str(e)) == ("/x/a.gguf", "aa", "bb", "m")
    assert issubclass(AuditDigestMismatch, AuditError) and issubclass(AuditDigestMismatch, DigestMismatch)
    assert GgufmtpError("plain").path is None


@pytest.fixture
def receipted(tmp_path):
    art = synth_artifact(tmp_path / "a")
    rc = art.with_name(art.name + ".receipt.json")
    rc.write_text(json.dumps(honest_statement(art, None)))
    return art, rc


def test_a_verification_of_other_bytes_names_both_digests(receipted, tmp_path):
    art, rc = receipted
    other = synth_artifact(tmp_path / "b", seed=1)
    with pytest.raises(AuditDigestMismatch) as ei:
        set_verification(rc, verification_record(sha256_file(other), other.stat().st_size))
    assert (ei.value.expected, ei.value.actual) == (sha256_file(art), sha256_file(other))


def test_a_model_of_another_size_names_both_digests(receipted, tmp_path):
    art, rc = receipted
    bigger = tmp_path / "bigger.gguf"
    shutil.copy(art, bigger)
    with open(bigger, "ab") as f:
        f.write(b"\0" * 64)
    with pytest.raises(AuditDigestMismatch) as ei:
        refuse_other_file(rc, bigger)
    e = ei.value
    assert e.path == str(bigger) and e.expected == sha256_file(art) and e.actual == sha256_file(bigger)


def test_a_server_that_fails_to_start_names_its_log(llama_server_bin, tmp_path):
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    log = tmp_path / "server.log"
    with pytest.raises(ServerError) as ei, LlamaServer(ServerConfig(bad, threads=1, log_path=log, ctx_size=256)):
        pass
    assert ei.value.log_path == str(log) and log.is_file() and str(log) in str(ei.value)
