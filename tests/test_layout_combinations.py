"""#50 item 4: layouts combine. ``ladder --layout sidecar --split-max-size 1M`` wrote a 1.67 MB trunk
as one file, silently, after minutes of work (main 480238f), and eed9fb2 refused the combination
instead: now the trunks are split by the pinned ``llama-gguf-split`` (the sidecar stays one
``mtp-`` file), and what ``-hf REPO:TAG --spec-type draft-mtp`` loads from the planned release
(ggufmtp/quant/hf_resolve.py) is checked before any work: what cannot combine is refused then."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import LadderError
from ggufmtp.ladder.spec import LadderSpec, Layout
from ggufmtp.provenance.audit import audit
from ggufmtp.provenance.receipt import default_receipt_path, read_receipt
from ggufmtp.quant.hf_resolve import resolve

MODEL = "builtin:tiny-qwen35moe"


def _spec(tmp_path: Path, **kw) -> LadderSpec:
    return LadderSpec(model=MODEL, out_dir=tmp_path, recipes=kw.pop("recipes", ("q8_0-mtp",)), **kw)


def test_every_layout_combines_with_a_split_size_and_a_repo_folder(tmp_path):
    for layout in Layout:
        for folder in (None, "gguf/v1"):
            _spec(tmp_path, layout=layout, split_max_size="1M", path_in_repo=folder,
                  recipes=("q8_0-mtp", "hifi-q4_k_m-mtp")).check()


def test_sidecars_that_tie_for_a_tag_are_refused_before_any_work(tmp_path):
    """Q4_0 and Q4_1 sidecars are equally near a Q8_0 trunk (4 bits each, neither named -Q8_0.):
    llama.cpp takes whichever the Hub lists first, so the pair verified may not be the pair served."""
    with pytest.raises(LadderError, match="ties between the sidecars .*mtp-M-Q4_0.gguf.*mtp-M-Q4_1.gguf|"
                                          "ties between the sidecars .*mtp-M-Q4_1.gguf.*mtp-M-Q4_0.gguf"):
        _spec(tmp_path, layout=Layout.SIDECAR, sidecars=("Q4_0", "Q4_1")).check()
    _spec(tmp_path, layout=Layout.SIDECAR, sidecars=("Q4_0", "Q8_0")).check()  # -Q8_0. names the Q8_0 trunk's


@pytest.mark.runtime  # quantizes with libllama and splits with llama-gguf-split
def test_a_sidecar_ladder_splits_its_trunks_and_serves_them_as_verified(tmp_path):
    out = tmp_path / "ladder"
    r = CliRunner().invoke(main, ["--no-progress", "ladder", "-m", MODEL, "-r", "q8_0-mtp", "--layout", "sidecar",
                                  "--split-max-size", "1M", "-o", str(out), "--no-verify"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    shards = sorted((out / "Q8_0").glob("*.gguf"))
    sidecar = out / "mtp-tiny-qwen35moe-Q8_0.gguf"
    assert len(shards) > 1 and all(s.stat().st_size <= 1_000_000 + 200_000 for s in shards), shards  # >1 MB whole
    assert not (out / "Q8_0" / "tiny-qwen35moe-Q8_0.gguf").exists()  # no unsplit trunk beside the shards
    rc = read_receipt(default_receipt_path(shards[0]))
    assert [s.name for s in rc.subjects] == [s.name for s in shards]
    assert rc.predicate["result"]["split"]["count"] == len(shards) and rc.predicate["pair"]["role"] == "trunk"
    assert audit(shards[0], sidecar=sidecar).ok
    # -hf REPO:Q8_0 --spec-type draft-mtp on the ladder's folder: every shard, and the sidecar as the draft
    listing = sorted(str(p.relative_to(out)) for p in out.rglob("*.gguf") if ".full" not in p.parts)
    got = resolve(listing, "Q8_0")
    assert got.model == f"Q8_0/{shards[0].name}" and got.draft == sidecar.name
    assert set(got.model_files) == {f"Q8_0/{s.name}" for s in shards}
    card = (out / "README.md").read_text()
    assert f"`:Q8_0` drafts with the sidecar `{sidecar.name}`" in card
    assert '--include "tiny-qwen35moe-Q8_0-*-of-' in card  # every shard downloaded for -m, not the first alone
