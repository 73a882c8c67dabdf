"""#50 item 3: what ``-hf`` loads is what was verified, on the repo's final listing. The pinned
llama-server makes any reachable ``mtp-`` file the draft of a variant with its own head
(``common/arg.cpp``; shown against the real server in test_hf_resolve_runtime.py), so a ladder
uploaded under ``--path-in-repo`` into a repo with a sidecar at its root would be served with that
sidecar, not the head it was verified with. The ladder lists the repo and refuses before any work
(and ``upload`` again on the final listing before the repo is touched); a sidecar the variant cannot
reach (a sibling folder) lets it go up."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client

from ggufmtp.cli import main
from ggufmtp.errors import HubRefusedError
from ggufmtp.hub.upload import UploadOptions, upload
from ggufmtp.provenance.receipt import default_receipt_path

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
        assert "in the repo me/root-sidecar, llama-server -hf REPO:TAG --spec-type draft-mtp would not serve" in r.output
        assert "-Q8_0.gguf has its own MTP head" in r.output and "loads mtp-other-Q4_0.gguf as its draft" in r.output
        assert len(fake.history("me/root-sidecar")) == 2  # the repo's first commit and the sidecar's: nothing sent
        assert not out.exists() or not any(out.rglob("*.gguf")), list(out.rglob("*"))  # refused before any work
        r = CliRunner().invoke(main, [*args, "me/folder-sidecar"], env=env)
        assert r.exit_code == 0 and "uploaded: " in r.output, r.output
        assert "v/tiny-qwen35moe-Q8_0.gguf" in fake.history("me/folder-sidecar")[0].files
        # a sidecar that reaches the variant arrives after the ladder listed the repo: upload itself refuses
        art = out / "Q8_0" / "tiny-qwen35moe-Q8_0.gguf"
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        with pytest.raises(HubRefusedError, match=r"would not load what was verified, so nothing was sent: "
                                                  r"v/tiny-qwen35moe-Q8_0.gguf has its own MTP head"):
            upload("me/root-sidecar", [art], [default_receipt_path(art)], out / "README.md",
                   UploadOptions(path_in_repo="v", allow_unverified=True, token=TOKEN), progress=False)
        assert len(fake.history("me/root-sidecar")) == 2
