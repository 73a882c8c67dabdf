"""#50 item 3: the simulated ``-hf`` resolver (ggufmtp/quant/hf_resolve.py) agrees with the pinned
llama-server's own on the local Hub, layout by layout.

Each repo is committed straight to the local Hub (tests/fakehub.py) from the tiny synthetic model
with its MTP head: its full file, its trunk and MTP-only sidecar (``quant/sidecar.py``), its shards
(``llama-gguf-split``). The pinned llama-server then runs ``-hf REPO:TAG --spec-type draft-mtp``
from an empty cache; the test compares what it downloaded, the model it loaded and its draft with
:func:`~ggufmtp.quant.hf_resolve.resolve` on the repo's listing in the Hub's order. The last layout is
the reported one: a variant with its own head in a folder below a root sidecar is served with
that sidecar as its draft.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from fakehub import FakeHub

from ggufmtp.quant.hf_resolve import resolve
from ggufmtp.quant.sidecar import SidecarOptions, make_sidecar
from ggufmtp.quant.split import SplitSize, split_gguf
from ggufmtp.runtime.server import LlamaServer, ServerConfig

# repo -> {path in the repo: which file}, and the tag asked for
LAYOUTS = {
    "me/full": ({"M-Q8_0.gguf": "full"}, "Q8_0"),
    "me/sidecar": ({"M-Q8_0.gguf": "trunk", "mtp-M-Q8_0.gguf": "sidecar"}, "Q8_0"),
    "me/split": ({"M-Q8_0.gguf": "full-split"}, "Q8_0"),
    "me/sidecar-split": ({"M-Q4_K_M.gguf": "trunk-split", "mtp-M-Q8_0.gguf": "sidecar", "mtp-M-Q4_0.gguf": "sidecar"},
                         "Q4_K_M"),
    # --path-in-repo: the variants in a folder; a sidecar at the root reaches them, one in a folder below does not
    "me/path-in-repo": ({"v/M-Q8_0.gguf": "full", "mtp-M-Q4_0.gguf": "sidecar", "v/w/mtp-M-Q8_0.gguf": "sidecar"},
                        "Q8_0"),
}


@pytest.fixture(scope="module")
def parts(tmp_path_factory, tiny_mtp_model) -> dict[str, dict[str, bytes]]:
    """Each kind of file as ``{suffix: bytes}`` (``""`` for one file, ``-0000i-of-0000N`` for shards)."""
    d = tmp_path_factory.mktemp("parts")
    make_sidecar(tiny_mtp_model, d / "mtp-side.gguf", SidecarOptions(trunk_out=d / "trunk.gguf", progress=False))
    out: dict[str, dict[str, bytes]] = {"full": {"": tiny_mtp_model.read_bytes()},
                                        "trunk": {"": (d / "trunk.gguf").read_bytes()},
                                        "sidecar": {"": (d / "mtp-side.gguf").read_bytes()}}
    for kind, src in (("full-split", tiny_mtp_model), ("trunk-split", d / "trunk.gguf")):
        shards = split_gguf(src, d / f"{kind}.gguf", SplitSize("4M"))
        assert len(shards) > 1, shards
        out[kind] = {s.name.removeprefix(kind).removesuffix(".gguf"): s.read_bytes() for s in shards}
    return out


def _listing(fake: FakeHub, repo: str) -> list[str]:
    """The repo's files in the order llama.cpp reads them (``hf_cache::get_repo_files``: the tree API)."""
    url = f"{fake.url}/api/models/{repo}/tree/{fake.head(repo)}?recursive=true"
    with urllib.request.urlopen(url) as r:
        return [e["path"] for e in json.load(r) if e["type"] == "file"]


def _served(fake: FakeHub, repo: str, tag: str, cache: Path) -> tuple[str, str | None, set[str]]:
    """What llama-server -hf REPO:TAG --spec-type draft-mtp loaded (model, draft or None: its own
    head), and what it downloaded, as paths in the repo."""
    cfg = ServerConfig(model=None, hf_repo=f"{repo}:{tag}", extra_args=["--spec-type", "draft-mtp"], ctx_size=512,
                       threads=1, env={"MODEL_ENDPOINT": fake.url, "LLAMA_CACHE": str(cache)})
    with LlamaServer(cfg) as srv:
        model = srv.props()["model_path"]
        log = Path(srv.log_path).read_text()
    snapshot = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / fake.head(repo)
    drafted = re.search(r"loading draft model '([^']+)'", log)
    own = re.search(r"creating MTP draft context against the target model", log)
    assert drafted or own, log[-3000:]
    got = {r.route.split("/resolve/", 1)[1].split("/", 1)[1] for r in fake.requests_to("GET", rf"^/{repo}/resolve/")}
    rel = str(Path(model).relative_to(snapshot))
    return rel, str(Path(drafted.group(1)).relative_to(snapshot)) if drafted else None, got


def test_the_simulation_loads_what_llama_server_hf_loads(parts, tmp_path, llama_server_bin):
    with FakeHub() as fake:
        for repo, (files, _) in LAYOUTS.items():
            blobs = {}
            for path, kind in files.items():
                for suffix, data in parts[kind].items():
                    blobs[path.removesuffix(".gguf") + suffix + ".gguf"] = data
            fake.commit(repo, blobs)
        for repo, (_, tag) in LAYOUTS.items():
            listing = _listing(fake, repo)
            want = resolve(listing, tag)
            fake.requests.clear()
            model, draft, downloaded = _served(fake, repo, tag, tmp_path / repo.replace("/", "-"))
            assert (model, draft) == (want.model, want.draft), repo
            assert downloaded == set(want.files), repo
    # what the layouts show (the simulation's answers, now known to be llama.cpp's)
    first = {k: next(iter(v)) for k, v in parts.items()}  # a split file's first shard's suffix
    expected = {"me/full": ("M-Q8_0.gguf", None), "me/sidecar": ("M-Q8_0.gguf", "mtp-M-Q8_0.gguf"),
                "me/split": (f"M-Q8_0{first['full-split']}.gguf", None),
                "me/sidecar-split": (f"M-Q4_K_M{first['trunk-split']}.gguf", "mtp-M-Q4_0.gguf"),
                "me/path-in-repo": ("v/M-Q8_0.gguf", "mtp-M-Q4_0.gguf")}
    for repo, (m, dr) in expected.items():
        files, tag = LAYOUTS[repo]
        listing = sorted(p.removesuffix(".gguf") + s + ".gguf" for p, k in files.items() for s in parts[k])
        assert (resolve(listing, tag).model, resolve(listing, tag).draft) == (m, dr), repo
