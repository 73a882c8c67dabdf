"""The card as a model page (#50 item 1), single-variant and ladder: the YAML names the upstream
model (``--base-model``, else the pulled repo's card) with ``base_model_relation: quantized`` and
``quantized_by`` on every card; a Files table with each file's size and the GPU memory the memory
plan gives it; no table wider than six columns; the chat template as a block; download and run
lines for every file under ``--path-in-repo``; each file's findings in words; the imatrix credited;
the provenance in one section. Receipts are honest ones of real synthesized GGUFs
(tests/receipt_kit.py); the ladder's rows come through the real audit; the pulled repo is served by
the local Hub (tests/fakehub.py) and made into a card by the real pipeline."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client
from receipt_kit import honest_statement, synth_artifact

from ggufmtp.cli import main
from ggufmtp.fmt import human_bytes
from ggufmtp.gguf.reader import read_header
from ggufmtp.provenance.card import card_text
from ggufmtp.provenance.card_page import FileRow, PageOptions
from ggufmtp.provenance.head import HeadComparison, HeadPair, ReferenceModel
from ggufmtp.provenance.ladder_card import ladder_card_text, ladder_rows
from ggufmtp.provenance.receipt import read_receipt, seal
from ggufmtp.runtime.memory import ModelFacts, PlanInputs, Role, plan_memory
from ggufmtp.synth.spec import SynthSpec
from ggufmtp.synth.writer import synthesize

REPO = "me/tiny-qwen35moe-MTP-GGUF"
UPSTREAM = "Qwen/Qwen3.6-35B-A3B"
CONVERTED = {"format": "safetensors", "repo_id": UPSTREAM, "commit": "d" * 40, "name": "Qwen3.6-35B-A3B",
             "converter": "convert_hf_to_gguf.py", "outtype": "bf16", "files": []}


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> Path:
    return synth_artifact(tmp_path_factory.mktemp("page"), "tiny-qwen35moe-Q4_K_M.gguf")


def _receipted(folder: Path, tag: str, seed: int = 0, layers: int = 4, **figures) -> tuple[Path, Path]:
    """A synthesized GGUF named as a ladder names it and its honest receipt beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    a = synthesize(folder / f"tiny-qwen35moe-{tag}.gguf", SynthSpec(seed=seed, layers=layers), progress=False).path
    rc = a.with_name(a.name + ".receipt.json")
    rc.write_text(json.dumps(honest_statement(a, **figures)))
    return a, rc


def _card_cli(art: Path, tmp_path: Path, *args: str, out: str = "README.md"):
    """``ggufmtp card ART`` with its honest receipt and ``args``: (the result, the card's path)."""
    rc = tmp_path / "r.json"
    rc.write_text(json.dumps(honest_statement(art)))
    path = tmp_path / out
    return CliRunner().invoke(main, ["card", str(art), "--receipt", str(rc), "-o", str(path), *args]), path


def _tables(body: str) -> list[list[str]]:
    """Every markdown table of ``body``: its consecutive ``|`` lines."""
    out: list[list[str]] = [[]]
    for line in body.splitlines():
        if line.startswith("|"):
            out[-1].append(line)
        elif out[-1]:
            out.append([])
    return [t for t in out if t]


def _columns(row: str) -> int:
    return len(row.strip().strip("|").split("|"))


def _section(body: str, heading: str) -> str:
    return body.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def test_both_cards_name_the_upstream_model_as_quantized_with_quantized_by_and_the_license(art, tmp_path):
    """Fails on eed9fb2: no ``base_model_relation``, so the Hub's model tree does not list the release."""
    def converted(a: Path) -> dict:
        st = honest_statement(a)
        st["predicate"]["base_model"]["converted_from"] = copy.deepcopy(CONVERTED)
        st["predicate"]["base_model"]["source"]["license"] = "apache-2.0"
        return seal(st)

    meta, _ = card_text(converted(art), options=PageOptions(quantized_by="me"))
    assert (meta["base_model"], meta["base_model_relation"], meta["quantized_by"], meta["license"]) == (
        UPSTREAM, "quantized", "me", "apache-2.0")
    a, rc = _receipted(tmp_path / "Q8_0", "Q8_0")
    rc.write_text(json.dumps(converted(a)))
    meta, _ = ladder_card_text(ladder_rows([(a, rc)]), options=PageOptions(quantized_by="me"))
    assert (meta["base_model"], meta["base_model_relation"], meta["quantized_by"], meta["license"]) == (
        UPSTREAM, "quantized", "me", "apache-2.0")


