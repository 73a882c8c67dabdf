"""llama.cpp's own downloader on repos ggufmtp published (issue #41, item 4).

A ladder of ``builtin:tiny-qwen35moe-trained`` goes up with ``ggufmtp ladder --upload`` to the
local Hub (tests/fakehub.py, the real huggingface_hub client), and the pinned llama-server runs it
the way the uploaded card says: the card's ``llama-server -hf REPO:TAG --spec-type draft-mtp ...``
line, as written, with each of the card's tags after the colon, ``MODEL_ENDPOINT`` pointed at the
local Hub and an empty ``LLAMA_CACHE`` (only the listening address, threads and ``--no-repack`` are
added, as for every server ggufmtp starts). Nothing is resolved here: llama.cpp lists the repo
(``/api/models/REPO/refs``, ``/tree/COMMIT?recursive=true``), picks the file for the tag and any
``mtp-`` sidecar, downloads them (``HEAD``/``GET /resolve``, the LFS redirect to the CDN) and
serves. The test checks which files it downloaded and loaded, and that it drafted (accepted draft
tokens in ``/metrics``). A trunk-only variant with its MTP sidecar (``ggufmtp sidecar
--trunk-only``), uploaded with ``ggufmtp upload``, is served the same way: ``-hf`` takes the sidecar
as the draft model.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakehub import FakeHub, isolate_hf_client

from ggufmtp.cli import main
from ggufmtp.measure.core.suite import load_suite
from ggufmtp.runtime.server import LlamaServer, ServerConfig

MODEL = "builtin:tiny-qwen35moe-trained"
LADDER_REPO, PAIR_REPO = "me/tiny-trained-MTP-GGUF", "me/tiny-trained-pair"
TOKEN = "hf_serveTOKEN"
# short verifications (8 prompts x 64 tokens is the publishable minimum); the head's margin is wide
# because this test is about serving what was published, not about judging a 3-point margin
LADDER_ARGS = ("--imatrix-corpus", "builtin:calib-v1", "--imatrix-chunks", "2", "--seeds", "42", "--limit", "8",
               "--max-tokens", "64", "-t", "1", "--head-margin", "0.5")


def _cli(*argv: str, env: dict[str, str] | None = None) -> str:
    r = CliRunner().invoke(main, ["--no-progress", *argv], env=env)
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    return r.output


@pytest.fixture(scope="module")
def hub(tmp_path_factory, llama_server_bin):
    """The local Hub with the ladder (``ladder --upload``) and the pair (``sidecar``, ``upload``)."""
    root = tmp_path_factory.mktemp("hf-serve")
    with pytest.MonkeyPatch.context() as mp, FakeHub(tokens=(TOKEN,)) as fake:
        isolate_hf_client(root / "hf_home", mp)
        mp.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
        env = {"HF_TOKEN": TOKEN, "HF_ENDPOINT": fake.url}
        _cli("ladder", "-m", MODEL, "-r", "q8_0-mtp", "-r", "hifi-q4_k_m-mtp", *LADDER_ARGS,
             "-o", str(root / "ladder"), "--upload", LADDER_REPO, env=env)
        _publish_pair(root / "pair", env)
        yield fake


def _publish_pair(d: Path, env: dict[str, str]) -> None:
    """A trunk-only Q8_0 and its MTP sidecar, their card, in one commit (``--allow-unverified``: the
    pair is not verified here, and the card names both files under Not verified)."""
    d.mkdir()
    trunk, sidecar = d / "tiny-qwen35moe-trained-Q8_0.gguf", d / "mtp-tiny-qwen35moe-trained-Q8_0.gguf"
    _cli("sidecar", MODEL, "-r", "Q8_0", "--trunk-only", str(trunk), "-o", str(sidecar))
    _cli("card", str(trunk), "--repo", PAIR_REPO, "-o", str(d / "README.md"))
    card = (d / "README.md").read_text()  # the card describes the trunk; the sidecar is named by hand
    (d / "README.md").write_text(card.replace("## Not verified\n", f"## Not verified\n\n- `{sidecar.name}`\n", 1))
    _cli("upload", PAIR_REPO, str(trunk), str(sidecar), "--receipt", f"{trunk}.receipt.json",
         "--receipt", f"{sidecar}.receipt.json", "--card", str(d / "README.md"), "--allow-unverified", env=env)


def _card(fake: FakeHub, repo: str) -> str:
    return fake.file(repo, "README.md").decode()


def _run_line(card: str, repo: str) -> list[str]:
    """The card's ``llama-server -hf REPO:TAG ...`` line, as argv (environment assignments first)."""
    lines = [ln for ln in card.splitlines() if re.match(rf"^(\w+=\S+ )*llama-server -hf {re.escape(repo)}:", ln)]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def _tags(card: str) -> dict[str, str]:
    """TAG -> file of the card's files table (rows linking a published file and naming its tag)."""
    rows = re.findall(r"^\| \[([^\]]+\.gguf)\]\([^)]+\) \| ([^|]+?) \|", card, re.MULTILINE)
    return {tag: f for f, tag in rows if tag != "-"}


