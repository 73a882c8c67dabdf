"""Release file names, made here and nowhere else: names llama.cpp's ``-hf owner/repo:TAG`` resolves.

The field's convention, and what the pinned llama.cpp's downloader expects (``common/download.cpp``
at 0c1e570; docs/reference/names.md quotes the rules):

* a variant is ``<Model>-<TAG>.gguf`` (:func:`variant_file_name`), in a folder named ``<TAG>`` when
  a ladder makes several (:func:`variant_folder`). ``Model`` is the model's name without its
  precision or a cache hash (:func:`model_name`: ``Qwen3.6-35B-A3B``, not
  ``Qwen3.6-35B-A3B-BF16``); ``TAG`` the recipe's declared ``tag`` (``Q4_K_M_HiFi``), by default its
  ftype (``Q8_0``, ``IQ4_XS``): the label the Hub reads in the file's name (:func:`hub_label`);
* an MTP sidecar (an MTP-only GGUF) is ``mtp-<Model>-<TYPE>.gguf`` (:func:`sidecar_file_name`).

Why: ``find_best_model`` (download.cpp:655) takes the first file whose path matches the regex
``TAG[.-]`` (case-insensitive, searched anywhere in the path) among the *model* files, and
``gguf_filename_is_model`` (download.cpp:637) drops every file whose name contains ``mmproj``,
``imatrix``, ``mtp-``, ``eagle3-``, ``dflash-`` or ``dspark-``; ``find_best_mtp`` (download.cpp:613)
takes a file whose *path* contains ``mtp-`` as the MTP sidecar. So a variant name (or folder)
holding ``mtp-`` is invisible as a model and may be served as another variant's draft, and two tags
of one repo where one's pattern matches the other's file (``Q4_K_M`` and ``Q4_K_M-HiFi``) make
``:Q4_K_M`` pick whichever the listing gives first. :func:`tag_problem` and
:func:`ambiguous_tags` refuse both before anything is made.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from .hf_resolve import NOT_A_MODEL, SIDECAR_KEYWORD, find_draft, is_model_file, split_info
from .hf_resolve import selects as _selects

__all__ = ["HUB_FILE_QUANTS", "NOT_A_MODEL", "SIDECAR_KEYWORD", "ambiguous_tags", "best_sidecar", "hub_label",
           "label_problems", "model_name", "name_problem", "selects", "sidecar_file_name", "tag_problem",
           "variant_file_name", "variant_folder"]

# A tag is typed after the colon of `-hf owner/repo:TAG` and becomes a regex (download.cpp:666):
# letters, digits and `_`, in parts joined by `-` (no regex metacharacter, no `:`, no `.`).
_TAG_RE = re.compile(r"[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*")
_SPLIT_RE = re.compile(r"-\d{5}-of-\d{5}$")
# what a source file's name carries that a release name does not: its precision, a cache digest
_SOURCE_SUFFIX_RE = re.compile(r"[-_.](?:BF16|F16|F32|[0-9a-f]{12})$", re.IGNORECASE)
_MTP_WORD_RE = re.compile(r"(?:^|[-_.])mtp(?=$|[-_.])", re.IGNORECASE)

# The Hub's quant label: huggingface.js packages/tasks/src/gguf.ts. GGMLFileQuantizationType's names
# in declaration order (a JS alternation, like Python's, takes the first alternative that matches:
# "Q4_0_4_4" reads as Q4_0), then Unsloth's *_K_XL.
HUB_FILE_QUANTS = ("F32", "F16", "Q4_0", "Q4_1", "Q4_1_SOME_F16", "Q4_2", "Q4_3", "Q8_0", "Q5_0", "Q5_1", "Q2_K",
                   "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ2_XXS", "IQ2_XS",
                   "Q2_K_S", "IQ3_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ3_M", "IQ2_S", "IQ2_M", "IQ4_XS",
                   "IQ1_M", "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "MXFP4_MOE", "NVFP4", "Q1_0",
                   "Q2_K_XL", "Q3_K_XL", "Q4_K_XL", "Q5_K_XL", "Q6_K_XL", "Q8_K_XL")
# GGUF_QUANT_RE: "(?<prefix>UD-)?(?<quant>...)(_(?<sizeVariation>[A-Z]+))?", matched globally in the
# upper-cased path; parseGGUFQuantLabel takes the last match
_HUB_QUANT_RE = re.compile(r"(?:UD-)?(?:" + "|".join(HUB_FILE_QUANTS) + r")(?:_[A-Z]+)?")
# GGUF_QUANT_MIX_COMPONENT_RE: "<pct><tensor type>" between '-'/start and '-'/'.'/end, longest names
# first; GGMLQuantizationType's names less the storage types I8..I64, F64
_MIX_TYPES = sorted(("F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                     "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                     "IQ1_M", "BF16", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0"), key=len, reverse=True)
_MIX_RE = re.compile(r"(?:^|(?<=-))(\d{1,3})(" + "|".join(_MIX_TYPES) + r")(?=$|[-.])")


def tag_problem(tag: str) -> str | None:
    """Why ``tag`` cannot name a variant (None when it can)."""
    if not _TAG_RE.fullmatch(tag):
        return (f"tag {tag!r} must be letters, digits and '_' in parts joined by '-' (e.g. Q4_K_M, "
                "Q4_K_M_HiFi): llama.cpp reads it after the ':' of -hf owner/repo:TAG and searches it as a regex")
    bad = next((k for k in NOT_A_MODEL if k in f"{tag}.gguf".lower()), None)
    if bad:
        return (f"tag {tag!r} contains {bad!r}: llama.cpp's -hf never takes a file whose name holds it as a model "
                "(common/download.cpp, gguf_filename_is_model)")
    label = hub_label(variant_file_name("M", tag))
    if label != tag.upper():
        read = f"reads the label {label}" if label else "reads no quant label"
        return (f"tag {tag!r}: the Hub {read} in <Model>-{tag}.gguf and offers -hf REPO:{label or '?'}, which is "
                "not this tag: a tag is a GGUF file type, optionally with '_' and letters (Q4_K_M, Q4_K_M_HiFi, "
                "UD-Q4_K_XL; no digit after the type)")
    return None


def hub_label(path_in_repo: str) -> str | None:
    """The quant label the Hub shows for the file at ``path_in_repo`` and puts in its "Use this model"
    line ``llama-server -hf REPO:LABEL``: huggingface.js ``parseGGUFQuantLabel`` (packages/tasks/src/
    gguf.ts): a percentage-mixed name's dominant type, else the last quant in the upper-cased path."""
    stem = path_in_repo.rsplit("/", 1)[-1].upper().removesuffix(".GGUF")  # parseGGUFQuantMix: the base name
    mix = [(int(m.group(1)), m.group(2)) for m in _MIX_RE.finditer(stem)]
    if len(mix) >= 2:
        return max(mix, key=lambda c: c[0])[1]  # reduce(b.pct > a.pct ? b : a): the first of equal shares
    found = [m.group() for m in _HUB_QUANT_RE.finditer(path_in_repo.upper())]
    return found[-1] if found else None