def test_base_model_override_and_a_bad_one_refused_naming_it(art, tmp_path):
    """Fails on eed9fb2: ``card`` has no ``--base-model``; the receipt's pulled repo was the base model."""
    r, out = _card_cli(art, tmp_path, "--base-model", UPSTREAM)
    assert r.exit_code == 0, r.output
    meta = yaml.safe_load(out.read_text().split("---")[1])
    assert meta["base_model"] == UPSTREAM and meta["base_model_relation"] == "quantized"
    r, bad = _card_cli(art, tmp_path, "--base-model", "not a repo", out="bad.md")
    assert r.exit_code == 1 and "--base-model 'not a repo'" in r.output and "Traceback" not in r.output
    assert not bad.exists()
    meta, _ = ladder_card_text([FileRow.of(honest_statement(art), art.name, "r")],
                               options=PageOptions(base_model=UPSTREAM))
    assert meta["base_model"] == UPSTREAM and meta["base_model_relation"] == "quantized"


def test_base_model_is_read_from_the_pulled_repos_card(tmp_path, monkeypatch, llama_runtime):
    """Fails on eed9fb2: a pulled BF16-GGUF repo was the card's base_model (not its upstream), and
    ``run``'s card ignored ``quantized_by``. The local Hub serves a GGUF repo whose README names its
    upstream model and license; the real pipeline pulls, quantizes and writes the card."""
    import ggufmtp

    src = synth_artifact(tmp_path / "src", "Qwen3.6-35B-A3B-BF16.gguf")
    readme = f"---\nbase_model: {UPSTREAM}\nlicense: apache-2.0\ntags: [gguf]\n---\n# A GGUF conversion\n"
    isolate_hf_client(tmp_path / "hfhome", monkeypatch)
    with FakeHub() as fh:
        fh.create_repo(f"{UPSTREAM}-GGUF")
        fh.commit(f"{UPSTREAM}-GGUF", {src.name: src.read_bytes(), "README.md": readme.encode()})
        monkeypatch.setenv("HF_ENDPOINT", fh.url)
        res = ggufmtp.run(f"{UPSTREAM}-GGUF", "q8_0-mtp", ggufmtp.RunOptions(verify=False, quantized_by="me"),
                          out_dir=tmp_path / "run", progress=False)
    source = read_receipt(res.receipt).statement["predicate"]["base_model"]["source"]  # strict: the schema holds
    assert source["repo_id"] == f"{UPSTREAM}-GGUF" and source["upstream"] == UPSTREAM
    assert res.card is not None
    meta = yaml.safe_load(res.card.read_text().split("---")[1])
    assert (meta["base_model"], meta["base_model_relation"], meta["quantized_by"], meta["license"]) == (
        UPSTREAM, "quantized", "me", "apache-2.0")


