"""llama-quantize's whole option list in ``ggufmtp quantize`` (#51 item 2): ``--tensor-type-file``,
``--override-kv``, ``--include-weights``/``--exclude-weights`` give the pinned llama-quantize
binary's bytes on the same line; ``--dry-run`` writes nothing and prints the plan; ``--keep-split``,
``--prune-layers`` and ``--max-buffer-size`` are refused with a pointer (usage error, exit 2).
On the old main every one of them was "No such option"."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import RecipeError
from ggufmtp.gguf.model import GGUFModel
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import format as imx
from ggufmtp.quant.kv import kept_entries, parse_kv_override
from ggufmtp.runtime import build as runtime


@pytest.fixture(scope="module")
def model(synth_model) -> Path:
    return synth_model("tiny-qwen35moe")


@pytest.fixture(scope="module")
def imatrix(model, tmp_path_factory) -> Path:
    """An imatrix over every tensor, the MTP block's too (written once, by name in its folder)."""
    path = tmp_path_factory.mktemp("imx") / "tiny.imatrix.gguf"
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(model), seed=3, mtp_blocks=[]), path)
    return path


def _both(model: Path, flags: list[str], folder: Path, *, theirs_flags: list[str] | None = None,
          cwd: Path | None = None) -> tuple[bytes, bytes]:
    """(ggufmtp quantize's output, llama-quantize's) for ``llama-quantize FLAGS MODEL OUT Q4_K_M``
    (``theirs_flags``, run in ``cwd``: the same line with the imatrix named as ggufmtp records it)."""
    ours, theirs = folder / "ours.gguf", folder / "theirs.gguf"
    res = CliRunner().invoke(main, ["quantize", "--no-progress", "--no-receipt", "--json", *flags, str(model),
                                    str(ours), "Q4_K_M"])
    assert res.exit_code == 0, res.output
    proc = subprocess.run([str(runtime.find_binary("llama-quantize")), *(theirs_flags or flags), str(model),
                           str(theirs), "Q4_K_M"], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return ours.read_bytes(), theirs.read_bytes()


@pytest.mark.usefixtures("llama_runtime")
def test_tensor_type_file_gives_llama_quantizes_bytes(model, tmp_path):
    # spaces and newlines both separate items, as llama-quantize's `file >> arg` reads them
    (tmp_path / "types.txt").write_text("attn_v=q8_0  ffn_down=q5_0\nnextn\\.eh_proj=bf16\n")
    ours, theirs = _both(model, ["--tensor-type-file", str(tmp_path / "types.txt")], tmp_path)
    assert ours == theirs
    types = GGUFModel(tmp_path / "ours.gguf").type_table()
    assert types["blk.3.attn_v.weight"] == "Q8_0" and types["blk.0.ffn_down_exps.weight"] == "Q5_0"
    assert types["blk.4.nextn.eh_proj.weight"] == "BF16"


@pytest.mark.usefixtures("llama_runtime")
def test_override_kv_of_every_type_gives_llama_quantizes_bytes(model, tmp_path):
    kvs = ["general.name=str:renamed by a flag", "ggufmtp.test.count=int:-7", "ggufmtp.test.scale=float:0.25",
           "ggufmtp.test.flag=bool:true"]
    ours, theirs = _both(model, [a for kv in kvs for a in ("--override-kv", kv)], tmp_path)
    assert ours == theirs
    md = GGUFModel(tmp_path / "ours.gguf").metadata
    assert md["general.name"] == "renamed by a flag" and md["ggufmtp.test.count"] == 7  # u32 of |int|, as llama-quant
    assert md["ggufmtp.test.scale"] == 0.25 and md["ggufmtp.test.flag"] is True


@pytest.mark.usefixtures("llama_runtime")
@pytest.mark.parametrize("flag", ["--include-weights", "--exclude-weights"])
def test_imatrix_entry_filters_give_llama_quantizes_bytes(model, imatrix, flag, tmp_path):
    # the imatrix by its name from its folder: ggufmtp records the name, llama-quantize what it is given
    filters = [flag, "ffn_down", flag, "attn_q"]
    ours, theirs = _both(model, ["--imatrix", str(imatrix), *filters], tmp_path,
                         theirs_flags=["--imatrix", imatrix.name, *filters], cwd=imatrix.parent)
    assert ours == theirs
    entries = imx.read_imatrix(imatrix).entries
    kept = [n for n in entries if ("ffn_down" in n or "attn_q" in n) == (flag == "--include-weights")]
    assert 0 < len(kept) < len(entries)
    assert GGUFModel(tmp_path / "ours.gguf").metadata["quantize.imatrix.entries_count"] == len(kept)
    full = tmp_path / "full.gguf"  # the filter changed the bytes: it is not a no-op that happens to agree
    res = CliRunner().invoke(main, ["quantize", "--no-progress", "--no-receipt", "--imatrix", str(imatrix), str(model),
                                    str(full), "Q4_K_M"])
    assert res.exit_code == 0, res.output
    assert full.read_bytes() != ours


def test_weight_filters_and_overrides_are_checked_as_llama_cpp_reads_them():
    names = ["blk.0.ffn_down.weight", "blk.0.attn_q.weight", "output.weight"]
    assert kept_entries(names, ["ffn"], []) == names[:1]
    assert kept_entries(names, [], ["ffn", "output"]) == names[1:2]
    with pytest.raises(RecipeError, match="cannot be used together"):
        kept_entries(names, ["a"], ["b"])
    assert parse_kv_override("a.b=bool:false").value is False
    for bad, said in (("a.b=int:x", "not an int"), ("a.b=bool:yes", "true or false"), ("a.b", "malformed"),
                      ("a.b=list:1", "int, float, bool or str"), ("a=str:" + "x" * 128, "127 bytes")):
        with pytest.raises(RecipeError, match=said):
            parse_kv_override(bad)


@pytest.mark.usefixtures("llama_runtime")
def test_dry_run_runs_plan_and_writes_nothing(model, tmp_path):
    out = tmp_path / "never.gguf"
    res = CliRunner().invoke(main, ["quantize", "--dry-run", "--json", str(model), str(out), "Q4_K_M"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    assert plan["ftype"] == "Q4_K_M" and plan["size_bytes"] > 0 and plan["mtp_status"] == "complete"
    assert list(tmp_path.iterdir()) == []
    res = CliRunner().invoke(main, ["quantize", "--dry-run", str(model), "Q4_K_M"])  # OUT is optional, as there
    assert res.exit_code == 0 and "total" in res.output, res.output


@pytest.mark.parametrize(("flag", "pointer"), [
    (["--keep-split"], "--split-max-size"),
    (["--prune-layers", "1,2"], "MTP block"),
    (["--max-buffer-size", "64"], "default buffer"),
])
def test_options_without_a_place_are_refused_with_a_pointer(flag, pointer, tmp_path):
    res = CliRunner().invoke(main, ["quantize", *flag, "in.gguf", str(tmp_path / "o.gguf"), "Q4_K_M"])
    assert res.exit_code == 2, res.output
    assert f"No such option '{flag[0]}'" in res.stderr and pointer in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == []
