"""#50 item 3: what ``-hf`` loads is what was verified, on the repo's final listing. The pinned
llama-server makes any reachable ``mtp-`` file the draft of a variant with its own head
(``common/arg.cpp``; shown against the real server in test_hf_resolve_runtime.py), so a ladder
uploaded under ``--path-in-repo`` into a repo with a sidecar at its root would be served with that
sidecar, not the head it was verified with. The upload is refused before the repo is touched; a
sidecar the variant cannot reach (a sibling folder) lets it go up."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client

from ggufmtp.cli import main

TOKEN = "hf_listingTOKEN"


@pytest.mark.runtime
def test_a_variant_below_a_repo_sidecar_is_refused_and_one_beside_another_folder_goes_up(tmp_path, monkeypatch):
    isolate_hf_client(tmp_path / "hf_home", monkeypatch)
    out = tmp_path / "ladder"
    with FakeHub(tokens=(TOKEN,)) as fake:
        fake.commit("me/root-sidecar", {"mtp-other-Q4_0.gguf": b"GGUF-stand-in"})  # only its name matters to -hf
        fake.commit("me/folder-sidecar", {"w/mtp-other-Q4_0.gguf": b"GGUF-stand-in"})
        env = {"HF_TOKEN": TOKEN, "HF_ENDPOINT": fake.url}
        args = ["--no-progress", "ladder", "-m", "builtin:tiny-qwen35moe", "-r", "q8_0-mtp", "--no-verify",
                "--allow-unverified", "-o", str(out), "--path-in-repo", "v", "--upload"]
        r = CliRunner().invoke(main, [*args, "me/root-sidecar"], env=env)
        assert r.exit_code != 0 and "Traceback" not in r.output, r.output
        assert "v/tiny-qwen35moe-Q8_0.gguf has its own MTP head" in r.output and "mtp-other-Q4_0.gguf" in r.output
        assert len(fake.history("me/root-sidecar")) == 2  # the repo's first commit and the sidecar's: nothing sent
        r = CliRunner().invoke(main, [*args, "me/folder-sidecar"], env=env)
        assert r.exit_code == 0 and "uploaded: " in r.output, r.output
        assert "v/tiny-qwen35moe-Q8_0.gguf" in fake.history("me/folder-sidecar")[0].files
