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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from ..constants import LLAMA_CPP_COMMIT
from ..fmt import ci_phrase, divergence, human_bytes, pct, points, significant, times
from ..gguf.model import SPLIT_RE
from ..quant.naming import model_name, selects, tag_problem
from .head import HeadComparison, HeadFinding, level_text
from .receipt import verification_problem
from .search_card import SearchRecord
from .statement import Predicate, Statement

__all__ = ["CardMeta", "FileRow", "PageOptions", "TAGS", "card_title", "files_table", "page_meta", "pick_lines",
           "prompt_format_lines", "run_lines", "verified_mtp_env", "verified_mtp_flags", "without_ci"]

TAGS = ["gguf", "llama.cpp", "mtp", "speculative-decoding"]
REPO_PLACEHOLDER = "OWNER/REPO"  # a card made without --repo: the publisher's repo goes there
HEADROOM_BYTES = 1 << 30  # memory beyond the file: the KV cache at a few thousand tokens, compute buffers
HEADROOM_FRACTION = 0.1
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
    license: NotRequired[str]


@dataclass(frozen=True)
class PageOptions:
    """What the publisher sets: the repo the card goes to (its download and run lines name it),
    ``quantized_by`` and a license overriding the inherited one."""

    repo_id: str | None = None
    quantized_by: str = "ggufmtp"
    license: str | None = None
    path_in_repo: str | None = None  # the repo folder the files go to (upload --path-in-repo)

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


def original_model(p: Predicate) -> str | None:
    """The original model's Hub repo: the checkpoint a converted GGUF came from, else the repo pulled."""
    bm = p["base_model"]
    conv = bm.get("converted_from")
    if conv:
        return conv.get("repo_id") or None
    src = bm["source"]
    return (src.get("repo_id") or None) if src.get("type") == "hub" else None


