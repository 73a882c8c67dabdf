"""What ``llama-server -hf REPO[:TAG] --spec-type draft-mtp`` loads from a repo listing: the pinned
llama.cpp's resolver (``common/download.cpp`` at 0c1e570), simulated rule for rule, and nowhere else.

The rules (line numbers at the pin):

* ``gguf_filename_is_model`` (l.637): a *model* file ends in ``.gguf`` and its file name (not its
  folders) holds none of ``mmproj``, ``imatrix``, ``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-``
  (case-sensitive, as ``std::string::find``);
* ``find_best_model`` (l.655): the first model file of the listing whose *path* matches the regex
  ``TAG[.-]`` (case-insensitive, searched anywhere), a split set's ``-00001-of-N`` only; without a
  tag ``Q4_K_M``, then ``Q8_0``, then the first model file;
* ``get_split_files`` (l.524): a split model's files are every listed file with its prefix (the
  path less ``-0000i-of-0000N.gguf``) and its count;
* ``find_best_sibling`` (l.545) with ``mtp-`` (l.613, asked for by ``--spec-type draft-mtp``,
  ``common/arg.cpp`` l.396): among ``.gguf`` files whose *path* holds ``mtp-`` and whose folder is
  the model's or one above it, the deepest folder, then a path holding ``-TAG.`` (upper-cased), then
  the quant bits nearest the tag's (its first number) or, without a tag, the model's; the first
  listed on a tie. ``common_models_handler_apply`` (``arg.cpp`` ~l.640) makes that file the draft
  model whatever the model holds: no look at its ``nextn_predict_layers``. Without one, the MTP
  context is made against the model itself (its own head);
* a ``preset.ini`` at the repo's root makes the repo a preset: nothing else is taken (l.720).

The listing's order decides ties (the first match wins), and the Hub's order is not a promise:
:func:`order_problems` names every tag whose outcome would change if the listing came reversed, so
a release is laid out to resolve one way only. ``ggufmtp ladder`` runs this on the planned release
before any work, and ``upload`` on the repo's final listing (what is there plus what goes up).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["NOT_A_MODEL", "PRESET", "SIDECAR_KEYWORD", "Planned", "Resolution", "draft_for", "find_draft", "find_model",
           "is_model_file", "order_problems", "quant_bits", "release_problems", "resolve", "selects", "split_files",
           "split_info"]

# gguf_filename_is_model (download.cpp:637): a file whose name holds one of these is no model
NOT_A_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
SIDECAR_KEYWORD = "mtp-"  # find_best_mtp (download.cpp:613): a path holding it is an MTP draft candidate
PRESET = "preset.ini"  # at the repo's root: the repo is a router preset (download.cpp:720)
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")  # find_best_model without a tag (download.cpp:661)
_SPLIT_RE = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)  # re_split, matched whole
_TAG_RE = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)  # re_tag, searched


@dataclass(frozen=True)
class SplitInfo:
    """``gguf_split_info`` (download.cpp:475): the path less ``.gguf`` and a split suffix, its last
    ``-``/``.`` part upper-cased, the shard's index and the set's count (1, 1 when not split)."""

    prefix: str
    tag: str
    index: int
    count: int


def split_info(path: str) -> SplitInfo:
    """``get_gguf_split_info`` (download.cpp:482); a path not ending in ``.gguf`` gives the empty info."""
    if not path.endswith(".gguf"):
        return SplitInfo("", "", 0, 0)
    prefix, index, count = path.removesuffix(".gguf"), 1, 1
    if m := _SPLIT_RE.fullmatch(prefix):
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG_RE.search(prefix)
    return SplitInfo(prefix, t.group(1).upper() if t else "", index, count)


def _leading_number(text: str) -> int:
    """``std::stoi`` of ``text`` from its first digit (``Q4_K_M`` -> 4, ``F16`` -> 16); 0 without one."""
    m = re.search(r"\d+", text)
    return int(m.group()) if m else 0


def quant_bits(path: str) -> int:
    """``extract_quant_bits`` (download.cpp:513): the number in the path's tag (``Q8_0`` -> 8)."""
    return _leading_number(split_info(path).tag)


