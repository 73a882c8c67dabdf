"""k and the server settings on every command that verifies (issue #40, item 3): verify, run, ladder
(its command line and its file's ``[verify]`` table) and head-sweep take the same window, server
arguments and head-judging options, and the reference is measured with them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main

SHARED = ("--draft-n-max", "--spec-draft-n-max", "--server-arg", "--mtp-server-arg", "--vanilla-server-arg")
JUDGING = ("--reference", "--head-margin", "--absolute-acceptance")


@pytest.mark.parametrize("command", ["verify", "run", "ladder", "head-sweep"])
def test_every_verifying_command_takes_the_window_and_the_server_arguments(command):
    params = {o for p in main.commands[command].params for o in p.opts}
    missing = [o for o in SHARED if o not in params and not (command == "verify" and o == "--spec-draft-n-max")]
    assert not missing, f"{command} lacks {missing}"
    if command != "head-sweep":
        assert not [o for o in JUDGING if o not in params], command


def test_the_ladder_file_takes_the_window_the_reference_and_server_arguments(tmp_path):
    """Before #40 ``draft_n_max`` was refused in a ladder's [verify]."""
    from ggufmtp.ladder.spec import load_ladder_file

    f = tmp_path / "ladder.toml"
    f.write_text('model = "builtin:tiny-qwen35moe"\nrecipes = ["q8_0-mtp"]\n[verify]\ndraft_n_max = 2\n'
                 'reference = "ref.gguf"\nhead_margin = 0.05\nabsolute_acceptance = true\nserver_args = ["-ub", "256"]\n')
    o = load_ladder_file(f)["verify_options"]
    assert (o.draft_n_max, str(o.reference), o.judge.head_margin, o.judge.absolute_acceptance) == (2, "ref.gguf", 0.05, True)
    assert tuple(o.server.server_args) == ("-ub", "256")
    f.write_text('model = "m"\nrecipes = ["q8_0-mtp"]\n[verify]\nhead_margin = 0.9\n')
    r = CliRunner().invoke(main, ["ladder", "--ladder", str(f), "-o", str(tmp_path / "out")])
    assert r.exit_code != 0 and "head_margin" in r.output and "Traceback" not in r.output, r.output


def test_run_passes_the_window_and_judging_to_verify(monkeypatch, tmp_path):
    """``run --draft-n-max 2 --server-arg ... --head-margin`` reaches verify's options, with the
    source model as the reference (``--no-reference``: none)."""
    from ggufmtp import pipeline

    seen = {}

    def fake_run(recipe, model, options, **kw):
        seen["o"] = options
        raise SystemExit(0)

    monkeypatch.setattr(pipeline, "run", fake_run)
    args = ["run", "-r", "q8_0-mtp", "-m", "builtin:tiny-qwen35moe", "-o", str(tmp_path), "--draft-n-max", "2",
            "--server-arg=-ub 256", "--head-margin", "0.05"]
    CliRunner().invoke(main, args)
    o = seen["o"]
    assert o.verify_options.draft_n_max == 2 and tuple(o.verify_options.server.server_args) == ("-ub", "256")
    assert o.verify_options.judge.head_margin == 0.05 and o.reference_base is True
    CliRunner().invoke(main, [*args, "--no-reference"])
    assert seen["o"].reference_base is False
