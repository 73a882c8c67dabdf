"""What makes a card a model page (``ggufmtp card`` and the ladder's card): the model's title, the
files table with a reference row, which file to pick for which memory, the download and run lines
(``hf download``, ``llama-server -hf OWNER/REPO:TAG --spec-type draft-mtp``, the llama.cpp build),
the prompt format and the YAML metadata (``base_model`` the original model, the license inherited).

Every figure is read from a receipt; the head against its reference and the verdict's findings are
re-derived as audit derives them (:meth:`~.head.HeadComparison.findings`, :func:`~.verdict.judge_record`),
never read from what the receipt recorded. A row whose verification is not publishable (missing,
failed, too little evidence) reads "not verified" in every column that would claim something, and
its figures carry no 95 % CI when the evidence is below the minimum (:class:`~.verdict.Evidence`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from ..constants import LLAMA_CPP_COMMIT
from ..fmt import human_bytes
from ..gguf.model import SPLIT_RE
from ..quant.naming import model_name, selects, tag_problem
from .head import HeadComparison, HeadFinding
from .receipt import verification_problem
from .search_card import SearchRecord
from .statement import Predicate, Statement

__all__ = ["CardMeta", "FileRow", "PageOptions", "TAGS", "card_title", "page_meta", "prompt_format_lines", "run_lines",
           "template_block", "verified_mtp_env", "verified_mtp_flags", "without_ci"]

TAGS = ["gguf", "llama.cpp", "mtp", "speculative-decoding"]
REPO_PLACEHOLDER = "OWNER/REPO"  # a card made without --repo: the publisher's repo goes there
# Chat template kinds, recognised by a marker the template writes (first match wins).
_TEMPLATE_KINDS = (("<|im_start|>", "ChatML (`<|im_start|>user ... <|im_end|>`)"),
                   ("<|start_header_id|>", "Llama 3 (`<|start_header_id|>user<|end_header_id|>`)"),
                   ("<start_of_turn>", "Gemma (`<start_of_turn>user ... <end_of_turn>`)"),
                   ("[gMASK]", "GLM (`[gMASK]<sop><|user|>`)"),
                   ("<｜User｜>", "DeepSeek (`<｜User｜>...<｜Assistant｜>`)"),
                   ("[INST]", "Mistral (`[INST] ... [/INST]`)"))


class CardMeta(TypedDict):
    """A card's YAML metadata (``huggingface_hub.ModelCardData``'s keyword arguments)."""

    tags: list[str]
    quantized_by: str
    pipeline_tag: str
    library_name: str
    base_model: NotRequired[str]
    base_model_relation: NotRequired[str]
    license: NotRequired[str]


@dataclass(frozen=True)
class PageOptions:
    """What the publisher sets: the repo the card goes to (its download and run lines name it),
    ``quantized_by``, a license overriding the inherited one and ``base_model``, the upstream
    model's Hub repo overriding the one the receipts name (``--base-model``)."""

    repo_id: str | None = None
    quantized_by: str = "ggufmtp"
    license: str | None = None
    path_in_repo: str | None = None  # the repo folder the files go to (upload --path-in-repo)
    base_model: str | None = None

    def __post_init__(self) -> None:
        if self.base_model is not None:
            check_base_model(self.base_model)

    @property
    def repo(self) -> str:
        return self.repo_id or REPO_PLACEHOLDER

    def at(self, name: str) -> str:
        """``name`` as a path in the repo: under ``path_in_repo``, as the card's links and ``--include`` need it."""
        folder = (self.path_in_repo or "").strip("/")
        return f"{folder}/{name}" if folder not in ("", ".") else name


