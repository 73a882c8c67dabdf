"""#50 item 3: layouts that cannot combine are refused before any work. ``ladder --layout sidecar
--split-max-size 1M`` wrote a 1.67 MB trunk as one file, silently, after minutes of work (main
480238f): the sidecar layout never splits its trunks."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main
from ggufmtp.errors import LadderError
from ggufmtp.ladder.spec import LadderSpec, Layout


def test_a_sidecar_ladder_with_a_split_size_is_refused_by_the_spec(tmp_path):
    with pytest.raises(LadderError, match="sidecar layout does not split its trunks"):
        LadderSpec(model="builtin:tiny-qwen35moe", out_dir=tmp_path, recipes=("q8_0-mtp",), layout=Layout.SIDECAR,
                   split_max_size="1M").check()
    # what does combine: the sidecar layout unsplit (default or none), the full layout split
    LadderSpec(model="builtin:tiny-qwen35moe", out_dir=tmp_path, recipes=("q8_0-mtp",), layout=Layout.SIDECAR).check()
    LadderSpec(model="builtin:tiny-qwen35moe", out_dir=tmp_path, recipes=("q8_0-mtp",), layout=Layout.SIDECAR,
               split_max_size="none").check()
    LadderSpec(model="builtin:tiny-qwen35moe", out_dir=tmp_path, recipes=("q8_0-mtp",), split_max_size="1M").check()


def test_the_cli_refuses_it_before_writing_anything(tmp_path):
    out = tmp_path / "ladder"
    r = CliRunner().invoke(main, ["ladder", "-m", "builtin:tiny-qwen35moe", "-r", "q8_0-mtp", "--layout", "sidecar",
                                  "--split-max-size", "1M", "-o", str(out), "--no-verify"])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert "sidecar layout does not split its trunks" in r.output
    assert not out.exists() or not any(out.rglob("*.gguf")), list(out.rglob("*"))