def is_model_file(path: str) -> bool:
    """``gguf_filename_is_model`` (download.cpp:637): may ``-hf`` take ``path`` as a model."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(k in name for k in NOT_A_MODEL)


def selects(tag: str, path: str) -> bool:
    """Whether the model search for ``tag`` (the regex ``TAG[.-]``, case-insensitive, searched in the
    path: download.cpp:666) matches ``path``. A tag is a regex there; one that is no valid regex
    matches nothing here (llama.cpp would throw)."""
    try:
        return re.search(tag + r"[.-]", path, re.IGNORECASE) is not None
    except re.error:
        return False


def _first_shard_or_single(path: str) -> bool:
    s = split_info(path)
    return not (s.count > 1 and s.index != 1)


def find_model(listing: Sequence[str], tag: str | None) -> str | None:
    """``find_best_model`` (download.cpp:655): the model file ``-hf REPO[:TAG]`` loads (a split
    model's first shard), or None."""
    for t in ([tag] if tag else DEFAULT_TAGS):
        hit = next((p for p in listing if is_model_file(p) and selects(t, p) and _first_shard_or_single(p)), None)
        if hit is not None:
            return hit
    if tag:
        return None
    return next((p for p in listing if is_model_file(p) and _first_shard_or_single(p)), None)


def split_files(listing: Sequence[str], primary: str) -> tuple[str, ...]:
    """``get_split_files`` (download.cpp:524): every file of ``primary``'s split set (itself when
    not split), in listing order."""
    s = split_info(primary)
    if s.count <= 1:
        return (primary,)
    return tuple(p for p in listing if (o := split_info(p)).count == s.count and o.prefix == s.prefix)


def find_draft(listing: Sequence[str], model: str | None, tag: str | None) -> str | None:
    """``find_best_sibling(files, model, "mtp-", tag)`` (download.cpp:545): the MTP draft ``-hf``
    downloads and loads for ``model`` (None: the model's own head)."""
    want = _leading_number(tag.upper()) if tag else quant_bits(model or "")
    model_dirs = (model or "").split("/")[:-1]
    tag_mark = f"-{tag.upper()}." if tag else None
    best: tuple[int, bool, int] | None = None
    found = None
    for path in listing:
        if not path.endswith(".gguf") or SIDECAR_KEYWORD not in path:
            continue
        dirs = path.split("/")[:-1]
        if len(dirs) > len(model_dirs) or model_dirs[:len(dirs)] != dirs:
            continue  # only the model's folder or one above it
        exact = tag_mark is not None and tag_mark in path.upper()
        score = (len(dirs), exact, -abs(quant_bits(path) - want))
        if best is None or score > best:  # strictly better: the first listed wins a tie
            best, found = score, path
    return found


@dataclass(frozen=True)
class Resolution:
    """What ``-hf REPO[:TAG]`` loads: the model (a split model's first shard; None: no file for the
    tag), every file of it, and with ``--spec-type draft-mtp`` the draft (None: the model's own
    head). ``preset``: the repo is a router preset and nothing else is taken."""

    tag: str | None
    model: str | None
    model_files: tuple[str, ...]
    draft: str | None
    preset: bool = False

    @property
    def files(self) -> tuple[str, ...]:
        """Every file downloaded."""
        return self.model_files + ((self.draft,) if self.draft and self.draft not in self.model_files else ())


def resolve(listing: Iterable[str], tag: str | None, *, draft_mtp: bool = True) -> Resolution:
    """``common_download_get_hf_plan`` (download.cpp:700) for ``-hf REPO[:TAG]`` on the repo's file
    paths ``listing`` (in the Hub's order), with ``--spec-type draft-mtp`` when ``draft_mtp``."""
    paths = list(listing)
    if PRESET in paths:
        return Resolution(tag, None, (), None, preset=True)
    model = find_model(paths, tag)
    files = split_files(paths, model) if model else ()
    draft = find_draft(paths, model, tag) if draft_mtp else None
    return Resolution(tag, model, files, draft)


def order_problems(listing: Sequence[str], tags: Iterable[str]) -> list[str]:
    """One line per tag whose model or draft depends on the listing's order (two files tie for it:
    llama.cpp takes whichever the Hub lists first)."""
    out = []
    for tag in tags:
        ahead, back = resolve(listing, tag), resolve(list(reversed(listing)), tag)
        if ahead.model != back.model:
            out.append(f"-hf REPO:{tag} matches both {ahead.model} and {back.model} (llama.cpp takes the first "
                       "the Hub lists): give one of them another tag")
        elif ahead.draft != back.draft:
            out.append(f"-hf REPO:{tag} --spec-type draft-mtp ties between the sidecars {ahead.draft} and "
                       f"{back.draft} (llama.cpp takes the first the Hub lists): keep one sidecar per folder and type")
    return out


@dataclass(frozen=True)
class Planned:
    """A model file of a release as it was (or will be) verified: its tag, its path in the repo (the
    unsplit name, or any shard: a split set is known by its prefix) and the draft it was verified
    with (a sidecar's path in the repo; None: its own MTP head)."""

    tag: str
    model: str
    draft: str | None


def draft_for(listing: Sequence[str], tag: str) -> str | None:
    """The MTP draft ``-hf REPO:TAG --spec-type draft-mtp`` loads (a sidecar's path; None: the
    model's own head), what a card says for each tag."""
    return resolve(listing, tag).draft


def release_problems(listing: Sequence[str], planned: Sequence[Planned]) -> list[str]:
    """One line per planned model that ``-hf REPO:TAG --spec-type draft-mtp`` on the repo's final
    ``listing`` would not load as it was verified: another file (or none) for its tag, or another
    draft (a variant with its own head beside a reachable sidecar loads the sidecar); and every tag
    whose outcome the listing's order decides (:func:`order_problems`)."""
    out = order_problems(listing, [p.tag for p in planned])
    for p in planned:
        got = resolve(listing, p.tag)
        if got.model is None or split_info(got.model).prefix != split_info(p.model).prefix:
            out.append(f"-hf REPO:{p.tag} loads {got.model or 'no file'}, not {p.model}")
        elif got.draft != p.draft and p.draft is None:
            out.append(f"{p.model} has its own MTP head and is verified with it, but -hf REPO:{p.tag} --spec-type "
                       f"draft-mtp loads {got.draft} as its draft (llama.cpp takes an mtp- file in the model's folder "
                       "or above it, whatever the model holds): publish it where no sidecar is in its folder or "
                       "above (another --path-in-repo or repo), or as a trunk with that sidecar (--layout sidecar)")
        elif got.draft != p.draft:
            out.append(f"{p.model} is verified with the sidecar {p.draft}, but -hf REPO:{p.tag} --spec-type draft-mtp "
                       f"loads {got.draft or 'no sidecar (a trunk cannot draft alone)'}")
    return out