def _is_model_file(path_in_repo: str) -> bool:
    """Whether llama.cpp's -hf may pick ``path_in_repo`` as a model (:func:`~ggufmtp.quant.hf_resolve.is_model_file`),
    of a split set its first shard only."""
    return is_model_file(path_in_repo) and split_info(path_in_repo).index == 1


def label_problems(paths: Sequence[str]) -> list[str]:
    """One line per model file among ``paths`` (one repo's, with their folders) whose Hub label
    (:func:`hub_label`), typed into ``-hf REPO:LABEL``, would not load exactly that file: its search
    (:func:`selects`) matches another model file, or not this one."""
    models = [p for p in paths if _is_model_file(p)]
    out = []
    for path in models:
        label = hub_label(path)
        if label is None:  # the Hub offers no tag: not a collision (a recipe's tag must have one: tag_problem)
            continue
        others = [p for p in models if p != path and selects(label, p)]
        if others:
            out.append(f"{path}: the Hub labels it {label}, and -hf REPO:{label} matches {', '.join(others)}: "
                       "rename one of them, or the folder or model name holding the other type")
        elif not selects(label, path):
            out.append(f"{path}: the Hub labels it {label}, and -hf REPO:{label} matches no file (llama.cpp "
                       "searches LABEL[.-]): name it <Model>-<LABEL>.gguf, the label a GGUF file type with at "
                       "most '_' and letters after it")
    return out


