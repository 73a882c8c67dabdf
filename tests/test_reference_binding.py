"""The reference is the source (issue #49, item 2): the head is judged against the model the
artifact was quantized from, by sha256, or a more precise variant of it whose own receipt names
that source; never the artifact's bytes (a copy, a hardlink), never another model. Each refused
before anything is quantized or served, naming both digests; ``audit`` and the upload gate re-check
the binding the verification recorded. Two synthesized models: the default one (the source) and
``-f20`` (another model, whose head drafts a wrong successor for a fifth of the tokens)."""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import AuditError, HubRefusedError, VerifyError
from ggufmtp.files.hashing import sha256_file
from ggufmtp.measure.core.options import JudgeOptions, VerifyOptions
from ggufmtp.measure.verify.run import verify
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import default_receipt_path, read_receipt, seal, set_verification, write_statement
from ggufmtp.provenance.verdict import Thresholds

TH = Thresholds(min_acceptance=0.5, min_speedup=1.1, source="test")
SOURCE, OTHER = "tiny-qwen35moe", "tiny-qwen35moe-f20"


def _options(reference, **kw) -> VerifyOptions:
    return VerifyOptions(seeds=(42,), limit=3, max_tokens=24, draft_n_max=3, reference=reference,
                         judge=JudgeOptions(thresholds=TH), **kw)


def _quantized(source: Path, ftype: str, out: Path) -> Path:
    """``source`` quantized to ``ftype`` at ``out``, with its receipt beside it (as quantize writes it)."""
    from ggufmtp.provenance.receipt import receipt_for_quantize
    from ggufmtp.quant.quantize import quantize
    from ggufmtp.quant.recipe import Recipe

    out.parent.mkdir(parents=True, exist_ok=True)
    q = quantize(source, Recipe.from_dict({"name": f"{ftype.lower()}-test", "ftype": ftype, "imatrix": "none"}), out,
                 progress=False)
    receipt_for_quantize(q)
    return q.output


@pytest.fixture(scope="module")
def made(synth_model, tmp_path_factory, llama_runtime):
    """The artifact (Q4_K_M of the source) and the candidate references: a Q8_0 of the same source,
    a Q8_0 of another model, both with their receipts."""
    d = tmp_path_factory.mktemp("binding")
    src, other = synth_model(SOURCE), synth_model(OTHER)
    return {"dir": d, "source": src, "other": other,
            "art": _quantized(src, "Q4_K_M", d / "art" / "tiny-Q4_K_M.gguf"),
            "q8": _quantized(src, "Q8_0", d / "q8" / "tiny-Q8_0.gguf"),
            "other_q8": _quantized(other, "Q8_0", d / "other" / "tiny-Q8_0.gguf")}


def _never_served(art, reference, match):
    """verify refuses before any server starts: no request is ever recorded."""
    served = []
    with pytest.raises(VerifyError, match=match):
        verify(art, _options(reference), progress=False, on_record=served.append)
    assert served == []


def test_a_copy_or_a_hardlink_of_the_artifact_is_refused_as_its_reference(made, tmp_path, llama_server_bin):
    """The issue's case: the artifact judged against its own bytes is "preserved" whatever it is.
    A copy that even carries the artifact's receipt (which names the right source) is refused, and
    so is one given to a bare GGUF (no receipt at all): the digest alone decides."""
    art = made["art"]
    sha = sha256_file(art)
    copy_ = tmp_path / "copy" / "tiny-BF16.gguf"
    copy_.parent.mkdir()
    shutil.copy(art, copy_)
    shutil.copy(default_receipt_path(art), default_receipt_path(copy_))
    link = tmp_path / "link.gguf"
    os.link(art, link)
    for ref in (copy_, link):
        _never_served(art, ref, f"reference {ref.name} \\(sha256 {sha}\\) is the artifact's own bytes")
    bare = tmp_path / "bare" / art.name  # the artifact without a receipt beside it
    bare.parent.mkdir()
    shutil.copy(art, bare)
    _never_served(bare, copy_, "is the artifact's own bytes")


def test_another_model_is_refused_naming_both_digests(made, llama_server_bin):
    """Another model (itself, or a variant with a receipt naming its own source), or a variant of
    the source that is no more precise than the artifact: refused before serving, the error naming
    the reference's digest and the source's."""
    art, src_sha = made["art"], sha256_file(made["source"])
    other_sha = sha256_file(made["other"])
    _never_served(art, made["other"], f"reference .* \\(sha256 {other_sha}\\) is not the artifact's source \\(sha256 "
                                      f"{src_sha}\\), and no receipt beside it")
    _never_served(art, made["other_q8"], f"its receipt says it was made from source sha256 {other_sha}, another model")
    # the Q4_K_M as the reference of the Q8_0: the same source, but less of it than the artifact holds
    _never_served(made["q8"], art, "no more precise than the artifact")
    res = CliRunner().invoke(main, ["verify", str(art), "--reference", str(made["other"]), "--limit", "1"])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert other_sha in res.output and src_sha in res.output, res.output


def test_run_and_ladder_refuse_another_model_before_quantizing(made, tmp_path, llama_server_bin):
    from ggufmtp.ladder.run import run_ladder
    from ggufmtp.ladder.spec import LadderSpec
    from ggufmtp.pipeline import run
    from ggufmtp.run_options import RunOptions

    other_sha = sha256_file(made["other"])
    out = tmp_path / "run"
    with pytest.raises(VerifyError, match=f"sha256 {other_sha}\\) is not the artifact's source"):
        run(str(made["source"]), "q8_0-mtp", RunOptions(verify_options=_options(str(made["other"]))), out_dir=out,
            progress=False)
    assert not list(out.rglob("*.gguf"))  # nothing quantized
    lad = tmp_path / "ladder"
    with pytest.raises(VerifyError, match=f"sha256 {other_sha}\\) is not the artifact's source"):
        run_ladder(LadderSpec(model=str(made["source"]), recipes=("q8_0-mtp",), out_dir=lad,
                              verify_options=_options(str(made["other"]))), progress=False)
    assert not list(lad.rglob("*.gguf"))


@pytest.fixture(scope="module")
def by_variant(made, llama_server_bin):
    """The artifact judged against the Q8_0 of its source (where BF16 would not fit)."""
    return verify(made["art"], _options(made["q8"]), progress=False)


def _forged(receipt: Path, v: dict, tmp_path: Path) -> Path:
    """The receipt with ``v`` as its verification, re-sealed as an editor who recomputes the checksum
    would (``set_verification`` itself refuses an unbound head)."""
    st = copy.deepcopy(read_receipt(receipt).statement)
    st["predicate"]["verification"] = v
    out = tmp_path / f"forged-{len(list(tmp_path.glob('forged-*')))}.json"
    write_statement(out, seal(st))
    return out


def test_a_more_precise_variant_with_its_receipt_is_bound_and_audit_rechecks_it(made, by_variant, tmp_path):
    """The accepted other reference records what proved it; audit passes it and fails every
    recorded binding that does not hold for this receipt (a forged one included)."""
    art, q8 = made["art"], made["q8"]
    ref = by_variant.to_receipt()["head"]["reference"]
    assert ref["bound"] == {"by": "reference receipt", "source_sha256": [sha256_file(made["source"])],
                            "receipt_sha256": sha256_file(default_receipt_path(q8)),
                            "bpw": read_receipt(default_receipt_path(q8)).predicate["result"]["bpw"]}
    assert "reference bound to: a variant of the artifact's source, by its receipt" in by_variant.table()
    rc = tmp_path / "r.json"
    shutil.copy(default_receipt_path(art), rc)
    set_verification(rc, by_variant.to_receipt())
    report = audit(art, rc, progress=False)
    assert report.ok, report.failures
    assert any(c.name == "head reference is the source" and c.ok for c in report.checks)

    v = by_variant.to_receipt()
    other_sha = sha256_file(made["other"])
    forgeries = {
        "as main wrote it, another model's digest": lambda h: (h["reference"].pop("bound"),
                                                              h["reference"].update(sha256=other_sha)),
        "another model claimed as the source": lambda h: h["reference"].update(
            sha256=other_sha, bound={"by": "source", "source_sha256": [other_sha]}),
        "a variant of another source": lambda h: h["reference"]["bound"].update(source_sha256=[other_sha]),
        "a variant less precise than the artifact": lambda h: h["reference"]["bound"].update(bpw=1.0),
        "the artifact's own bytes": lambda h: h["reference"].update(sha256=sha256_file(art)),
    }
    for what, forge in forgeries.items():
        bad = copy.deepcopy(v)
        forge(bad["head"])
        report = audit(art, _forged(rc, bad, tmp_path), progress=False)
        failed = [c for c in report.failures if c.name == "head reference is the source"]
        assert failed, (what, report.checks)


