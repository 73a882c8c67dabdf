"""llama.cpp's own downloader on repos ggufmtp published (issue #41, item 4).

Ladders of ``builtin:tiny-qwen35moe-trained`` go up with ``ggufmtp ladder --upload`` to the local
Hub (tests/fakehub.py, the real huggingface_hub client): every variant with its head (``full``),
trunk-only variants with an MTP sidecar (``--layout sidecar``), and a variant in shards
(``--split-max-size``). The pinned llama-server then runs each repo the way its uploaded card says:
the card's ``llama-server -hf REPO:TAG --spec-type draft-mtp ...`` line, as written, with each of
the card's tags after the colon, ``MODEL_ENDPOINT`` pointed at the local Hub and an empty
``LLAMA_CACHE`` (only the listening address, threads and ``--no-repack`` are added, as for every
server ggufmtp starts). Nothing is resolved here: llama.cpp lists the repo
(``/api/models/REPO/refs``, ``/tree/COMMIT?recursive=true``), picks the file for the tag, its split
siblings and any ``mtp-`` sidecar, downloads them (``HEAD``/``GET /resolve``, the LFS redirect to
the CDN) and serves. The test checks which files it downloaded and loaded, what it drafted with,
and that it drafted (accepted draft tokens in ``/metrics``).
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
TOKEN = "hf_serveTOKEN"
# layout -> (repo, the ladder's own arguments, the tags its card must name)
LADDERS = {
    "full": ("me/tiny-trained-MTP-GGUF", ("-r", "q8_0-mtp", "-r", "hifi-q4_k_m-mtp"), {"Q8_0", "Q4_K_M_HiFi"}),
    "sidecar": ("me/tiny-trained-pair", ("-r", "q8_0-mtp", "-r", "hifi-q4_k_m-mtp", "--layout", "sidecar"),
                {"Q8_0", "Q4_K_M_HiFi"}),
    "split": ("me/tiny-trained-split", ("-r", "q8_0-mtp", "--split-max-size", "1M"), {"Q8_0"}),
    # #50 item 4: trunks in shards beside one sidecar (the trunk was written whole, or the layouts refused)
    "sidecar-split": ("me/tiny-trained-pair-split", ("-r", "q8_0-mtp", "-r", "hifi-q4_k_m-mtp", "--layout", "sidecar",
                                                     "--split-max-size", "1M"), {"Q8_0", "Q4_K_M_HiFi"}),
}
# short verifications (8 prompts x 64 tokens), too few to decide a trained head at 8 prompts on every
# machine: this test is about serving what was published, not about judging the head, so the ladder
# publishes with --allow-unverified (the card then says so) whatever the head finding
LADDER_ARGS = ("--imatrix-corpus", "builtin:calib-v1", "--imatrix-chunks", "2", "--seeds", "42", "--limit", "8",
               "--max-tokens", "64", "-t", "1", "--head-margin", "0.10", "--allow-unverified")


def _cli(*argv: str, env: dict[str, str] | None = None) -> str:
    r = CliRunner().invoke(main, ["--no-progress", *argv], env=env)
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    return r.output


@pytest.fixture(scope="module")
def hub(tmp_path_factory, llama_server_bin):
    """The local Hub with one repo per layout, each written by ``ladder --upload``."""
    root = tmp_path_factory.mktemp("hf-serve")
    with pytest.MonkeyPatch.context() as mp, FakeHub(tokens=(TOKEN,)) as fake:
        isolate_hf_client(root / "hf_home", mp)
        mp.delenv("GGUFMTP_PUBLIC_KEY", raising=False)
        for layout, (repo, args, _) in LADDERS.items():
            r = CliRunner().invoke(main, ["--no-progress", "ladder", "-m", MODEL, *args, *LADDER_ARGS, "-o",
                                          str(root / layout), "--upload", repo],
                                   env={"HF_TOKEN": TOKEN, "HF_ENDPOINT": fake.url})
            # exit 1 where a head is undecided at 8 prompts (the ladder says so), but the release went up
            assert "uploaded: " in r.output and "Traceback" not in r.output, r.output
            assert r.exit_code == 0 or "inconclusive" in r.output, r.output
        yield fake


def _run_lines(card: str, repo: str) -> dict[str, list[str]]:
    """The card's ``llama-server -hf REPO:TAG ...`` lines, one per file, as argv (environment
    assignments first), by TAG."""
    lines = [ln for ln in card.splitlines() if re.match(rf"^(\w+=\S+ )*llama-server -hf {re.escape(repo)}:", ln)]
    out: dict[str, list[str]] = {}
    for ln in lines:
        argv = shlex.split(ln)
        tag = next(a for a in argv if a.startswith(f"{repo}:")).split(":", 1)[1]
        assert tag not in out, lines
        out[tag] = argv
    return out


def _tags(card: str) -> dict[str, str]:
    """TAG -> file of the card's files table (rows linking a published file and naming its tag)."""
    rows = re.findall(r"^\| \[([^\]]+\.gguf)\]\([^)]+\)(?: \(\d+ shards\))? \| ([^|]+?) \|", card, re.MULTILINE)
    return {tag: f for f, tag in rows if tag != "-"}


