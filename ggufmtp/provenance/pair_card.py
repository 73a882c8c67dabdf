"""What a card says about a split model: trunk-only variants served with an MTP sidecar.

``ladder --layout sidecar`` publishes each variant without its MTP head (a *trunk*) and the head
once, as an MTP-only GGUF (``mtp-<Model>-<TYPE>.gguf``, :mod:`ggufmtp.quant.sidecar`); ``ggufmtp
sidecar --trunk-only`` writes one such pair. A card of such files (the ladder's, or a trunk's own)
says what the sidecar is, that ``llama-server -hf REPO:TAG --spec-type draft-mtp`` fetches it with
the trunk by itself (``common/download.cpp``, ``find_best_mtp``: a file whose name holds ``mtp-``
beside the model), the ``-m TRUNK -md SIDECAR`` line for local files, and what the layout saves
against full variants that would each carry the head (the sidecar's MTP block at its types).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..files.hashing import sha256_file
from ..fmt import human_bytes
from ..gguf.model import GGUFModel, block_prefixes
from ..quant.hf_resolve import draft_for
from ..quant.naming import best_sidecar
from .card_page import FileRow, PageOptions, download_pattern, picked_row, verified_mtp_env, verified_mtp_flags
from .statement import NamedDigest, Predicate

__all__ = ["SIDECAR_HEADING", "SidecarFile", "draft_lines", "find_sidecar", "pair_lines", "served_with", "trunk_intro",
           "trunk_sidecar"]

SIDECAR_HEADING = "## The MTP sidecar"


@dataclass(frozen=True)
class SidecarFile:
    """A published MTP sidecar: its name, and where the file was at hand its size and the bytes of
    its MTP blocks (what a full variant carries besides its trunk, at the sidecar's types)."""

    name: str
    size_bytes: int | None = None
    head_bytes: int | None = None
    path: Path | None = field(default=None, compare=False, repr=False)  # where it was at hand (never shown)

    @classmethod
    def of(cls, path: Path) -> SidecarFile:
        gm = GGUFModel(path)
        prefixes = block_prefixes(gm.mtp_blocks)
        head = sum(t.n_bytes for n, t in gm.tensors.items() if n.startswith(prefixes))
        return cls(path.name, path.stat().st_size, head, path)


def trunk_sidecar(p: Predicate) -> NamedDigest | None:
    """The sidecar a trunk's receipt names (its ``pair`` section); None for any other file."""
    pair = p.get("pair")
    return pair.get("sidecar") if pair is not None and pair["role"] == "trunk" else None


def find_sidecar(artifact: Path, named: NamedDigest) -> SidecarFile:
    """The named sidecar beside ``artifact`` or in the folder above (a ladder's ``DIR/<TAG>/``
    trunk, ``DIR/`` sidecar) when its bytes are the named ones; else only its name."""
    for folder in (artifact.parent, artifact.parent.parent):
        path = folder / named["name"]
        if path.is_file() and sha256_file(path) == named["sha256"]:
            return SidecarFile.of(path)
    return SidecarFile(named["name"])


def trunk_intro(name: str, model: str, sidecar: str) -> str:
    """The single card's first paragraph for a trunk."""
    return (f"`{name}`: a trunk-only MTP runtime GGUF of {model}: every layer but the multi-token-prediction "
            f"(NextN) head, which is in the MTP sidecar `{sidecar}` (see *{SIDECAR_HEADING.removeprefix('## ')}* below); "
            "with it `llama-server --spec-type draft-mtp` drafts tokens the model verifies.")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _sizes(rows: Sequence[FileRow], sidecars: Sequence[SidecarFile]) -> list[str]:
    """What the layout saves: the trunks and sidecars against the same variants each with the head."""
    if not sidecars or any(s.size_bytes is None or s.head_bytes is None for s in sidecars):
        return []
    trunks = sum(r.size_bytes for r in rows)
    split = trunks + sum(s.size_bytes or 0 for s in sidecars)
    head = max(s.head_bytes or 0 for s in sidecars)
    full = trunks + len(rows) * head
    saved = full - split
    pick = picked_row(rows)
    side = next(s for s in sidecars if s.name == served_with(pick, sidecars))
    told = (f"{human_bytes(saved)} ({100 * saved / full:.0f}%) less to store and upload" if saved > 0
            else f"{human_bytes(-saved)} more (one variant gains nothing from a sidecar)")
    return [f"Sizes: the MTP head (its block at the sidecar's types) is {human_bytes(head)}. "
            f"{_plural(len(rows), 'trunk')} and {_plural(len(sidecars), 'sidecar')} take {human_bytes(split)}; the "
            f"same {_plural(len(rows), 'variant')} each with that head would take {human_bytes(full)}: {told}. "
            f"To draft, a trunk and the sidecar are downloaded (`{pick.artifact}` and `{side.name}`: "
            f"{human_bytes(pick.size_bytes + (side.size_bytes or 0))}); add the sidecar's size to the memory "
            "above. Without `--spec-type draft-mtp` a trunk runs alone as a plain model.\n"]


def served_with(row: FileRow, sidecars: Sequence[SidecarFile]) -> str:
    """The sidecar a trunk is served with: the one llama.cpp's ``-hf REPO:TAG`` picks for its tag
    (:func:`~ggufmtp.quant.naming.best_sidecar`; the ladder verifies each trunk with that one)."""
    names = [s.name for s in sidecars]
    return (best_sidecar(row.tag, names) if row.tag else None) or names[0]


def draft_lines(rows: Sequence[FileRow], sidecars: Sequence[SidecarFile], options: PageOptions) -> list[str]:
    """Which draft ``-hf REPO:TAG --spec-type draft-mtp`` loads for each tag of the release (the
    pinned llama.cpp's resolver on the release's files: :func:`ggufmtp.quant.hf_resolve.draft_for`)."""
    listing = [options.at(r.artifact) for r in rows] + [options.at(s.name) for s in sidecars]
    said = []
    for r in rows:
        if r.tag:
            draft = draft_for(listing, r.tag)
            said.append(f"`:{r.tag}` drafts with " + (f"the sidecar `{draft}`" if draft else "the head inside its file"))
    return [f"What `-hf {options.repo}:TAG --spec-type draft-mtp` loads as the draft (llama.cpp's own choice, "
            f"which the variant was verified with): {'; '.join(said)}.\n"] if said else []


def pair_lines(rows: Sequence[FileRow], sidecars: Sequence[SidecarFile], options: PageOptions) -> list[str]:
    """The section that explains the pair (module docstring); ``rows``: the trunks."""
    if not rows or not sidecars:
        return []
    pick = picked_row(rows)
    side, repo = served_with(pick, sidecars), options.repo
    names = ", ".join(f"`{s.name}`" for s in sidecars)
    flags = " ".join(verified_mtp_flags(pick.verification))
    lines = [SIDECAR_HEADING + "\n",
             f"The model files here are **trunk-only**: every layer but the MTP (NextN) head. The head is in "
             f"{names}, an MTP-only GGUF (the head's block with the token embedding and output it reads, as "
             "`convert_hf_to_gguf.py --mtp` writes one), loaded as llama.cpp's draft model.\n",
             f"`llama-server -hf {repo}:TAG --spec-type draft-mtp` downloads the sidecar with the trunk by itself: "
             "llama.cpp takes a file whose name holds `mtp-` beside the model as its MTP draft (the one whose type "
             "is nearest the tag). With local files, give it with `-md` (`--spec-draft-model`):\n",
             "```sh",
             f'hf download {repo} --include "{options.at(download_pattern(pick.artifact))}" --include '
             f'"{options.at(side)}" --local-dir .',
             f"{verified_mtp_env(pick.verification)}llama-server -m {options.at(pick.artifact)} -md {options.at(side)} "
             "--spec-type draft-mtp "
             f"{flags}",
             "```\n",
             "Each trunk was verified served with the sidecar its receipt names (the `pair` section), and the "
             "acceptance in the table is that pair's; `ggufmtp audit TRUNK.gguf --sidecar SIDECAR.gguf` checks that "
             "a trunk and a sidecar belong together.\n"]
    return lines + _sizes(rows, sidecars)
