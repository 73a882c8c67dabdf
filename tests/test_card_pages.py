"""Cards that are model pages (issue #41 item 5), single-variant and ladder: the model's title, the
files table with a reference row, which file to pick by memory, the download and run lines, the
prompt format, the metadata (base_model the original model, license inherited, quantized_by
settable, in the ladder file too) and numbers for people (no negative zero, no CI below the evidence
minimum, "not verified" never beside "pass"). Receipts are honest ones of real synthesized GGUFs
(tests/receipt_kit.py); the ladder card's rows come through the real audit."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from receipt_kit import honest_statement, synth_artifact

from ggufmtp.cli import main
from ggufmtp.fmt import divergence, significant
from ggufmtp.ladder.spec import load_ladder_file
from ggufmtp.provenance.card import UNVERIFIED_HEADING, card_text
from ggufmtp.provenance.card_page import PageOptions
from ggufmtp.provenance.head import HeadComparison, HeadPair, ReferenceModel
from ggufmtp.provenance.ladder_card import ladder_card_text, ladder_rows
from ggufmtp.provenance.receipt import seal
from ggufmtp.provenance.verdict import judge_record

REPO = "me/tiny-qwen35moe-MTP-GGUF"
QUALITY = {"corpus": {"name": "builtin:calib-v1"}, "chunks": 4, "ctx_size": 512, "commit": "0c1e570",
           "ppl": 23112138541.8518, "ppl_err": 1234.5, "ppl_base": 8.12345, "ppl_base_err": 0.05,
           "kld_mean": -0.0000001, "kld_mean_err": 0.0000002, "kld_p99_9": 0.0001, "same_top_p": 0.9876}


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> Path:
    return synth_artifact(tmp_path_factory.mktemp("pages"), "tiny-qwen35moe-Q4_K_M.gguf")


def _head(acceptances: tuple[float, float], recorded_preserved: bool | None = None, n_prompts: int = 10) -> dict:
    """A head section as verify records it: ``n_prompts`` prompts (seed 42) of 100 drafts each (the
    honest record's draft_n for 10), the artifact's and the reference's accepted counts."""
    pairs = tuple(HeadPair(f"p{i}", 42, "default", 100, round(100 * acceptances[0]), 100, round(100 * acceptances[1]))
                  for i in range(n_prompts))
    d = HeadComparison(ReferenceModel("tiny-qwen35moe-BF16.gguf", 27_000_000, "ab" * 32), 4, 0.03, n_prompts,
                       pairs, 128).to_dict()
    if recorded_preserved is not None:  # a recorded finding the card must never read
        d["findings"]["default"]["decision"] = "preserved" if recorded_preserved else "degraded"
    return d


def _hub(st: dict, repo: str = "Qwen/Qwen3.6-35B-A3B-GGUF", file: str = "Qwen3.6-35B-A3B-BF16.gguf") -> dict:
    st = copy.deepcopy(st)
    bm = st["predicate"]["base_model"]
    bm["source"] = {"type": "hub", "repo_id": repo, "revision": "main", "commit": "c" * 40, "license": "apache-2.0"}
    bm["files"][0]["name"] = file
    return seal(st)


def test_the_title_is_the_model_not_the_file(art):
    _, body = card_text(honest_statement(art))
    assert body.startswith("# tiny-qwen35moe MTP GGUF\n")
    _, body = card_text(_hub(honest_statement(art)))
    assert body.startswith("# Qwen3.6-35B-A3B MTP GGUF\n")


def test_the_files_table_has_each_column_and_a_reference_row(art):
    st = honest_statement(art, n_prompts=10, seeds=(42,))
    v = st["predicate"]["verification"]
    v["head"] = _head((0.70, 0.90), recorded_preserved=True)  # recorded "preserved"; the pairs say otherwise
    for d in (v, v["modes"]["default"]):  # the head drafts at 70%: above the minimum, 20 points below the reference
        d["mtp"].update(acceptance=0.7, draft_n_accepted=700)
    st["predicate"]["quality"] = copy.deepcopy(QUALITY)
    _, body = card_text(seal(st))
    table = body.split("## Files", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in table.splitlines() if line.startswith(f"| [{art.name}]"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "Q4_K_M" and cells[2].endswith("MiB")
    quality = body.split("## Quality", 1)[1].split("\n## ", 1)[0]
    assert "| 2.31e10 ± 1234 | 8.12 ± 0.050 | 0.000000 ± 0.000000 | 0.0001 | 98.76% |" in quality
    table = body.split("## MTP head", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in table.splitlines() if line.startswith(f"| `{art.name}`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].startswith("70.0% (95% CI")
    assert cells[2] == "-20.0 pts (95% CI -20.0 to -20.0), margin 3.0: degraded"  # re-derived from the pairs
    assert cells[3].startswith("1.40×")
    assert cells[4] == f"{judge_record(v).verdict.value} ({judge_record(v).findings.text()})"
    assert "head degraded" in cells[4] and cells[4].startswith("fail")
    ref = next(line for line in table.splitlines() if "tiny-qwen35moe-BF16.gguf" in line)
    assert "(reference, not in this repo)" in ref and "| 90.0% |" in ref
    assert UNVERIFIED_HEADING in body and "Verdict: **fail** (head degraded" in body


def test_download_and_run_lines_name_the_repo_tag_k_and_the_build(art):
    _, body = card_text(honest_statement(art), options=PageOptions(repo_id=REPO))
    run = body.split("## How to run", 1)[1]
    assert f'hf download {REPO} --include "{art.name}"' in run
    assert f"llama-server -hf {REPO}:Q4_K_M --spec-type draft-mtp --spec-draft-n-max 4\n" in run  # the k verified
    assert "`0c1e570`" in run and "draft-mtp" in run.split("Needs llama.cpp", 1)[1]
    assert "OWNER/REPO" not in body
    _, body = card_text(honest_statement(art))  # no repo given: a placeholder, said to be one
    assert "llama-server -hf OWNER/REPO:Q4_K_M" in body and "`OWNER/REPO`: the Hub repository" in body


def test_the_prompt_format_is_read_from_the_gguf(art, tmp_path):
    rc = tmp_path / "r.json"
    rc.write_text(json.dumps(honest_statement(art)))
    out = tmp_path / "README.md"
    r = CliRunner().invoke(main, ["card", str(art), "--receipt", str(rc), "-o", str(out)])
    assert r.exit_code == 0, r.output
    fmt = out.read_text().split("## Prompt format", 1)[1].split("\n## ", 1)[0]
    assert "ChatML (`<|im_start|>user ... <|im_end|>`)" in fmt  # the synthesized GGUF's template
    _, body = card_text(honest_statement(art))  # no GGUF at hand: the chat endpoint applies the template
    fmt = body.split("## Prompt format", 1)[1].split("\n## ", 1)[0]
    assert "`/v1/chat/completions`, which applies the chat template stored in the GGUF" in fmt


def test_metadata_base_model_license_and_quantized_by(art, tmp_path):
    meta, _ = card_text(_hub(honest_statement(art)))
    assert meta["base_model"] == "Qwen/Qwen3.6-35B-A3B-GGUF" and meta["license"] == "apache-2.0"
    st = honest_statement(art)
    st["predicate"]["base_model"]["converted_from"] = {"format": "safetensors", "repo_id": "Qwen/Qwen3.6-35B-A3B",
                                                      "commit": "d" * 40, "name": "Qwen3.6-35B-A3B",
                                                      "converter": "convert_hf_to_gguf.py", "outtype": "bf16",
                                                      "files": []}
    meta, body = card_text(seal(st))
    assert meta["base_model"] == "Qwen/Qwen3.6-35B-A3B" and body.startswith("# Qwen3.6-35B-A3B MTP GGUF\n")
    st = honest_statement(art)
    st["predicate"]["base_model"]["source"]["license"] = "apache-2.0"  # what the source GGUF's general.license gives
    rc = tmp_path / "r.json"
    rc.write_text(json.dumps(seal(st)))
    out = tmp_path / "README.md"
    r = CliRunner().invoke(main, ["card", str(art), "--receipt", str(rc), "-o", str(out), "--quantized-by", "me",
                                  "--repo", REPO])
    assert r.exit_code == 0, r.output
    meta = yaml.safe_load(out.read_text().split("---")[1])
    assert meta["quantized_by"] == "me" and meta["license"] == "apache-2.0"
    assert f"llama-server -hf {REPO}:Q4_K_M" in out.read_text()
    ladder = tmp_path / "ladder.toml"
    ladder.write_text('model = "builtin:tiny-qwen35moe"\nrecipes = ["q8_0-mtp"]\nquantized_by = "me"\n')
    assert load_ladder_file(ladder)["quantized_by"] == "me"


def test_numbers_for_people():
    assert significant(23112138541.8518) == "2.31e10" and significant(8.12345) == "8.12"
    assert significant(123.456) == "123" and significant(0.5) == "0.500"
    assert divergence(-0.0000001) == "0.000000" and divergence(-0.0) == "0.000000" and divergence(0.0123) == "0.012300"
    assert divergence(-0.5) == "-0.500000"  # not numerical error: shown as measured


def test_no_ci_below_the_evidence_minimum_and_no_pass_when_not_verified(art):
    st = honest_statement(art, n_prompts=2, seeds=(42,))
    v = st["predicate"]["verification"]
    v["head"] = _head((0.9, 0.9), n_prompts=2)
    for d in (v, v["modes"]["default"]):  # the two prompts' 200 drafts
        d["mtp"].update(draft_n=200, draft_n_accepted=180)
    _, body = card_text(seal(st))
    assert UNVERIFIED_HEADING in body and "95% CI" not in body and "(1.35–1.45×)" not in body
    row = next(line for line in body.splitlines() if line.startswith(f"| `{art.name}`"))
    assert row.endswith("| not verified |") and "pass" not in row
    assert "Verdict: **not verified**" in body and "Verdict: **pass**" not in body
    assert "Runtime-verified" not in body and "MTP head verified" not in body


def test_the_ladder_card_is_a_model_page(tmp_path):
    pairs = []
    for i, (tag, n) in enumerate((("Q8_0", 54), ("Q4_K_M", 2))):
        a = synth_artifact(tmp_path / tag, f"tiny-qwen35moe-{tag}.gguf", seed=i)
        st = honest_statement(a, n_prompts=n)
        st["predicate"]["quality"] = {**QUALITY, "kld_mean": -0.0}
        rc = a.with_name(a.name + ".receipt.json")
        rc.write_text(json.dumps(seal(st)))
        pairs.append((a, rc))
    meta, body = ladder_card_text(ladder_rows(pairs), options=PageOptions(repo_id=REPO, quantized_by="me"))
    assert meta["quantized_by"] == "me" and body.startswith("# tiny-qwen35moe MTP GGUF\n")
    rows = [line for line in body.splitlines() if line.startswith("| [")]
    assert [r.split("]")[0] for r in rows] == ["| [tiny-qwen35moe-Q8_0.gguf", "| [tiny-qwen35moe-Q4_K_M.gguf"]
    rows = [line for line in body.split("## MTP head", 1)[1].splitlines() if line.startswith("| `tiny")]
    assert "pass (head meets the minimum; lossless; speed verified)" in rows[0] and "95% CI" in rows[0]
    assert rows[1].endswith("| not verified |") and "95% CI" not in rows[1] and "-0.000000" not in body
    assert body.index(UNVERIFIED_HEADING) > body.index(rows[1]) and "- `tiny-qwen35moe-Q4_K_M.gguf`:" in body
    assert f'hf download {REPO} --include "tiny-qwen35moe-Q8_0.gguf"' in body  # the verified pick
    assert f"llama-server -hf {REPO}:Q8_0 --spec-type draft-mtp --spec-draft-n-max 4" in body
    assert f"llama-server -hf {REPO}:Q4_K_M --spec-type draft-mtp --spec-draft-n-max 4" in body  # every file's line
    assert "## Files" in body and "## Prompt format" in body and "ChatML" in body


def test_the_ladder_card_links_and_downloads_under_path_in_repo(tmp_path):
    """#50 item 2, fails on 8641bee: with ``--path-in-repo DIR`` the files are DIR/NAME in the repo,
    and the card's ``hf download --include NAME`` selected nothing and its links pointed beside DIR."""
    pairs = []
    for i, tag in enumerate(("Q8_0", "Q4_K_M")):
        a = synth_artifact(tmp_path / tag, f"tiny-qwen35moe-{tag}.gguf", seed=i)
        rc = a.with_name(a.name + ".receipt.json")
        rc.write_text(json.dumps(seal(honest_statement(a, n_prompts=54))))
        pairs.append((a, rc))
    rows = ladder_rows(pairs)
    _, body = ladder_card_text(rows, options=PageOptions(repo_id=REPO, path_in_repo="gguf/v2/"))
    assert f'hf download {REPO} --include "gguf/v2/tiny-qwen35moe-Q8_0.gguf" --local-dir .' in body
    assert '--include "gguf/v2/*.gguf"' in body and "[tiny-qwen35moe-Q8_0.gguf](gguf/v2/tiny-qwen35moe-Q8_0.gguf)" in body
    assert '--include "tiny-qwen35moe' not in body and "](tiny-qwen35moe" not in body
    _, flat = ladder_card_text(rows, options=PageOptions(repo_id=REPO))  # no folder: the names as they are
    assert f'hf download {REPO} --include "tiny-qwen35moe-Q8_0.gguf" --local-dir .' in flat