def _shards(first: str) -> set[str]:
    """A split model's every shard, named from its first (``-00001-of-0000N``); else the file."""
    m = re.fullmatch(r"(.+)-00001-of-(\d{5})\.gguf", first)
    return {f"{m.group(1)}-{i:05d}-of-{m.group(2)}.gguf" for i in range(1, int(m.group(2)) + 1)} if m else {first}


def _serve(fake: FakeHub, argv: list[str], tag: str, cache: Path) -> tuple[str, str, int]:
    """Run ``argv`` (the card's line) with ``tag`` after the colon on an empty llama.cpp cache:
    (the model file loaded, the log's draft line, accepted draft tokens over two chat replies)."""
    env = {k: v for k, v in (a.split("=", 1) for a in argv if re.match(r"^\w+=", a))}
    argv = [a for a in argv if not re.match(r"^\w+=", a)]
    assert argv[:2] == ["llama-server", "-hf"], argv
    repo = argv[2].split(":", 1)[0]
    cfg = ServerConfig(model=None, hf_repo=f"{repo}:{tag}", extra_args=argv[3:], ctx_size=1024, threads=1,
                       env={**env, "MODEL_ENDPOINT": fake.url, "LLAMA_CACHE": str(cache)})
    with LlamaServer(cfg) as srv:
        model = srv.props()["model_path"]
        before = srv.spec_counters()
        for p in load_suite().prompts[:2]:
            srv.chat(p.chat_messages(), max_tokens=48, seed=42, cache_prompt=False)
        counted = srv.spec_counters().since(before)
        log = Path(srv.log_path).read_text()
    draft = re.search(r"(loading draft model|creating MTP draft context against the target model) '([^']+)'", log)
    assert draft, log[-3000:]
    assert counted.draft_tokens > 0, f"-hf {repo}:{tag} did not draft"
    return model, draft.group(0), counted.accepted


def _downloaded(fake: FakeHub, repo: str) -> set[str]:
    return {r.route.split("/resolve/", 1)[1].split("/", 1)[1] for r in fake.requests_to("GET", rf"^/{repo}/resolve/")}


@pytest.mark.parametrize("layout", list(LADDERS))
def test_llama_server_hf_runs_each_variant_as_the_card_says(hub, tmp_path, layout):
    """Each tag of the card loads that tag's file (a split model's first shard), downloading only
    it, its shards and the sidecar into the empty cache, and drafts: with the head inside the file,
    or (trunk-only variants) with the ``mtp-`` sidecar beside it as the draft model."""
    repo, _, tags_expected = LADDERS[layout]
    card = hub.file(repo, "README.md").decode()
    runs = _run_lines(card, repo)
    tags = _tags(card)
    assert set(tags) == tags_expected, tags  # every variant of the ladder has its tag
    assert set(runs) == set(tags), runs  # and its own run line
    for argv in runs.values():
        assert "--spec-type" in argv and argv[argv.index("--spec-type") + 1] == "draft-mtp"
    sidecars = {f for f in hub.history(repo)[0].files if f.startswith("mtp-") and f.endswith(".gguf")}
    assert len(sidecars) == layout.startswith("sidecar"), sidecars
    for tag, file in tags.items():
        hub.requests.clear()
        cache = tmp_path / tag
        snapshot = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / hub.head(repo)
        model, draft, accepted = _serve(hub, runs[tag], tag, cache)
        assert model == str(snapshot / file), (tag, model)
        assert draft == (f"loading draft model '{snapshot / next(iter(sidecars))}'" if sidecars
                         else f"creating MTP draft context against the target model '{model}'"), draft
        assert accepted > 0, tag
        assert _downloaded(hub, repo) == _shards(file) | sidecars
        assert layout.endswith("split") == (len(_shards(file)) > 1)


def test_a_server_serves_a_file_or_a_hub_reference_never_both():
    from ggufmtp.errors import ServerError
    from ggufmtp.runtime.server import build_command

    for model, hf in ((None, None), ("m.gguf", "me/r:Q8_0")):
        with pytest.raises(ServerError, match="either model .* or hf_repo"):
            ServerConfig(model=model, hf_repo=hf)
    argv = build_command(ServerConfig(model=None, hf_repo="me/r:Q8_0"), "llama-server", 8080)
    assert argv[1:3] == ["-hf", "me/r:Q8_0"] and "--model" not in argv
