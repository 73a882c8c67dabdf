"""Publish artifacts to the Hugging Face Hub: one commit carrying artifact(s), receipt(s) and the card
(several for a large release: :mod:`.parts`).

On the wire this is ``huggingface_hub``'s ``create_repo`` / ``create_branch`` / ``create_commit``.
The inputs are checked before any request (:class:`UploadOptions` when built,
``_UploadRequest.__post_init__``, then the planned operations), the files are hashed, then the
publish gate (``hub/gate.py``: exactly ``ggufmtp audit`` of every artifact against its receipt, a
publishable verification, signatures when a public key is configured) decides; a dry run does all of
that too, so it refuses exactly what the real upload refuses. The bytes sent are the bytes gated:
the digest huggingface_hub computes for each file as it prepares the upload (the LFS oid the Hub
checks the upload against) must equal the digest the gate approved, or nothing is committed. The
default commit message names the recipe and the artifact's sha256 as the receipt states them
(``receipt_commit_facts``). An artifact's signature ``ARTIFACT.sig`` is uploaded alongside it when
present.

A release larger than ``commit_max_bytes`` (default 50 GB) goes up in several commits, as
huggingface_hub 2.x's multi-commit upload does it but over git-LFS and with the gated digests
(:mod:`.parts` says why huggingface_hub's own, Xet-only, path cannot be used and how the parts are
laid out so that no intermediate state serves a model otherwise than verified); the result names
every commit and the final one. Run the same ``ggufmtp upload`` (or ``ladder --upload``) again after
a break: the parts already committed are found unchanged (no new commit), and only the files the Hub
does not hold yet are sent (the LFS batch API has no upload action for a stored object).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import AuditError, GGUFReadError, HubError, HubRefusedError
from ..files.hashing import file_digests
from ..fmt import decimal_bytes
from ..gguf.model import is_mtp_sidecar, split_shards
from ..jsontypes import JsonObject
from ..progress import is_disabled as progress_disabled
from ..provenance.receipt import read_receipt
from ..provenance.signing import resolve_public_key, signature_path
from ..provenance.statement import Statement
from ..quant.hf_resolve import split_info
from ..quant.naming import SIDECAR_KEYWORD, label_problems, name_problem
from .files import COMMIT_RE, HASH_PROGRESS_MIN, SHA256_RE
from .gate import PublishCheck, check_publishable
from .parts import DEFAULT_COMMIT_MAX_BYTES, plan_parts
from .release import final_listing_problems, planned_from_receipt, repo_files
from .transport import HubErrorContext, guard_secrets, host, hub_errors, resolve_endpoint

__all__ = ["CommitFacts", "UploadKind", "UploadOperation", "UploadOptions", "UploadResult", "check_folder",
           "check_repo_id", "default_commit_message", "receipt_commit_facts", "upload"]


class UploadKind(enum.StrEnum):
    """What a file of an upload is."""

    ARTIFACT = "artifact"
    RECEIPT = "receipt"
    CARD = "card"
    SIGNATURE = "signature"


@dataclass(frozen=True)
class UploadOperation:
    """One file of the commit."""

    path_in_repo: str
    local_path: Path
    size: int
    kind: UploadKind
    sha256: str | None = None  # set once hashed (dry runs hash too: the gate needs the digests)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", UploadKind(self.kind))

    def to_dict(self) -> JsonObject:
        return {"path_in_repo": self.path_in_repo, "local_path": str(self.local_path), "size": self.size,
                "kind": self.kind.value, "sha256": self.sha256}


@dataclass
class UploadResult:
    """What ``upload`` committed (or, in a dry run, would commit)."""

    repo_id: str
    revision: str
    dry_run: bool
    private: bool
    commit_message: str
    commit_description: str
    operations: list[UploadOperation]
    endpoint_host: str
    commit_sha: str | None = None
    commit_url: str | None = None
    pr_url: str | None = None  # with create_pr: the pull request the commit opened
    repo_url: str | None = None
    checks: PublishCheck | None = None  # what the publish gate found
    notes: tuple[str, ...] = ()  # artifacts llama.cpp's -hf would not take as models (their names)
    parts: list[tuple[str, ...]] = field(default_factory=list)  # the files of each commit, in order
    commits: list[str] = field(default_factory=list)  # each part's commit (the last is commit_sha)

    @property
    def total_size(self) -> int:
        return sum(op.size for op in self.operations)

    def to_dict(self) -> JsonObject:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "dry_run": self.dry_run,
            "private": self.private,
            "endpoint_host": self.endpoint_host,
            "commit_message": self.commit_message,
            "commit_description": self.commit_description,
            "commit_sha": self.commit_sha,
            "commit_url": self.commit_url,
            "pr_url": self.pr_url,
            "repo_url": self.repo_url,
            "total_size": self.total_size,
            "operations": [op.to_dict() for op in self.operations],
            "artifacts": self.checks.to_dict() if self.checks else [],
            "notes": list(self.notes),
            "parts": [list(p) for p in self.parts],
            "commits": list(self.commits),
        }


# ================================================================================================
# The commit message: facts from the receipts
# ================================================================================================


@dataclass(frozen=True)
class CommitFacts:
    """What the receipts say for the commit message, and notes about receipts that said nothing."""

    recipe_name: str | None
    artifact_sha256: str | None
    notes: tuple[str, ...] = ()  # one line each, for the user (the CLI prints them as ``note: ...``)


def _statement_digests(stmt: Statement, names: list[str]) -> list[tuple[int, str]]:
    """(rank, sha256) of every subject; lower rank = the subject is an earlier artifact of ``names``."""
    out = []
    subjects = stmt.get("subject")
    for s in subjects if isinstance(subjects, list) else []:
        dig = s.get("digest") if isinstance(s, dict) else None
        sha = dig.get("sha256") if isinstance(dig, dict) else None
        if not isinstance(sha, str):
            continue
        name = Path(str(s.get("name", ""))).name
        out.append((names.index(name) if name in names else len(names), sha.lower()))
    return out


def receipt_commit_facts(receipts: Sequence[str | os.PathLike], artifacts: Sequence[str | os.PathLike]
                         ) -> CommitFacts:
    """The recipe name and artifact sha256 for the commit message, read from the receipts (plain JSON
    or DSSE envelopes) when they have ``predicate.recipe.name`` and ``subject[i].digest.sha256``."""
    names = [Path(a).name for a in artifacts]
    recipe, digests, notes = None, [], []
    for r in receipts:
        try:
            rc = read_receipt(r)
        except AuditError as e:
            notes.append(f"{r} is not a valid receipt ({e}); the commit message will not name its recipe")
            continue
        recipe = recipe or rc.recipe_name
        digests += _statement_digests(rc.statement, names)
    digests.sort(key=lambda t: t[0])
    return CommitFacts(recipe, digests[0][1] if digests else None, tuple(notes))


def default_commit_message(artifact_name: str, recipe_name: str | None, artifact_sha256: str | None) -> str:
    """``Upload NAME (recipe R, sha256 S) with ggufmtp``, naming only the facts that are known."""
    facts = []
    if recipe_name:
        facts.append(f"recipe {recipe_name}")
    if artifact_sha256:
        facts.append(f"sha256 {artifact_sha256}")
    return f"Upload {artifact_name}" + (f" ({', '.join(facts)})" if facts else "") + " with ggufmtp"


def _commit_message(ops: list[UploadOperation], recipe_name: str | None, artifact_sha256: str | None) -> str:
    """The default message, naming the artifact whose sha256 the receipt states (else the first)."""
    artifacts = [o for o in ops if o.kind == UploadKind.ARTIFACT]
    named = next((o for o in artifacts if artifact_sha256 and o.sha256 == artifact_sha256), artifacts[0])
    return default_commit_message(named.path_in_repo, recipe_name, artifact_sha256)


def _commit_description(ops: list[UploadOperation], checks: PublishCheck | None = None) -> str:
    unverified = [f"- `{a.artifact.name}`: {a.problem}" for a in (checks.unverified if checks else [])]
    return "\n".join(
        ["Files in this commit:", ""]
        + [f"- `{o.path_in_repo}` ({o.kind}, {decimal_bytes(o.size)}"
           + (f", sha256 `{o.sha256}`)" if o.sha256 else ")") for o in ops]
        + (["", "NOT VERIFIED (published with --allow-unverified):", *unverified] if unverified else [])
        + ["", f"Published with ggufmtp {__version__}."]
    )


# ================================================================================================
# upload: check, plan, hash, commit
# ================================================================================================


def _as_paths(items: str | os.PathLike | Iterable[str | os.PathLike] | None) -> list[Path]:
    if items is None:
        return []
    if isinstance(items, (str, os.PathLike)):
        return [Path(items)]
    return [Path(i) for i in items]


@dataclass(frozen=True)
class UploadOptions:
    """How :func:`upload` publishes (the defaults are ``ggufmtp upload``'s), checked once, when
    built: HubRefusedError naming the bad setting, before anything is read or sent.

    ``private``: create the repo private (no effect on an existing repo); ``revision``: the branch
    to commit to (created when missing; default main; never a commit sha); ``create_pr``: open a
    pull request with the commit instead of committing to the branch (``revision``, which must then
    exist, is the branch it targets), as ``hf upload --create-pr``; ``path_in_repo``: the folder of
    the repo the artifacts, their signatures and receipts go into (default the top; the card is
    always the repo's ``README.md``); ``token``: the Hub token
    (default ``$HF_TOKEN`` or ``hf auth login``'s; never shown in the repr); ``dry_run``: run every
    check (hashing the files) and list the operations, without any network access;
    ``commit_message``: instead of the default one, which names ``recipe_name`` and
    ``artifact_sha256`` (the sha256 the receipt states; it must be one of the artifacts');
    ``endpoint``: another Hub (default ``$HF_ENDPOINT``, else huggingface.co); ``commit_max_bytes``:
    a release larger than this goes up in several commits (:mod:`.parts`; None: always one; a pull
    request is always one). The publish gate
    (:mod:`ggufmtp.hub.gate`): ``allow_unverified`` publishes without a passing verification of
    the artifact's bytes (the card must say so); ``public_key`` (default ``$GGUFMTP_PUBLIC_KEY``)
    requires valid signatures."""

    private: bool = False
    revision: str | None = None
    token: str | bool | None = field(default=None, repr=False)
    dry_run: bool = False
    commit_message: str | None = None
    recipe_name: str | None = None
    artifact_sha256: str | None = None
    endpoint: str | None = None
    allow_unverified: bool = False
    public_key: str | os.PathLike | None = None
    create_pr: bool = False
    path_in_repo: str | None = None
    commit_max_bytes: int | None = DEFAULT_COMMIT_MAX_BYTES

    def __post_init__(self) -> None:
        if self.revision is not None and (not self.revision or COMMIT_RE.match(self.revision)):
            raise HubRefusedError(f"--revision {self.revision!r}: uploads go to a branch name, not a commit sha")
        if self.artifact_sha256 is not None and not SHA256_RE.match(self.artifact_sha256):
            raise HubRefusedError(f"artifact sha256 {self.artifact_sha256!r} is not a 64-hex-digit sha256")
        if self.commit_message is not None and not self.commit_message.strip():
            raise HubRefusedError("--commit-message is empty: give the commit a summary, or leave the option out")
        if self.commit_max_bytes is not None and self.commit_max_bytes <= 0:
            raise HubRefusedError(f"commit_max_bytes {self.commit_max_bytes}: give a positive size, or None for one commit")
        check_folder(self.path_in_repo)

    @property
    def folder(self) -> str:
        """``path_in_repo`` as a prefix (``""`` or ``"a/b/"``)."""
        folder = (self.path_in_repo or "").strip("/")
        return f"{folder}/" if folder not in ("", ".") else ""


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` when the Hub takes it as a repo id, else HubRefusedError saying why: what uploads at
    its end (``run --upload``, ``ladder --upload``) and the card's ``--repo`` check it so before any work."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubRefusedError(f"{repo_id!r} is not a valid Hub repo id (namespace/name): {e}") from None
    return repo_id


def check_folder(path_in_repo: str | None) -> None:
    """HubRefusedError naming ``--path-in-repo`` unless it can be an upload's folder (None: the top)."""
    problem = None if path_in_repo is None else _folder_problem(path_in_repo)
    if problem:
        raise HubRefusedError(f"--path-in-repo {path_in_repo!r}: {problem}")


def _folder_problem(path: str) -> str | None:
    """Why ``path`` cannot be the folder of an upload (None when it can): a relative POSIX path with
    no empty, ``.`` or ``..`` part, and no ``mtp-`` (llama.cpp's -hf takes every file under it as an MTP sidecar)."""
    folder = path.strip("/")
    if folder in ("", "."):
        return None
    if "\\" in path or any(p in ("", ".", "..") for p in folder.split("/")):  # leading/trailing '/': as hf's
        return "a folder of the repo is a relative path like 'Q4_K_M' or 'gguf/Q4_K_M' (no '..', '.', '//' or '\\')"
    if any(ord(c) < 32 or ord(c) == 127 for c in folder):
        return "control characters are not allowed"
    return name_problem(f"{folder}/model.gguf")


@dataclass
class _UploadRequest:
    """An upload's inputs, refused in ``__post_init__`` before anything is read or sent."""

    repo_id: str
    artifacts: list[Path]
    receipts: list[Path]
    card: Path | None
    folder: str = ""  # UploadOptions.folder: where artifacts, signatures and receipts go

    def __post_init__(self) -> None:
        check_repo_id(self.repo_id)
        if not self.artifacts:
            raise HubRefusedError("nothing to upload: pass at least one artifact file")
        if not self.receipts:
            raise HubRefusedError("every upload carries its receipt: pass at least one receipt file")

    def operations(self) -> list[UploadOperation]:
        """The files of the commit (not hashed yet); refuses a missing file or two files with one name."""
        at = self.folder
        planned = [(at + p.name, p, UploadKind.ARTIFACT) for p in self.artifacts]
        planned += [(at + sig.name, sig, UploadKind.SIGNATURE) for p in self.artifacts
                     if (sig := signature_path(p)).is_file()]
        planned += [(at + p.name, p, UploadKind.RECEIPT) for p in self.receipts]
        if self.card is not None:
            planned.append(("README.md", self.card, UploadKind.CARD))
        seen: dict[str, Path] = {}
        ops = []
        for name, p, kind in planned:
            if not p.is_file():
                raise HubRefusedError(f"{kind} {p} does not exist or is not a regular file")
            if name in seen:
                raise HubRefusedError(f"two files would both be uploaded as {name!r}: {seen[name]} and {p}"
                                      + ("; the model card is uploaded as README.md, so rename the other one"
                                         if name == "README.md" else "; rename one of them"))
            seen[name] = p
            ops.append(UploadOperation(name, p.resolve(), p.stat().st_size, kind))
        return ops


def _hashed(ops: list[UploadOperation], progress: bool) -> list[UploadOperation]:
    out = []
    for op in ops:
        try:
            digest = file_digests(op.local_path, progress=progress and op.size >= HASH_PROGRESS_MIN).sha256
        except OSError as e:
            raise HubError(f"cannot read {op.local_path}: {e}") from None
        out.append(UploadOperation(op.path_in_repo, op.local_path, op.size, op.kind, digest))
    return out


def _name_notes(ops: list[UploadOperation]) -> tuple[str, ...]:
    """One note per artifact whose name or folder llama.cpp's ``-hf`` would not resolve as a model
    (:func:`ggufmtp.quant.naming.name_problem`), an MTP-only sidecar excepted (``mtp-`` names it as one)."""
    return tuple(f"{problem}; release names: <Model>-<TAG>.gguf (docs/reference/names.md)"
                 for op in ops if op.kind == UploadKind.ARTIFACT
                 and (problem := name_problem(op.path_in_repo)) and not is_mtp_sidecar(op.local_path))


def _check_release_names(ops: list[UploadOperation]) -> None:
    """Refuse, before anything is hashed, an MTP sidecar whose path lacks ``mtp-`` (llama.cpp's -hf
    would take it as a model, never as a draft) and model files whose Hub labels do not each load
    their own file through ``-hf REPO:LABEL`` (:func:`ggufmtp.quant.naming.label_problems`: a
    ``path_in_repo`` folder or a model name holding another file's type, a label -hf cannot resolve)."""
    arts = [op for op in ops if op.kind == UploadKind.ARTIFACT]
    sidecars = {op.path_in_repo for op in arts if is_mtp_sidecar(op.local_path)}
    unnamed = sorted(p for p in sidecars if SIDECAR_KEYWORD not in p.lower())
    if unnamed:
        raise HubRefusedError(f"{unnamed[0]} is an MTP sidecar (an MTP-only GGUF) and its path lacks "
                              f"{SIDECAR_KEYWORD!r}: llama.cpp's -hf would take it as a model and never load it as "
                              "a draft (common/download.cpp, find_best_mtp); name it mtp-<Model>-<TYPE>.gguf")
    problems = label_problems([op.path_in_repo for op in arts if op.path_in_repo not in sidecars])
    if problems:
        raise HubRefusedError("the Hub's label of a file would not load that file through llama-server -hf "
                              f"REPO:LABEL (docs/reference/names.md): {'; '.join(problems)}")


def _listing_problems(ops: Sequence[UploadOperation], existing: Sequence[str]) -> list[str]:
    """What ``llama-server -hf REPO:TAG --spec-type draft-mtp`` would load otherwise than verified
    once ``ops`` are committed beside ``existing`` (:mod:`ggufmtp.hub.release`)."""
    arts = [op for op in ops if op.kind == UploadKind.ARTIFACT]
    planned = [p for op in arts if (p := planned_from_receipt(op.path_in_repo, op.local_path)) is not None]
    return final_listing_problems(existing, planned, [op.path_in_repo for op in ops])


def _check_final_listing(result: UploadResult, existing: Sequence[str]) -> None:
    """Refuse, before the repo is touched, a commit after which ``llama-server -hf REPO:TAG
    --spec-type draft-mtp`` would load another file or another draft than a model going up was
    verified with (:mod:`ggufmtp.hub.release`: e.g. an ``mtp-`` sidecar already in the repo, in the
    folder or above, becomes the draft of a variant with its own head)."""
    problems = _listing_problems(result.operations, existing)
    if problems:
        raise HubRefusedError(f"after this commit llama-server -hf {result.repo_id}:TAG would not load what was "
                              f"verified, so nothing was sent: {'; '.join(problems)}")


def _plan(result: UploadResult, o: UploadOptions, existing: Sequence[str]) -> list[list[UploadOperation]]:
    """The commits of the upload (:func:`.parts.plan_parts`), recorded in ``result.parts``: a model
    file goes with its shards, its receipt (the gate's match) and signature; sidecars first."""
    at = {op.local_path: op.path_in_repo for op in result.operations}
    owner = {c.receipt: at[c.artifact] for c in (result.checks.artifacts if result.checks else ()) if c.artifact in at}

    def unit_of(op: UploadOperation) -> str | None:
        model = {UploadKind.ARTIFACT: op.path_in_repo, UploadKind.SIGNATURE: op.path_in_repo.removesuffix(".sig"),
                 UploadKind.RECEIPT: owner.get(op.local_path)}.get(op.kind)
        return (split_info(model).prefix or model) if model else None  # a split set by its prefix

    parts = plan_parts(result.operations, None if o.create_pr else o.commit_max_bytes, unit_of,
                       lambda op: op.kind == UploadKind.ARTIFACT and is_mtp_sidecar(op.local_path),
                       lambda done: _listing_problems(done, existing))
    result.parts = [tuple(op.path_in_repo for op in part) for part in parts]
    return parts


def _check_artifact_digest(ops: list[UploadOperation], artifact_sha256: str | None) -> None:
    """Refuse a receipt sha256 that is none of the artifacts': the receipt describes another file."""
    artifacts = [o for o in ops if o.kind == UploadKind.ARTIFACT]
    if artifact_sha256 is not None and artifact_sha256 not in {o.sha256 for o in artifacts}:
        listing = ", ".join(f"{o.path_in_repo}={o.sha256}" for o in artifacts)
        raise HubRefusedError(f"the receipt's artifact sha256 {artifact_sha256} matches none of the files being "
                              f"uploaded ({listing}): the receipt describes another file; re-run the receipt step")


def _whole_sets(artifacts: list[Path]) -> list[Path]:
    """The artifacts with every shard of a split one (``X-00001-of-00003.gguf``: given any shard,
    all of them, in order); a set with a shard missing is refused, naming it."""
    out: list[Path] = []
    for p in artifacts:
        try:
            shards = split_shards(p)
        except GGUFReadError as e:
            raise HubRefusedError(f"refusing a partial split set: {e}") from None
        out += [s for s in shards if s not in out]
    return out


def upload(repo_id: str, files: Sequence[str | os.PathLike], receipt: str | os.PathLike | Sequence[str | os.PathLike],
           card: str | os.PathLike | None = None, options: UploadOptions | None = None, *,
           progress: bool = True) -> UploadResult:
    """Publish artifact(s) ``files``, their receipt(s) and the model ``card`` (as README.md) in ONE
    commit to ``repo_id``, as ``options`` say (an :class:`UploadOptions`; default: ``ggufmtp upload``'s).

    Creates the repo if needed and the branch ``options.revision`` if it does not exist. Before
    anything is sent, every artifact must pass the publish gate (:mod:`ggufmtp.hub.gate`): a
    receipt describing its bytes, a passing verification of them unless ``allow_unverified`` (the
    card must then say so), and valid signatures when a public key is set. A split artifact goes up
    whole: given any of its shards, all of them (one missing refuses the upload). A dry run runs every
    check (hashing the files) and lists the operations, without any network access.
    """
    o = options if options is not None else UploadOptions()
    req = _UploadRequest(repo_id, _whole_sets(_as_paths(files)), _as_paths(receipt),
                         Path(card) if card is not None else None, o.folder)
    key = resolve_public_key(o.public_key)
    ops = req.operations()
    _check_release_names(ops)
    ops = _hashed(ops, progress)
    checks = check_publishable({op.local_path: str(op.sha256) for op in ops if op.kind == UploadKind.ARTIFACT},
                               [op.local_path for op in ops if op.kind == UploadKind.RECEIPT],
                               next((op.local_path for op in ops if op.kind == UploadKind.CARD), None),
                               allow_unverified=o.allow_unverified, public_key=key)
    _check_artifact_digest(ops, o.artifact_sha256)
    endpoint = resolve_endpoint(o.endpoint)
    result = UploadResult(
        repo_id=repo_id, revision=o.revision or "main", dry_run=o.dry_run, private=o.private,
        commit_message=o.commit_message or _commit_message(ops, o.recipe_name, o.artifact_sha256),
        commit_description=_commit_description(ops, checks), operations=ops, endpoint_host=host(endpoint),
        checks=checks, notes=_name_notes(ops))
    if o.dry_run:
        _plan(result, o, ())  # no network: the parts as planned on an empty repo
    else:
        _push(result, o, endpoint, progress)
    return result


def _push(result: UploadResult, o: UploadOptions, endpoint: str, progress: bool) -> None:
    """Send the commit, with huggingface_hub's progress bars off unless ``progress``; fills in the commit."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    progress = progress and not progress_disabled()
    restore_bars = not progress and not are_progress_bars_disabled()
    if restore_bars:
        disable_progress_bars()
    try:
        with guard_secrets(o.token) as secrets:
            _commit(result, o, endpoint, secrets)
    finally:
        if restore_bars:
            enable_progress_bars()


def _addition(op: UploadOperation) -> Any:
    """huggingface_hub's operation for ``op``, refused unless the bytes it read (its own sha256,
    which the Hub checks the uploaded content against) are the bytes the gate approved: a file
    replaced or edited after the gate never reaches the commit."""
    from huggingface_hub import CommitOperationAdd

    # receipts, cards and signatures are small: their bytes are read once, here, and those bytes are
    # sent; an artifact is streamed from its path, under the oid compared here
    source: str | bytes = str(op.local_path) if op.kind == UploadKind.ARTIFACT else op.local_path.read_bytes()
    add = CommitOperationAdd(path_in_repo=op.path_in_repo, path_or_fileobj=source)
    sent = add.upload_info.sha256.hex()
    if sent != op.sha256 or add.upload_info.size != op.size:
        raise HubRefusedError(f"{op.local_path} changed after the publish gate checked it (gated sha256 {op.sha256}, "
                              f"{op.size} bytes; about to send sha256 {sent}, {add.upload_info.size} bytes): nothing "
                              "was committed; check what writes to it and upload again")
    return add


def _commit(result: UploadResult, o: UploadOptions, endpoint: str, secrets: Sequence[str]) -> None:
    """create_repo (exist_ok), create_branch when not main (unless a pull request targets it, as
    ``hf upload --create-pr``), then one create_commit per part (:func:`_plan`), each on the last."""
    from huggingface_hub import HfApi

    repo_id, branch, ops, revision = result.repo_id, result.revision, result.operations, o.revision
    additions = [_addition(op) for op in ops]  # before any request: a changed file creates nothing
    api = HfApi(endpoint=endpoint, token=o.token, library_name="ggufmtp", library_version=__version__)
    errs = HubErrorContext(repo_id=repo_id, endpoint=endpoint, secrets=secrets, revision=revision, writing=True)
    with hub_errors(f"listing {repo_id}", **errs):
        existing = repo_files(api, repo_id, branch)
    _check_final_listing(result, existing)
    with hub_errors(f"creating repo {repo_id}", **errs):
        repo_url = api.create_repo(repo_id, private=True if result.private else None, exist_ok=True,
                                   repo_type="model")
    if branch != "main" and not o.create_pr:
        with hub_errors(f"creating branch {branch} in {repo_id}", **errs):
            api.create_branch(repo_id, branch=branch, exist_ok=True, repo_type="model")
    sent = dict(zip([op.path_in_repo for op in ops], additions, strict=True))
    parts = _plan(result, o, existing)
    info, parent = None, None
    for i, part in enumerate(parts):
        what = (f"opening a pull request of {len(ops)} file(s) on {repo_id} @ {branch}" if o.create_pr
                else f"committing {len(part)} file(s) to {repo_id} @ {branch}"
                + (f" (part {i + 1} of {len(parts)})" if len(parts) > 1 else ""))
        with hub_errors(what, **errs):
            # each part on the one before it: another writer in between fails the upload (parent_commit)
            info = api.create_commit(repo_id, [sent[op.path_in_repo] for op in part], revision=revision,
                                     commit_message=result.commit_message + (f" (part {i + 1})" if i else ""),
                                     commit_description=result.commit_description, repo_type="model",
                                     create_pr=o.create_pr, parent_commit=parent)
        parent = getattr(info, "oid", None)
        result.commits.append(str(parent))
    result.commit_sha = getattr(info, "oid", None)
    result.commit_url = getattr(info, "commit_url", None)
    result.pr_url = getattr(info, "pr_url", None)
    result.repo_url = str(repo_url)
