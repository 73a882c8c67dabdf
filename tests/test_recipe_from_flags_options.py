"""``recipe from-flags`` takes the llama-quantize options ``quantize`` takes, with the same meaning
(#51 leftover): ``--tensor-type-file`` (its items after the ``--tensor-type`` ones),
``--override-kv``, ``--include-weights``/``--exclude-weights``; what a recipe cannot hold
(``--dry-run``, ``--keep-split``, ``--prune-layers``, ``--max-buffer-size``) is refused with a
pointer and nothing is written. On main each of them was "has no recipe equivalent"."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.gguf.model import GGUFModel
from ggufmtp.imatrix import check as imc
from ggufmtp.imatrix import format as imx
from ggufmtp.quant.flags import recipe_from_flags
from ggufmtp.quant.recipe import Recipe


def test_the_options_become_the_recipe_s_fields_in_quantize_s_order(tmp_path):
    (tmp_path / "types.txt").write_text("attn_v=q8_0  ffn_down=q5_0\nnextn\\.eh_proj=bf16\n")
    line = ["--tensor-type", "attn_q=q6_k", "--tensor-type-file", str(tmp_path / "types.txt"),
            "--override-kv", "general.name=str:from a flag", "--override-kv", "ggufmtp.test.n=int:3",
            "--include-weights", "ffn_down", "--imatrix", "im.gguf", "in.gguf", "out.gguf", "Q4_K_M"]
    rec = recipe_from_flags(line)
    assert [(r.pattern, r.type) for r in rec.rules] == [("attn_q", "Q6_K"), ("attn_v", "Q8_0"), ("ffn_down", "Q5_0"),
                                                       (r"nextn\.eh_proj", "BF16")]
    assert rec.kv_overrides == ("general.name=str:from a flag", "ggufmtp.test.n=int:3")
    assert rec.include_weights == ("ffn_down",) and rec.imatrix == "required"
    back = tmp_path / "r.toml"  # the TOML holds them, and loads back to the same recipe
    back.write_text(rec.to_toml())
    loaded = Recipe.load(back)
    assert (loaded.rules, loaded.kv_overrides, loaded.include_weights) == (rec.rules, rec.kv_overrides,
                                                                             rec.include_weights)
    assert recipe_from_flags(["--exclude-weights", "attn", "Q8_0"]).exclude_weights == ("attn",)


@pytest.mark.parametrize(("flag", "pointer"), [
    (["--dry-run"], "quantize --dry-run"),
    (["--keep-split"], "--split-max-size"),
    (["--prune-layers", "1,2"], "MTP block"),
    (["--max-buffer-size", "64"], "default buffer"),
])
def test_what_a_recipe_cannot_hold_is_refused_with_a_pointer(flag, pointer, tmp_path):
    out = tmp_path / "r.toml"
    res = CliRunner().invoke(main, ["recipe", "from-flags", "-o", str(out), "--", *flag, "in.gguf", "o.gguf", "Q4_K_M"])
    assert res.exit_code == 1 and flag[0] in res.output and pointer in res.output, res.output
    assert "Traceback" not in res.output and list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("llama_runtime")
def test_a_recipe_from_the_options_quantizes_as_the_options_do(synth_model, tmp_path):
    """``quantize -r (recipe from-flags LINE)`` writes what ``quantize LINE`` writes: the same tensor
    types, the overridden keys, the imatrix entries the filter kept."""
    model = synth_model("tiny-qwen35moe")
    im = tmp_path / "tiny.imatrix.gguf"
    imx.write_imatrix(imc.synthetic_imatrix(imc.read_model_tensors(model), seed=3, mtp_blocks=[]), im)
    (tmp_path / "types.txt").write_text("attn_v=q8_0 ffn_down=q5_0\n")
    flags = ["--tensor-type-file", str(tmp_path / "types.txt"), "--override-kv", "ggufmtp.test.n=int:3",
             "--exclude-weights", "attn_q", "--imatrix", str(im)]
    direct = tmp_path / "direct.gguf"
    res = CliRunner().invoke(main, ["quantize", "--no-progress", "--no-receipt", *flags, str(model), str(direct),
                                    "Q4_K_M"])
    assert res.exit_code == 0, res.output
    toml = tmp_path / "from-flags.toml"
    res = CliRunner().invoke(main, ["recipe", "from-flags", "-o", str(toml), "--", *flags, str(model), "o.gguf",
                                    "Q4_K_M"])
    assert res.exit_code == 0, res.output
    via = tmp_path / "via.gguf"
    res = CliRunner().invoke(main, ["quantize", "--no-progress", "--no-receipt", "-r", str(toml), "--imatrix", str(im),
                                    str(model), "-o", str(via)])
    assert res.exit_code == 0, res.output
    a, b = GGUFModel(direct), GGUFModel(via)
    assert a.type_table() == b.type_table() and a.type_table()["blk.3.attn_v.weight"] == "Q8_0"
    kept = len([n for n in imx.read_imatrix(im).entries if "attn_q" not in n])
    for m in (a, b):
        assert m.metadata["ggufmtp.test.n"] == 3 and m.metadata["quantize.imatrix.entries_count"] == kept
    assert Path(toml).read_text().count("exclude_weights") == 1