def test_a_bare_gguf_gives_an_unbound_head_that_no_receipt_takes(made, tmp_path, llama_server_bin):
    """Without a receipt nothing names the artifact's source: the head is measured and said to be
    unbound; a receipt refuses that verification, and a forged one fails audit and the gate."""
    from ggufmtp.hub.gate import check_publishable

    art = made["art"]
    bare = tmp_path / "bare" / art.name
    bare.parent.mkdir()
    shutil.copy(art, bare)
    res = verify(bare, _options(made["source"]), progress=False)
    v = res.to_receipt()
    assert v["head"]["reference"]["bound"] == {"by": "none"}
    assert any("the head finding is unbound" in n for n in res.notes), res.notes
    rc = tmp_path / "r.json"
    shutil.copy(default_receipt_path(art), rc)
    with pytest.raises(AuditError, match="verified without the artifact's receipt"):
        set_verification(rc, v)
    forged = _forged(rc, v, tmp_path)
    assert not audit(art, forged, progress=False).ok
    with pytest.raises(HubRefusedError, match="head reference is the source: the head was judged against"):
        check_publishable({art: sha256_file(art)}, [forged], allow_unverified=True)
    # given the artifact's receipt, the same run is bound to the source
    bound = verify(bare, _options(made["source"]), progress=False, receipt=default_receipt_path(art))
    assert bound.to_receipt()["head"]["reference"]["bound"] == {"by": "source", "source_sha256": [
        sha256_file(made["source"])]}


def test_the_binding_rule_on_designed_digests():
    """:func:`bind_reference` alone (no runtime): a split source is bound by all its shards, not by
    its first; a variant needs its receipt's source to be the very set and more bits per weight;
    any shared digest with the artifact is refused first, whatever else holds."""
    from ggufmtp.provenance.binding import BoundBy, ReferenceFacts, bind_reference

    a, b, c, art = ("a" * 64, "b" * 64), "c" * 64, "d" * 64, "e" * 64
    source = frozenset(a)
    assert bind_reference(ReferenceFacts("src", a), source, [art], 4.5).by == BoundBy.SOURCE
    with pytest.raises(VerifyError, match="not the artifact's source"):  # the first shard alone is not the source
        bind_reference(ReferenceFacts("src", a[:1]), source, [art], 4.5)
    q8 = ReferenceFacts("q8", (c,), source, b, 8.5)
    bound = bind_reference(q8, source, [art], 4.5)
    assert bound.to_dict() == {"by": "reference receipt", "source_sha256": sorted(a), "receipt_sha256": b, "bpw": 8.5}
    for ref, artifact_bpw, why in ((q8, 8.5, "no more precise"), (ReferenceFacts("q8", (c,), frozenset(a[:1]), b, 8.5),
                                                                   4.5, "another model"),
                                   (ReferenceFacts("copy", (art,), source, b, 8.5), 4.5, "the artifact's own bytes")):
        with pytest.raises(VerifyError, match=why):
            bind_reference(ref, source, [art], artifact_bpw)
    assert bind_reference(ReferenceFacts("src", a), None, [art], None).by == BoundBy.NONE  # no receipt: unbound
    with pytest.raises(VerifyError, match="own bytes"):
        bind_reference(ReferenceFacts("copy", (art,)), None, [art], None)