def _serve(fake: FakeHub, argv: list[str], tag: str, cache: Path) -> tuple[str, str, int]:
    """Run ``argv`` (the card's line) with ``tag`` after the colon on an empty llama.cpp cache:
    (the model file loaded, the log's draft line, accepted draft tokens over two chat replies)."""
    env = {k: v for k, v in (a.split("=", 1) for a in argv if re.match(r"^\w+=", a))}
    argv = [a for a in argv if not re.match(r"^\w+=", a)]
    assert argv[:2] == ["llama-server", "-hf"], argv
    repo = argv[2].split(":", 1)[0]
    cfg = ServerConfig(model=None, hf_repo=f"{repo}:{tag}", extra_args=argv[3:], ctx_size=1024, threads=1,
                       env={**env, "MODEL_ENDPOINT": fake.url, "LLAMA_CACHE": str(cache)})
    prompts = load_suite().prompts[:2]
    with LlamaServer(cfg) as srv:
        model = srv.props()["model_path"]
        before = srv.spec_counters()
        for p in prompts:
            srv.chat(p.chat_messages(), max_tokens=48, seed=42, cache_prompt=False)
        counted = srv.spec_counters().since(before)
        log = Path(srv.log_path).read_text()
    draft = re.search(r"(loading draft model|creating MTP draft context against the target model) '([^']+)'", log)
    assert draft, log[-3000:]
    assert counted.draft_tokens > 0, f"-hf {repo}:{tag} did not draft"
    return model, draft.group(0), counted.accepted


def _downloaded(fake: FakeHub, repo: str) -> set[str]:
    return {r.route.split("/resolve/", 1)[1].split("/", 1)[1] for r in fake.requests_to("GET", rf"^/{repo}/resolve/")}


def test_llama_server_hf_runs_each_ladder_variant_as_its_card_says(hub, tmp_path):
    """Each tag of the ladder's card loads that tag's file, downloaded alone from the local Hub into
    the empty cache, and drafts with the head inside it (no sidecar in this repo)."""
    card = _card(hub, LADDER_REPO)
    argv = _run_line(card, LADDER_REPO)
    assert "--spec-type" in argv and argv[argv.index("--spec-type") + 1] == "draft-mtp"
    tags = _tags(card)
    assert set(tags) == {"Q8_0", "Q4_K_M_HiFi"}, tags  # every variant of the ladder has its tag
    snapshot = f"models--{LADDER_REPO.replace('/', '--')}/snapshots/{hub.head(LADDER_REPO)}"
    for tag, file in tags.items():
        hub.requests.clear()
        cache = tmp_path / tag
        model, draft, accepted = _serve(hub, argv, tag, cache)
        assert model == str(cache / snapshot / file), (tag, model)
        assert draft == f"creating MTP draft context against the target model '{model}'"
        assert accepted > 0, tag
        assert _downloaded(hub, LADDER_REPO) == {file}


def test_llama_server_hf_takes_the_mtp_sidecar_beside_a_trunk_only_variant(hub, tmp_path):
    """A trunk-only file and ``mtp-<Model>-Q8_0.gguf``: ``-hf REPO:Q8_0 --spec-type draft-mtp`` (the
    card's line) loads the trunk, downloads the sidecar beside it and drafts with it."""
    argv = _run_line(_card(hub, PAIR_REPO), PAIR_REPO)
    snapshot = tmp_path / f"models--{PAIR_REPO.replace('/', '--')}" / "snapshots" / hub.head(PAIR_REPO)
    model, draft, accepted = _serve(hub, argv, "Q8_0", tmp_path)
    assert model == str(snapshot / "tiny-qwen35moe-trained-Q8_0.gguf")
    assert draft == f"loading draft model '{snapshot / 'mtp-tiny-qwen35moe-trained-Q8_0.gguf'}'"
    assert accepted > 0
    assert _downloaded(hub, PAIR_REPO) == {"tiny-qwen35moe-trained-Q8_0.gguf", "mtp-tiny-qwen35moe-trained-Q8_0.gguf"}


def test_a_server_serves_a_file_or_a_hub_reference_never_both():
    from ggufmtp.errors import ServerError
    from ggufmtp.runtime.server import build_command

    for model, hf in ((None, None), ("m.gguf", "me/r:Q8_0")):
        with pytest.raises(ServerError, match="either model .* or hf_repo"):
            ServerConfig(model=model, hf_repo=hf)
    argv = build_command(ServerConfig(model=None, hf_repo="me/r:Q8_0"), "llama-server", 8080)
    assert argv[1:3] == ["-hf", "me/r:Q8_0"] and "--model" not in argv
