"""``--receipt R`` of tune, tune-joint, curve and profiles adds the run's result to R's verification.
Found while writing the fastest-configuration how-to: on main ba092bc a receipt without a
verification was refused only after the whole run (a tune search is minutes on a GPU), with its
``-o`` file already written. Now the receipt is checked first: one error naming it and the way out,
non-zero exit, no server started and nothing written."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ggufmtp.cli import main

SOURCE = "builtin:tiny-qwen35moe"
RECIPE = "hifi-q4_k_m-mtp"

# the smallest run of each command (what main ran to the end before refusing)
RUNS = {
    "tune": ["--budget", "2", "--limit", "1", "--max-tokens", "8"],
    "tune-joint": ["--source", SOURCE, "-r", RECIPE, "--head-types", "Q8_0", "--no-own-head", "--head-limit", "4",
                   "--n-max-values", "2", "--p-min-values", "0", "--n-min-values", "0", "--budget", "2", "--limit", "1",
                   "--max-tokens", "8"],
    "curve": ["--rates", "0", "--no-real", "--limit", "1", "--max-tokens", "8"],
    "profiles": ["--workloads", "A", "--scale", "0.0625", "--num-requests", "1"],
}


@pytest.fixture(scope="module")
def unverified(tmp_path_factory, llama_runtime):
    """The tiny artifact and its receipt as quantize writes it: no verification section yet."""
    import ggufmtp

    d = tmp_path_factory.mktemp("unverified")
    q = ggufmtp.quantize(SOURCE, RECIPE, d / "tiny.gguf", progress=False)
    assert q.receipt is not None
    return q.output, q.receipt


@pytest.mark.runtime
@pytest.mark.parametrize("command", sorted(RUNS))
def test_a_receipt_without_a_verification_is_refused_before_the_run(command, unverified, tmp_path):
    model, receipt = unverified
    before = receipt.read_bytes()
    out = tmp_path / "result.json"
    r = CliRunner().invoke(main, [command, str(model), *RUNS[command], "--receipt", str(receipt), "-o", str(out)])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert r.output.count("error:") == 1 and "the receipt has no verification section yet" in r.output, r.output
    assert f"ggufmtp verify MODEL --receipt {receipt}" in r.output
    assert not out.exists(), "the run went ahead: its -o file was written before the receipt was refused"
    assert receipt.read_bytes() == before