def _mapping(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def card_model_name(p: Predicate) -> str:
    """The model's name as release names carry it (:func:`~ggufmtp.quant.naming.model_name`), from
    the receipt's base model: the Hub checkpoint converted from, the builtin (also one converted from
    a local checkpoint, as ``builtin:*-trained``: ``run`` names its files after the builtin), the
    checkpoint converted from, or the GGUF pulled or given."""
    bm = p["base_model"]
    src, conv, files = bm["source"], bm.get("converted_from"), bm.get("files") or []
    first = files[0]["name"] if files else None
    if conv and conv.get("repo_id"):
        return model_name(str(conv["repo_id"]), converted=True)
    if src.get("type") == "builtin" and src.get("name"):
        return model_name(f"builtin:{src['name']}")
    if conv:
        return model_name(str(conv.get("repo_id") or conv.get("name") or first or "model"), converted=True)
    return model_name(str(src.get("repo_id") or src.get("name") or "model"), first)


def card_title(model: str) -> str:
    return f"{model} MTP GGUF"


def check_base_model(repo_id: str) -> str:
    """``repo_id`` when it is a Hub model repo id (``owner/name``), else CardError saying so: the
    Hub's model tree links a release to its ``base_model`` only by such an id."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from ..errors import CardError

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise CardError(f"--base-model {repo_id!r}: not a Hub model repo id ({e})") from None
    if repo_id.count("/") != 1:
        raise CardError(f"--base-model {repo_id!r}: not a Hub model repo id of the form owner/name")
    return repo_id


def original_model(p: Predicate) -> str | None:
    """The upstream model's Hub repo: the checkpoint a converted GGUF came from (a local one: the repo
    its config.json's ``_name_or_path`` names); else the model the
    pulled repo's card names as its ``base_model`` (a GGUF conversion or quantization of it, recorded
    at the pull as ``source.upstream``); else the repo pulled."""
    bm = p["base_model"]
    conv = bm.get("converted_from")
    if conv:
        return conv.get("repo_id") or conv.get("upstream") or None
    src = bm["source"]
    return (src.get("upstream") or src.get("repo_id") or None) if src.get("type") == "hub" else None


def page_meta(rows: Sequence[FileRow], options: PageOptions) -> CardMeta:
    """The metadata: ``base_model`` the upstream model (``options.base_model``, else the receipts'),
    with ``base_model_relation: quantized`` (what lists the release in the Hub's model tree), the
    license the source recorded (unless ``options.license``), ``quantized_by`` as set."""
    meta: CardMeta = {"tags": list(TAGS), "quantized_by": options.quantized_by, "pipeline_tag": "text-generation",
                      "library_name": "gguf"}
    base = options.base_model or next((r.original for r in rows if r.original), None)
    if base:
        meta["base_model"] = base
        meta["base_model_relation"] = "quantized"
    lic = options.license or next((str(r.source["license"]) for r in rows if r.source.get("license")), None)
    if lic:
        meta["license"] = lic
    return meta


def release_tag(file_name: str, model: str, ftype: str | None) -> str | None:
    """The tag ``-hf OWNER/REPO:TAG`` selects ``file_name`` by: the release name's
    (``<Model>-<TAG>.gguf``), else the ftype; None when neither would select it."""
    stem = file_name.removesuffix(".gguf")
    stem = stem.split("-00001-of-", 1)[0]
    candidates = [stem[len(model) + 1:]] if stem.startswith(model + "-") else []
    candidates += [ftype] if ftype else []
    return next((t for t in candidates if t and tag_problem(t) is None and selects(t, file_name)), None)


def enough_evidence(v: Mapping[str, Any]) -> bool:
    """Whether a verification measured at least the minimum prompts a 95 % CI is shown for."""
    from .verdict import Evidence

    return Evidence.of_settings(_mapping(v.get("settings"))).prompts >= Evidence.MIN_PROMPTS


def without_ci(x: Any) -> Any:
    """``x`` without any ``*_ci95`` key, at any depth (what a card shows below the evidence minimum)."""
    if isinstance(x, Mapping):
        return {k: without_ci(v) for k, v in x.items() if not (isinstance(k, str) and k.endswith("_ci95"))}
    if isinstance(x, list):
        return [without_ci(v) for v in x]
    return x


@dataclass(frozen=True)
class FileRow:
    """One published file as its (audited) receipt describes it."""

    artifact: str  # file name
    receipt: str  # file name
    recipe: str
    size_bytes: int
    bpw: float | None
    quality: Mapping[str, Any]  # the receipt's ``quality`` section ({} without eval)
    verification: Mapping[str, Any]  # the receipt's ``verification`` ({} without one)
    unverified: str | None  # why the file is not verified (None when it is)
    source: Mapping[str, Any]
    model: str = "model"
    tag: str | None = None
    chat_template: str | None = None
    base_files: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    original: str | None = None  # the original model's Hub repo (:func:`original_model`)
    search: SearchRecord | None = None  # a searched recipe's [search] record (:mod:`.search_card`)
    imatrix: Mapping[str, Any] | None = None  # the receipt's ``imatrix`` section (None: made without one)
    # GPU memory llama-server needs to draft with the file, at stated contexts: ((context, bytes), ...),
    # from the memory plan (:func:`.page_tables.gpu_memory`); () when the file was not at hand
    gpu_memory: tuple[tuple[int, int], ...] = ()
    signed: bool = False  # its receipt is a signed DSSE envelope

    @classmethod
    def of(cls, st: Statement, artifact: str, receipt: str, chat_template: str | None = None) -> FileRow:
        p = st["predicate"]
        model = card_model_name(p)
        return cls(artifact=artifact, receipt=receipt, recipe=p["recipe"]["name"],
                   size_bytes=int(p["result"]["size_bytes"]), bpw=p["result"].get("bpw"),
                   quality=dict(p.get("quality") or {}), verification=dict(p.get("verification") or {}),
                   unverified=unverified_reason(st), source=dict(p["base_model"]["source"]), model=model,
                   tag=release_tag(artifact, model, p["recipe"].get("ftype")), chat_template=chat_template,
                   original=original_model(p), search=p["recipe"].get("search"), imatrix=p.get("imatrix"),
                   base_files=tuple((str(f["name"]), int(f.get("size") or 0)) for f in p["base_model"].get("files") or []))

    @property
    def verdict(self) -> str:
        return str(self.verification.get("verdict") or "not verified")

    @property
    def head(self) -> HeadFinding | None:
        """The head against its reference as audit re-derives it (the first mode's); None: not measured."""
        try:
            found = HeadComparison.of_dict(self.verification.get("head")).findings()
        except ValueError:
            return None
        return next(iter(found.values()), None)

    @property
    def shows_ci(self) -> bool:
        return enough_evidence(self.verification)


def shard_count(artifact: str) -> int:
    """How many files ``artifact`` is: a split one's first shard names the count (``-00001-of-00003``), else 1."""
    m = SPLIT_RE.match(artifact)
    return int(m.group("n")) if m else 1


def download_pattern(artifact: str) -> str:
    """What ``hf download --include`` takes for ``artifact``: its name, or every shard of a split one."""
    m = SPLIT_RE.match(artifact)
    return f"{m.group('stem')}-*-of-{m.group('n')}.gguf" if m else artifact


def verified_mtp_flags(v: Mapping[str, Any] | None) -> list[str]:
    """The draft flags the verification ran with (what the card's numbers are true for)."""
    st = _mapping(_mapping(v).get("settings"))
    flags = st.get("mtp_flags")
    if isinstance(flags, list) and flags:
        return [str(f) for f in flags]
    out = ["--spec-draft-n-max", str(st.get("draft_n_max") or 3)]
    if st.get("draft_n_min") is not None:
        out += ["--spec-draft-n-min", str(st["draft_n_min"])]
    return out


def verified_mtp_env(v: Mapping[str, Any] | None) -> str:
    env = _mapping(_mapping(_mapping(v).get("settings")).get("mtp_env"))
    return "".join(f"{k}={val} " for k, val in sorted(env.items()))


def build_line(v: Mapping[str, Any] | None) -> str:
    """The llama.cpp build these files need: one with ``--spec-type draft-mtp``."""
    server = _mapping(_mapping(v).get("server")).get("build_info")
    return (f"Needs llama.cpp with `--spec-type draft-mtp` (and, for `-hf`, its MTP sidecar search): ggufmtp "
            f"pins and verified with llama.cpp commit `{LLAMA_CPP_COMMIT}` (2026-10-01)"
            + (f", llama-server `{server}`" if server else "")
            + f". Which earlier build introduced `draft-mtp` is not recorded here, so use `{LLAMA_CPP_COMMIT}` or newer "
            "(`llama-server --help` lists `draft-mtp` under `--spec-type`).\n")


def picked_row(rows: Sequence[FileRow]) -> FileRow:
    """The row the run lines show: the largest verified file, else the first."""
    return next((r for r in sorted(rows, key=lambda r: -r.size_bytes) if not r.unverified), rows[0])


def run_lines(rows: Sequence[FileRow], options: PageOptions, sidecars: Mapping[str, str] | None = None) -> list[str]:
    """Download and run lines for every file, largest first (the largest verified one marked
    recommended), each with the draft window its verification ran; ``sidecars``: the MTP sidecar
    each trunk (by file name) is served with, downloaded with it."""
    if not rows:
        return []
    pick, repo, side = picked_row(rows), options.repo, sidecars or {}
    cmds: list[str] = []
    for r in sorted(rows, key=lambda r: -r.size_bytes):
        v = r.verification
        also = f' --include "{options.at(side[r.artifact])}"' if r.artifact in side else ""
        cmds += [f"# {r.artifact} ({r.tag or r.recipe}, {human_bytes(r.size_bytes)})"
                 + (" - recommended" if r is pick and len(rows) > 1 else "") + (" - not verified" if r.unverified else ""),
                 f'hf download {repo} --include "{options.at(download_pattern(r.artifact))}"{also} --local-dir .']
        flags = " ".join(verified_mtp_flags(v))
        if r.tag:
            cmds.append(f"{verified_mtp_env(v)}llama-server -hf {repo}:{r.tag} --spec-type draft-mtp {flags}")
        else:  # no tag selects it: the downloaded file
            cmds.append(f"{verified_mtp_env(v)}llama-server -m {options.at(r.artifact)} --spec-type draft-mtp {flags}")
        cmds.append("")
    out = ["```sh", *cmds[:-1], "```\n"]
    if len(rows) > 1:
        out.append(f'Every file: `hf download {repo} --include "{options.at("*.gguf")}" --local-dir .`.\n')
    v = pick.verification
    k = "the draft window each verification ran" if v else "llama.cpp's default draft window"
    out.append(f"`--spec-draft-n-max`: {k}. " + build_line(v))
    if not options.repo_id:
        out.append(f"`{REPO_PLACEHOLDER}`: the Hub repository these files are published in.\n")
    return out


def template_kind(template: str | None) -> str | None:
    if not template:
        return None
    return next((kind for marker, kind in _TEMPLATE_KINDS if marker in template), None)


def prompt_format_lines(template: str | None, modes: Sequence[str] = ()) -> list[str]:
    """``## Prompt format``: the chat template's kind where the GGUF tells, the thinking switch."""
    from ..gguf.model import template_supports_thinking

    kind = template_kind(template)
    if kind:
        text = (f"The GGUF carries its chat template, {kind}; llama-server applies it on `/v1/chat/completions`: "
                "send messages, not raw prompts.")
    elif template:
        text = ("The GGUF carries its chat template; llama-server applies it on `/v1/chat/completions`: send "
                "messages, not raw prompts.")
    else:
        text = ("Use llama-server's chat endpoint `/v1/chat/completions`, which applies the chat template "
                "stored in the GGUF: send messages, not raw prompts.")
    if template_supports_thinking(template) or "thinking" in modes:
        text += (' The template has a thinking switch: `"chat_template_kwargs": {"enable_thinking": false}` in '
                 "the request turns thinking off (acceptance is measured in each mode separately).")
    return ["## Prompt format\n", text + "\n", *template_block(template)]


def template_block(template: str | None) -> list[str]:
    """The chat template itself (the GGUF's ``tokenizer.chat_template``) as a folded code block; its
    fence is longer than any run of backticks in it, so no template closes the block early."""
    if not template:
        return []
    longest = max((len(m) for m in re.findall(r"`+", template)), default=0)
    fence = "`" * max(3, longest + 1)
    return ["<details><summary>The chat template (<code>tokenizer.chat_template</code> in the GGUF)</summary>\n",
            f"{fence}jinja\n{template.rstrip()}\n{fence}\n", "</details>\n"]


def read_chat_template(artifact: Any) -> str | None:
    """``tokenizer.chat_template`` of a GGUF (None: absent or the file does not read as a GGUF)."""
    from ..errors import GGUFReadError
    from ..gguf.reader import read_header

    try:
        value = read_header(artifact).metadata.get("tokenizer.chat_template")
    except (GGUFReadError, OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def unverified_reason(statement: Statement, artifact_sha256: str | None = None) -> str | None:
    """Why the receipt ``statement`` holds no publishable verification of the artifact with
    ``artifact_sha256`` (default: its first subject's); None when it does: verdict ``pass`` as its
    own figures and thresholds give it, of the bytes llama-server served, which are the artifact's
    (``verification.model.sha256``), with at least the minimum evidence (:class:`Evidence`)."""
    from .verdict import Evidence, judge_recorded

    v = statement["predicate"].get("verification")
    if not v:
        return "the receipt holds no runtime verification of it"
    if v.get("verdict") != "pass":
        recorded = "; ".join(str(r) for r in v.get("reasons") or [])
        if v.get("verdict") == "inconclusive":
            return ("its head finding is undecided, and publishing needs a decided head: verify with more evidence"
                    f"{': ' + recorded if recorded else ''}")
        return f"its verification failed (verdict {v.get('verdict')}{': ' + recorded if recorded else ''})"
    verdict, reasons = judge_recorded(v)
    if verdict.value != "pass":
        return f"its verification says pass, but its own figures and thresholds fail it ({'; '.join(reasons[:3])})"
    first = statement["subject"][0]["digest"]["sha256"]
    if artifact_sha256 is not None and artifact_sha256.lower() != str(first).lower():
        return f"its receipt's verification is of {statement['subject'][0]['name']} (sha256 {first})"
    short = Evidence.of_settings(v.get("settings")).shortfall
    if short:
        return (f"its verification measured too little to publish ({short}); verify again with at least "
                f"{Evidence.MIN_PROMPTS} prompts and --max-tokens {Evidence.MIN_MAX_TOKENS}")
    return verification_problem(statement, v)