def test_the_files_table_gives_each_file_its_size_and_the_planned_gpu_memory(tmp_path):
    """Fails on eed9fb2: one row per memory size from "size plus 10 %", a second estimator, and an
    11-column table. Each file's GPU memory is the memory plan's MTP server at the stated context."""
    pairs = [_receipted(tmp_path / "Q8_0", "Q8_0", layers=6), _receipted(tmp_path / "Q4_K_M", "Q4_K_M", seed=1)]
    _, body = ladder_card_text(ladder_rows(pairs), options=PageOptions(repo_id=REPO))
    files = _section(body, "## Files")
    header = next(line for line in files.splitlines() if line.startswith("| file |"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "file", "quant", "size", "GPU memory at 4K context", "what it is for"]  # the synthesized models' context
    for a, _ in pairs:
        row = next(line for line in files.splitlines() if line.startswith(f"| [{a.name}]"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        facts = ModelFacts.read(a)
        plan = plan_memory(PlanInputs(variant=facts, ctx_size=4096, draft_n_max=4), [1 << 60])
        mtp = next(s for s in plan.phases[0].servers if s.role == Role.MTP)
        assert cells[2] == human_bytes(a.stat().st_size) and cells[3] == human_bytes(mtp.gpu_total)
        assert mtp.gpu_total > a.stat().st_size + (1 << 30)  # the weights, the caches and the CUDA context
        assert cells[4]
    rows = [line for line in files.splitlines() if line.startswith("| [")]
    assert rows[0].startswith("| [tiny-qwen35moe-Q8_0.gguf]") and "**Recommended**" in rows[0]  # the larger
    assert "Recommended" not in rows[1]


def test_no_table_is_wider_than_six_columns(art, tmp_path):
    """Fails on eed9fb2: the Files table had 11 columns and the single card's Quality table 9."""
    st = honest_statement(art)
    st["predicate"]["quality"] = {"corpus": {"name": "builtin:calib-v1"}, "chunks": 4, "ctx_size": 512,
                                  "commit": "0c1e570", "ppl": 8.2, "ppl_base": 8.1, "kld_mean": 0.01,
                                  "kld_p99_9": 0.1, "same_top_p": 0.95}
    _, single = card_text(seal(st))
    pairs = [_receipted(tmp_path / t, t, seed=i) for i, t in enumerate(("Q8_0", "Q4_K_M"))]
    _, ladder = ladder_card_text(ladder_rows(pairs))
    for body in (single, ladder):
        tables = _tables(body)
        assert len(tables) >= 2
        assert max(_columns(row) for t in tables for row in t) <= 6


def test_the_chat_template_is_on_the_page_as_a_block(art, tmp_path):
    """Fails on eed9fb2: the prompt format was one line naming the template's kind."""
    r, out = _card_cli(art, tmp_path)
    assert r.exit_code == 0, r.output
    template = read_header(art).metadata["tokenizer.chat_template"]
    fmt = _section(out.read_text(), "## Prompt format")
    assert f"```jinja\n{template}\n```" in fmt and "<details>" in fmt
    from ggufmtp.provenance.card_page import template_block

    block = "\n".join(template_block("{# a ``` and a ```` inside #}"))  # a fence the template cannot close
    assert "`````jinja\n{# a ``` and a ```` inside #}\n`````" in block


def test_download_and_run_lines_for_every_file_under_the_folder(art, tmp_path):
    """Fails on eed9fb2: only the picked file had its lines, and ``card`` took no ``--path-in-repo``
    (its links and --include named files beside the folder they are uploaded to)."""
    pairs = [_receipted(tmp_path / t, t, seed=i) for i, t in enumerate(("Q8_0", "Q4_K_M"))]
    _, body = ladder_card_text(ladder_rows(pairs), options=PageOptions(repo_id=REPO, path_in_repo="gguf/v2"))
    run = _section(body, "## How to run")
    for tag in ("Q8_0", "Q4_K_M"):
        assert f'hf download {REPO} --include "gguf/v2/tiny-qwen35moe-{tag}.gguf" --local-dir .' in run
        assert f"llama-server -hf {REPO}:{tag} --spec-type draft-mtp --spec-draft-n-max 4" in run
    r, out = _card_cli(art, tmp_path, "--repo", REPO, "--path-in-repo", "gguf/v2")
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert f"[{art.name}](gguf/v2/{art.name})" in text and f"llama-server -m gguf/v2/{art.name} " in text
    assert f'hf download {REPO} --include "gguf/v2/{art.name}" --local-dir .' in text
    assert f'--include "{art.name}"' not in text and f"]({art.name})" not in text


def _head(acceptances: tuple[float, float], n_prompts: int = 10) -> dict:
    """A head section as verify records it: ``n_prompts`` prompts (seed 42) of 100 drafts each."""
    pairs = tuple(HeadPair(f"p{i}", 42, "default", 100, round(100 * acceptances[0]), 100, round(100 * acceptances[1]))
                  for i in range(n_prompts))
    return HeadComparison(ReferenceModel("tiny-qwen35moe-BF16.gguf", 27_000_000, "ab" * 32), 4, 0.03, n_prompts,
                          pairs, 128).to_dict()


IMATRIX = {"file": "imatrix.gguf", "sha256": "ef" * 32, "format": "gguf", "datasets": ["builtin:calib-v1"],
           "chunk_count": 10, "entries": 30, "missing": [],
           "computed": {"corpus": {"name": "builtin:calib-v1", "sha256": "cd" * 32, "bytes": 81835}, "chunks": 10,
                        "ctx_size": 512, "runtime_commit": "0c1e570", "mtp": True, "mtp_entries": 7}}


def test_findings_in_words_the_imatrix_credited_and_the_provenance(tmp_path):
    """Fails on eed9fb2: no findings in words, no imatrix or dataset credit, no provenance summary.
    The head's decisions are re-derived from the recorded pairs (20 points below the reference:
    degraded; level with it: preserved), whatever the receipt says."""
    rows = []
    for i, (tag, acc) in enumerate((("Q8_0", (0.9, 0.9)), ("Q4_K_M", (0.7, 0.9)))):
        a = synth_artifact(tmp_path / tag, f"tiny-qwen35moe-{tag}.gguf", seed=i)
        st = honest_statement(a, acceptance=acc[0], n_prompts=10, seeds=(42,))
        st["predicate"]["verification"]["head"] = _head(acc)
        st["predicate"]["imatrix"] = copy.deepcopy(IMATRIX)
        row = FileRow.of(seal(st), a.name, a.name + ".receipt.json")
        rows.append(FileRow(**{**row.__dict__, "signed": True}))
    _, body = ladder_card_text(rows, options=PageOptions(repo_id=REPO))
    found = _section(body, "## Findings")
    q8 = next(line for line in found.splitlines() if line.startswith("- `tiny-qwen35moe-Q8_0.gguf`"))
    q4 = next(line for line in found.splitlines() if line.startswith("- `tiny-qwen35moe-Q4_K_M.gguf`"))
    assert "the MTP head is **preserved**: its drafts are accepted as often as the reference's" in q8
    assert "within the 3.0-point margin" in q8
    assert "the MTP head is **degraded**" in q4 and "20.0 points less often than the reference's" in q4
    assert "beyond the 3.0-point margin" in q4 and "accepted 70.0% of its drafts" in q4
    assert re.search(r"decoding ran 1\.40× as fast as vanilla llama-server .* on NVIDIA H100", q4)
    assert "Verdict: **fail (head degraded" in q4
    assert "Verdict: **not verified**" in q8 and "no binding recorded" in q8  # its reference is not bound to it
    im = _section(body, "## Importance matrix")
    assert "`builtin:calib-v1`, ggufmtp's own calibration text" in im and "10 chunks of 512 tokens" in im
    assert "the MTP head's own statistics (7 entries of the MTP block" in im
    assert "Used by `tiny-qwen35moe-Q8_0.gguf`, `tiny-qwen35moe-Q4_K_M.gguf`" in im
    prov = _section(body, "## Provenance")
    assert "all 2 are signed" in prov and "`ggufmtp audit FILE.gguf`" in prov and "receipt.json" in prov


def test_base_model_of_a_local_checkpoint_is_its_config_name_or_path(tmp_path):
    """Fails on eed9fb2: a GGUF converted from a local checkpoint had no base_model, though its
    config.json (``save_pretrained``'s ``_name_or_path``) names the Hub repo it came from."""
    from ggufmtp.files.fsutil import atomic_write_json
    from ggufmtp.hfconvert.convert import ConvertResult, source_record_path
    from ggufmtp.provenance.receipt import base_model_section

    meta, _ = ladder_card_text([])  # nothing known: no base_model claimed
    assert "base_model" not in meta
    for name_or_path, expected in ((UPSTREAM, UPSTREAM), ("/home/me/ckpt", None), ("./ckpt", None)):
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir(exist_ok=True)
        (ckpt / "config.json").write_text(json.dumps({"_name_or_path": name_or_path}))
        gguf = synth_artifact(tmp_path / "conv", "ckpt-bf16.gguf")
        res = ConvertResult(output=gguf, source=str(ckpt), source_dir=ckpt, outtype="bf16", architecture="qwen35moe",
                            block_count=5, nextn_predict_layers=1, mtp_status="complete", mtp_layers_in_config=1,
                            source_files={"model.safetensors": "ab" * 32})
        atomic_write_json(source_record_path(gguf), res.source_record())
        st = honest_statement(gguf)
        st["predicate"]["base_model"] = base_model_section(gguf)
        meta, _ = card_text(seal(st))
        assert meta.get("base_model") == expected, name_or_path
        assert (meta.get("base_model_relation") == "quantized") == (expected is not None)