def page_meta(rows: Sequence[FileRow], options: PageOptions) -> CardMeta:
    """The metadata: ``base_model`` the original model, the license the source recorded (unless
    ``options.license``), ``quantized_by`` as set."""
    meta: CardMeta = {"tags": list(TAGS), "quantized_by": options.quantized_by, "pipeline_tag": "text-generation",
                      "library_name": "gguf"}
    base = next((r.original for r in rows if r.original), None)
    if base:
        meta["base_model"] = base
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

    @classmethod
    def of(cls, st: Statement, artifact: str, receipt: str, chat_template: str | None = None) -> FileRow:
        p = st["predicate"]
        model = card_model_name(p)
        return cls(artifact=artifact, receipt=receipt, recipe=p["recipe"]["name"],
                   size_bytes=int(p["result"]["size_bytes"]), bpw=p["result"].get("bpw"),
                   quality=dict(p.get("quality") or {}), verification=dict(p.get("verification") or {}),
                   unverified=unverified_reason(st), source=dict(p["base_model"]["source"]), model=model,
                   tag=release_tag(artifact, model, p["recipe"].get("ftype")), chat_template=chat_template,
                   original=original_model(p), search=p["recipe"].get("search"),
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


def _cell(text: str | None) -> str:
    return "-" if text in (None, "n/a", "") else str(text)


def head_cell(r: FileRow) -> str:
    """The head against its reference (difference in points, its CI where the evidence allows, the finding)."""
    f = r.head
    if f is None:
        return "-"
    lo, hi = f.difference_ci
    ci = f" ({level_text(f.level)} CI {points(lo, '')} to {points(hi, '')})" if r.shows_ci else ""
    return f"{points(f.difference, '')} pts{ci}, margin {f.margin * 100:.1f}: {f.decision.value}"


def _speed_judged(v: Mapping[str, Any]) -> bool:
    from .verdict import Thresholds, speed_checked

    try:
        return speed_checked(Thresholds.coerce(dict(_mapping(v.get("thresholds")))),
                             bool(_mapping(v.get("hardware")).get("offloaded")))
    except (TypeError, ValueError):
        return False


def speed_cell(r: FileRow) -> str:
    v = r.verification
    if not v:
        return "-"
    if not _speed_judged(v):
        return "not verified (no GPU offload)"
    ci = ci_phrase(v.get("speedup_ci95"), 1, 2, "×") if r.shows_ci else ""
    return _cell(times(v.get("speedup"), 2) + ci)


def verdict_cell(r: FileRow) -> str:
    """The verdict with its findings as audit re-derives them: "fail (...)" where they fail it,
    "inconclusive (...)" where the head is undecided, "not verified" for any other file without a
    publishable verification (never "pass")."""
    from .verdict import Verdict, judge_record

    if not r.verification:
        return "not verified"
    j = judge_record(r.verification)
    if r.unverified and j.verdict == Verdict.PASS:
        return "not verified"
    return f"{j.verdict.value} ({j.findings.text()})"


def _acceptance_cell(r: FileRow) -> str:
    m = _mapping(r.verification.get("mtp"))
    ci = ci_phrase(m.get("acceptance_ci95"), 100, 1, "%") if r.shows_ci else ""
    return _cell(pct(m.get("acceptance"), 1, space=False) + ci) if r.verification else "-"


def _bpw(x: float | None) -> str:
    return "-" if not isinstance(x, (int, float)) or not math.isfinite(x) else f"{x:.2f}"


def shard_count(artifact: str) -> int:
    """How many files ``artifact`` is: a split one's first shard names the count (``-00001-of-00003``), else 1."""
    m = SPLIT_RE.match(artifact)
    return int(m.group("n")) if m else 1


def download_pattern(artifact: str) -> str:
    """What ``hf download --include`` takes for ``artifact``: its name, or every shard of a split one."""
    m = SPLIT_RE.match(artifact)
    return f"{m.group('stem')}-*-of-{m.group('n')}.gguf" if m else artifact


def file_row(r: FileRow, options: PageOptions | None = None) -> str:
    q, n = r.quality, shard_count(r.artifact)  # a split artifact is one row: its first shard, the set's size
    link = (options or PageOptions()).at(r.artifact)
    return (f"| [{r.artifact}]({link}){f' ({n} shards)' if n > 1 else ''} | {_cell(r.tag)} | "
            f"{human_bytes(r.size_bytes)} | {_bpw(r.bpw)} | "
            f"{_cell(significant(q.get('ppl')))} | {_cell(divergence(q.get('kld_mean')))} | "
            f"{_cell(pct(q.get('same_top_p'), 2, space=False))} | {_acceptance_cell(r)} | {head_cell(r)} | "
            f"{speed_cell(r)} | {verdict_cell(r)} |")


def reference_row(rows: Sequence[FileRow]) -> str | None:
    """The reference the rows are measured against: the head's reference where one was measured,
    else the base model; its PPL and acceptance where a receipt has them. None: nothing known."""
    head_ref = next(((r, f) for r in rows if (f := r.head) is not None), None)
    ppl = next((r.quality.get("ppl_base") for r in rows if r.quality.get("ppl_base") is not None), None)
    if head_ref is not None:
        hc = HeadComparison.of_dict(head_ref[0].verification.get("head"))
        name, size, acc = hc.reference.name, hc.reference.size_bytes, head_ref[1].reference_acceptance
    elif rows and rows[0].base_files:
        name, size, acc = rows[0].base_files[0][0], sum(s for _, s in rows[0].base_files), None
    else:
        return None
    itself = ("0", "100%") if any(r.quality for r in rows) else ("-", "-")  # the KLD of the base against itself
    return (f"| `{name}` (reference, not in this repo) | reference | {human_bytes(size)} | - | "
            f"{_cell(significant(ppl))} | {itself[0]} | {itself[1]} | {_cell(pct(acc, 1, space=False))} | - | - | "
            "reference |")


def files_table(rows: Sequence[FileRow], options: PageOptions | None = None) -> list[str]:
    """``## Files``: one row per file, largest first, and the reference row."""
    out = ["## Files\n",
           "KLD and same top p are against the base model (`llama-perplexity --kl-divergence`); acceptance is "
           "the MTP head's draft acceptance in llama-server, and the head is judged against the reference's "
           "acceptance, paired by prompt (points of difference); speed is the decode speedup against vanilla "
           "llama-server with the same settings, judged only with GPU offload.\n",
           "| file | quant | size | bpw | PPL | KLD vs base | same top p | acceptance | head vs reference | speed "
           "| verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    out += [file_row(r, options) for r in sorted(rows, key=lambda r: -r.size_bytes)]
    ref = reference_row(rows)
    return out + ([ref] if ref else []) + [""]


def memory_needed(size_bytes: int) -> int:
    """The file's size plus headroom for the KV cache and compute buffers."""
    return size_bytes + max(HEADROOM_BYTES, int(size_bytes * HEADROOM_FRACTION))


def pick_lines(rows: Sequence[FileRow]) -> list[str]:
    """``## Which file should I pick``: the largest file that fits the memory at hand, by memory."""
    ordered = sorted(rows, key=lambda r: -r.size_bytes)
    out = ["## Which file should I pick\n",
           "The largest file that fits in your memory (GPU memory, or GPU and system memory together with "
           "partial offload) keeps the most quality. Each needs about its size plus 10% (at least 1 GiB) for "
           "the KV cache at a few thousand tokens of context and compute buffers; longer contexts need more.\n",
           "| memory you have | pick |", "|---|---|"]
    said: set[str] = set()
    for r in ordered:  # the largest file of each memory size
        need = human_bytes(memory_needed(r.size_bytes))
        if need in said:
            continue
        said.add(need)
        note = "" if not r.unverified else " (not verified)"
        out.append(f"| {need} or more | `{r.artifact}`{f' ({r.tag})' if r.tag else ''}{note} |")
    return out + [""]


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


def run_lines(rows: Sequence[FileRow], options: PageOptions, sidecar: str | None = None) -> list[str]:
    """Download and run lines of the first row that is verified (else the first), and the other tags;
    ``sidecar``: the MTP sidecar that row, a trunk, is served with (downloaded with it)."""
    if not rows:
        return []
    pick = picked_row(rows)
    v, repo = pick.verification, options.repo
    flags = " ".join(verified_mtp_flags(v))
    also = f' --include "{options.at(sidecar)}"' if sidecar else ""
    cmds = [f'hf download {repo} --include "{options.at(download_pattern(pick.artifact))}"{also} --local-dir .']
    if pick.tag:
        cmds.append(f"{verified_mtp_env(v)}llama-server -hf {repo}:{pick.tag} --spec-type draft-mtp {flags}")
    out = ["```sh", *cmds, "```\n"]
    others = [r.tag for r in rows if r is not pick and r.tag]
    if others:
        out.append(f"Another file: its tag after the colon ({', '.join(f'`:{t}`' for t in others)}), or "
                   f'`hf download {repo} --include "{options.at("*.gguf")}"` for every file.\n')
    k = "the draft window the verification ran" if v else "llama.cpp's default draft window"
    out.append(f"`{flags}`: {k}. " + build_line(v))
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
    return ["## Prompt format\n", text + "\n"]


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
