"""Every byte served is bound (issue #49, item 4). llama-server loads a split model from its first
shard and reads the MTP head from the last: verify hashes every shard before the servers start,
records them (``model.shards``) and checks them unchanged after the run, so another model's
same-size last shard served during the run and put back afterwards is caught; audit and the upload
gate refuse a split verification that does not name every shard of the receipt. An MTP sidecar
whose receipt is absent, or names another source than the trunk's, is refused by audit and the
gate. Two synthesized models of one shape: the default one and another seed of it."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import HubRefusedError, VerifyError
from ggufmtp.files.hashing import sha256_file
from ggufmtp.hub.gate import check_publishable
from ggufmtp.measure.core.options import JudgeOptions, VerifyOptions
from ggufmtp.measure.verify.run import verify
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import default_receipt_path, read_receipt, seal, set_verification, write_statement
from ggufmtp.provenance.verdict import Thresholds

NAME = "tiny-qwen35moe"
TH = Thresholds(min_acceptance=0.5, min_speedup=1.1, source="test")


def _options(**kw) -> VerifyOptions:
    return VerifyOptions(seeds=(42,), limit=2, max_tokens=16, ctx_size=1024, draft_n_max=3,
                         judge=JudgeOptions(thresholds=TH), **kw)


def _other(synth_model) -> Path:
    """Another model of the same shape: another seed, so other weights and another head."""
    from ggufmtp.synth.builtin import BUILTIN_MODELS

    return synth_model(dataclasses.replace(BUILTIN_MODELS[NAME], seed=1))


def _split(model: Path, out: Path) -> tuple[list[Path], Path]:
    res = CliRunner().invoke(main, ["quantize", str(model), "-r", "q8_0-mtp", "-o", str(out), "--split-max-size", "1M",
                                    "--json"])
    assert res.exit_code == 0, res.output
    made = json.loads(res.stdout)
    return [Path(p) for p in made["shards"]], Path(made["receipt"])


@pytest.fixture(scope="module")
def sets(llama_runtime, synth_model, tmp_path_factory):
    """The model's split set and another model's, of the same recipe: shards of the same sizes."""
    d = tmp_path_factory.mktemp("sets")
    mine, rc = _split(synth_model(NAME), d / "mine" / "tiny-Q8_0.gguf")
    theirs, _ = _split(_other(synth_model), d / "theirs" / "tiny-Q8_0.gguf")
    assert len(mine) >= 3 and [p.stat().st_size for p in mine] == [p.stat().st_size for p in theirs]
    assert sha256_file(mine[-1]) != sha256_file(theirs[-1])
    return mine, rc, theirs


def _copy(shards: list[Path], rc: Path, where: Path) -> tuple[list[Path], Path]:
    where.mkdir()
    for p in (*shards, rc):
        shutil.copy(p, where / p.name)
    return [where / p.name for p in shards], where / rc.name


def test_a_last_shard_swapped_during_verify_and_put_back_is_caught(sets, tmp_path, llama_server_bin):
    """The attack: after the shards were hashed, another model's last shard (the MTP head) takes the
    set's place while a draft window's server loads it, then the original inode is put back (a
    hardlink, so even its device, inode, size and mtime are the hashed ones)."""
    mine, rc, theirs = sets
    shards, _ = _copy(mine, rc, tmp_path / "set")
    last, kept = shards[-1], tmp_path / "kept.gguf"
    first_k: list[int] = []

    def swap(rec) -> None:
        if not first_k:  # the first window's first request: swap in the other model's last shard
            first_k.append(rec.k)
            os.link(last, kept)
            shutil.copy(theirs[-1], tmp_path / "theirs.gguf")
            os.replace(tmp_path / "theirs.gguf", last)
        elif rec.k != first_k[0] and kept.exists():  # the next window's server has loaded it: put ours back
            os.replace(kept, last)

    with pytest.raises(VerifyError, match=f"model .*{last.name}: changed during the run"):
        verify(shards[0], _options(sweep=(2,)), progress=False, on_record=swap)
    assert not kept.exists() and sha256_file(last) == sha256_file(mine[-1])  # the set is back as it was


def test_a_split_verification_names_every_shard_and_audit_and_the_gate_check_them(sets, tmp_path, llama_server_bin):
    mine, rc_made, theirs = sets
    shards, rc = _copy(mine, rc_made, tmp_path / "set")
    v = verify(shards[0], _options(), progress=False).to_receipt()
    first_only = copy.deepcopy(v)  # what a verification of the first shard alone recorded (main, 480238f)
    first_only["model"].pop("shards", None)
    swapped = copy.deepcopy(v)  # another model's last shard named as served
    swapped["model"]["shards"] = [{"name": p.name, "sha256": sha256_file(p)} for p in (*shards[:-1], theirs[-1])]
    for bad, why in ((first_only, "names only the first of the"), (swapped, f"served shard {shards[-1].name} with "
                                                                             f"sha256 {sha256_file(theirs[-1])}")):
        st = copy.deepcopy(read_receipt(rc).statement)
        st["predicate"]["verification"] = bad
        write_statement(rc, seal(st))
        report = audit(shards[0], rc, progress=False)
        assert [c.name for c in report.failures] == ["verification of every shard"], report.checks
        assert why in report.failures[0].detail
        with pytest.raises(HubRefusedError, match=f"verification of every shard: .*{why}"):
            check_publishable({p: sha256_file(p) for p in shards}, [rc], allow_unverified=True)

    assert v["model"]["shards"] == [{"name": p.name, "sha256": sha256_file(p)} for p in shards]
    set_verification(rc, v)
    report = audit(shards[0], rc, progress=False)
    assert report.ok, report.failures
    assert any(c.name == "verification of every shard" and c.ok for c in report.checks)


@pytest.fixture(scope="module")
def pairs(llama_runtime, synth_model, tmp_path_factory):
    """A trunk and sidecar of the model, and another model's sidecar named as the model's is, each
    with the receipt ``ggufmtp sidecar`` writes."""
    from ggufmtp.provenance.pair import pair_receipt_writer
    from ggufmtp.quant.sidecar import SidecarOptions, make_sidecar

    d = tmp_path_factory.mktemp("pairs")
    out = {}
    for who, model in (("mine", synth_model(NAME)), ("theirs", _other(synth_model))):
        (d / who).mkdir()
        side, trunk = d / who / f"mtp-{NAME}-Q8_0.gguf", d / who / f"{NAME}-Q8_0.gguf"
        make_sidecar(model, side, SidecarOptions(recipe="Q8_0", trunk_out=trunk), before_publish=pair_receipt_writer())
        out[who] = (trunk, side)
    return out


def test_a_sidecar_without_its_receipt_or_of_another_source_is_refused(pairs, tmp_path, llama_server_bin):
    """The issue's case: the trunk verified with another model's sidecar whose receipt is not beside
    it (verify lets the user try a pair; nothing binds it). Audit of the pair and the gate refuse
    it; with that sidecar's receipt beside it, they name its other source."""
    trunk_made, _ = pairs["mine"]
    _, foreign_made = pairs["theirs"]
    d = tmp_path / "up"
    d.mkdir()
    trunk, side = d / trunk_made.name, d / foreign_made.name
    for f in (trunk_made, default_receipt_path(trunk_made), foreign_made):
        shutil.copy(f, d / f.name)
    elsewhere = tmp_path / "receipts" / default_receipt_path(foreign_made).name  # its receipt, not beside it
    elsewhere.parent.mkdir()
    shutil.copy(default_receipt_path(foreign_made), elsewhere)

    res = verify(trunk, _options(sidecar=side), progress=False)
    set_verification(default_receipt_path(trunk), res.to_receipt())
    report = audit(trunk, sidecar=side, progress=False)
    assert [c.name for c in report.failures] == [f"pairs with {side.name}"], report.checks
    assert f"{side.name} has no receipt" in report.failures[0].detail
    artifacts = {trunk: sha256_file(trunk), side: sha256_file(side)}
    with pytest.raises(HubRefusedError, match=f"pairs with {side.name}: {side.name} has no receipt"):
        check_publishable(artifacts, [default_receipt_path(trunk), elsewhere], allow_unverified=True)

    shutil.copy(elsewhere, default_receipt_path(side))  # beside it now: it names the other model's source
    assert "belongs to another model" in audit(trunk, sidecar=side, progress=False).failures[0].detail
    with pytest.raises(HubRefusedError, match="belongs to another model"):
        check_publishable(artifacts, [default_receipt_path(trunk), default_receipt_path(side)], allow_unverified=True)
