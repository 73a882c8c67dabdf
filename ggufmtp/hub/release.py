"""What a release's files load once they are in the repo: the repo's final listing (what is there
plus what goes up) through the simulated ``-hf`` resolver (:mod:`.resolve`), against how each
model file was verified (its receipt: with its own head, or with the sidecar it names).

An upload into a repo that already holds files can change what ``-hf REPO:TAG`` loads: an ``mtp-``
file at the root makes itself the draft of every variant below it, even one with its own head
(llama.cpp does not look at ``nextn_predict_layers``), and an older variant may answer the tag
first. :func:`final_listing_problems` names each such file before anything is committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import AuditError, GGUFReadError
from ..provenance.receipt import default_receipt_path, read_receipt
from ..quant.hf_resolve import Planned, is_model_file, release_problems, split_info
from ..quant.naming import hub_label

__all__ = ["final_listing_problems", "list_repo", "planned_from_receipt", "repo_files"]


def planned_from_receipt(path_in_repo: str, artifact: Path) -> Planned | None:
    """How the model file ``artifact`` going up as ``path_in_repo`` was verified: the tag the Hub
    offers for it, and the draft it was served with (a sidecar its receipt names, in the same repo
    folder, as uploads lay files out flat; None: its own head). None for a file that is no model
    to ``-hf``, a later shard, or one without a Hub label (other checks name those)."""
    tag = hub_label(path_in_repo)
    if tag is None or not is_model_file(path_in_repo) or split_info(path_in_repo).index != 1:
        return None
    try:
        p = read_receipt(default_receipt_path(artifact)).predicate
    except (OSError, AuditError, GGUFReadError):
        return None  # the publish gate refuses an artifact without a readable receipt
    v: Mapping[str, Any] = p.get("verification") or {}
    served = (v.get("model") or {}).get("sidecar")
    pair = p.get("pair")
    named = served or (pair["sidecar"] if pair is not None and pair["role"] == "trunk" else None)
    folder = path_in_repo.rpartition("/")[0]
    return Planned(tag, path_in_repo, (f"{folder}/" if folder else "") + named["name"] if named else None)


def final_listing_problems(existing: Iterable[str], planned: Sequence[Planned], uploaded: Iterable[str]) -> list[str]:
    """:func:`~ggufmtp.quant.hf_resolve.release_problems` on the repo's files after the commit: ``existing``
    (the repo's, at the target revision) with ``uploaded`` added or replacing them, in the Hub's order."""
    listing = sorted(set(existing) | set(uploaded))
    return release_problems(listing, planned)


def repo_files(api: Any, repo_id: str, revision: str | None) -> list[str]:
    """The repo's files at ``revision`` (a branch not made yet: the default branch's, which it will
    start from; none when the repo does not exist yet)."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        try:
            return list(api.list_repo_files(repo_id, revision=revision, repo_type="model"))
        except RevisionNotFoundError:
            return list(api.list_repo_files(repo_id, repo_type="model"))
    except RepositoryNotFoundError:
        return []


def list_repo(repo_id: str, revision: str | None = None, token: str | None = None) -> list[str]:
    """:func:`repo_files` of ``repo_id`` on the configured endpoint (``HF_ENDPOINT``), one scrubbed
    HubError naming the repo when the Hub cannot be asked."""
    from huggingface_hub import HfApi

    from .._version import __version__
    from .transport import guard_secrets, hub_errors, resolve_endpoint

    endpoint = resolve_endpoint(None)
    with guard_secrets(token) as secrets, hub_errors(f"listing {repo_id}", repo_id=repo_id, endpoint=endpoint,
                                                     secrets=secrets, revision=revision):
        api = HfApi(endpoint=endpoint, token=token, library_name="ggufmtp", library_version=__version__)
        return repo_files(api, repo_id, revision)