def name_problem(path_in_repo: str) -> str | None:
    """Why a model file at ``path_in_repo`` would not resolve as a model (None when it would)."""
    name = path_in_repo.rsplit("/", 1)[-1]
    bad = next((k for k in NOT_A_MODEL if k in name.lower()), None)
    if bad:
        return f"{name} contains {bad!r}: llama.cpp's -hf skips it as a model (common/download.cpp, gguf_filename_is_model)"
    if SIDECAR_KEYWORD in path_in_repo.lower():
        return (f"{path_in_repo}: its folder contains {SIDECAR_KEYWORD!r}: llama.cpp's -hf takes it as an MTP "
                "sidecar (common/download.cpp, find_best_mtp)")
    return None


def model_name(reference: str, model_file: str | Path | None = None, *, converted: bool = False) -> str:
    """The model's name as release names carry it: ``builtin:NAME`` gives NAME; a GGUF (a local file
    or one pulled from a Hub repo) its file name; a converted safetensors checkpoint (``converted``)
    its repo's or folder's name. Split suffixes, ``.gguf``, a trailing precision (BF16, F16, F32)
    or cache digest and the word ``mtp`` are left out (``Qwen3.6-35B-A3B-BF16-00001-of-00002.gguf``
    -> ``Qwen3.6-35B-A3B``); no release name made from it holds ``mtp-``."""
    if reference.startswith("builtin:"):
        name = reference.removeprefix("builtin:")
    elif converted or model_file is None:
        name = Path(reference.partition("@")[0].rstrip("/")).name
    else:
        name = Path(model_file).name
    name = _SPLIT_RE.sub("", name.removesuffix(".gguf").removesuffix(".GGUF"))
    while (stripped := _SOURCE_SUFFIX_RE.sub("", name)) != name:
        name = stripped
    name = _MTP_WORD_RE.sub("", name).strip("-_.")
    # a word ending in mtp ("nomtp") would still make "mtp-" before a separator or the tag's "-"
    return re.sub(r"(mtp)(?=-|$)", r"\1_", name, flags=re.IGNORECASE) or "model"


def variant_file_name(model: str, tag: str) -> str:
    """``<Model>-<TAG>.gguf``: the variant file of ``model`` (:func:`model_name`) made by the recipe tagged ``tag``."""
    return f"{model}-{tag}.gguf"


def variant_folder(tag: str) -> str:
    """The folder of a ladder's variant: its tag (never the recipe's name, which may hold ``mtp-``)."""
    return tag


def sidecar_file_name(model: str, type_name: str) -> str:
    """``mtp-<Model>-<TYPE>.gguf``: the MTP-only GGUF llama.cpp's ``-hf`` serves as the draft of ``model``'s variants."""
    return f"{SIDECAR_KEYWORD}{model}-{type_name}.gguf"


def best_sidecar(tag: str, sidecars: Sequence[str]) -> str | None:
    """The sidecar llama.cpp's ``-hf REPO:TAG`` takes among ``sidecars`` (file names in one folder
    with the variant): :func:`ggufmtp.quant.hf_resolve.find_draft`."""
    return find_draft(sidecars, None, tag)


def selects(tag: str, path_in_repo: str) -> bool:
    """Whether llama.cpp's model search for ``tag`` matches ``path_in_repo`` (:func:`ggufmtp.quant.hf_resolve.selects`;
    a tag here is letters, digits, '_' and '-': :func:`tag_problem`)."""
    return _selects(re.escape(tag), path_in_repo)


def ambiguous_tags(variants: Sequence[tuple[str, str]]) -> list[str]:
    """One line per problem among ``(tag, path_in_repo)`` of one repo's variants: a tag given twice,
    or a tag whose search also matches another variant's file (llama.cpp would serve whichever the
    listing gives first), or a file that is not a model to llama.cpp."""
    out = []
    tags = [t.upper() for t, _ in variants]
    for tag in sorted({t for t in tags if tags.count(t) > 1}):
        out.append(f"tag {tag} is given twice (tags are compared ignoring case, as llama.cpp does)")
    for tag, path in variants:
        if tags.count(tag.upper()) > 1:
            continue
        others = [p for t, p in variants if p != path and selects(tag, p)]
        if others:
            out.append(f"-hf REPO:{tag} would match {', '.join(others)} as well as {path} "
                       f"(llama.cpp searches TAG[.-] in every path): give one of them another tag")
        problem = name_problem(path)
        if problem:
            out.append(problem)
    return out or label_problems([p for _, p in variants])  # a tag's own collision said once
