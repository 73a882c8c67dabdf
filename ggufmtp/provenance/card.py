"""``ggufmtp card``: a Hugging Face model card built from a receipt (and its verification).

Built with huggingface_hub's ``ModelCard`` / ``ModelCardData``. Every figure comes from the
receipt; a section with no data is left out, never filled with placeholders.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from ..files.fsutil import atomic_write_text
from ..fmt import ci_phrase, human_bytes, num, pct, points, times
from ..runtime.hardware import format_bandwidth
from .card_page import (  # unverified_reason: the card's, kept importable from here
    TAGS,
    CardMeta,
    FileRow,
    PageOptions,
    card_title,
    enough_evidence,
    page_meta,
    prompt_format_lines,
    read_chat_template,
    run_lines,
    unverified_reason,
    verified_mtp_env,
    verified_mtp_flags,
    without_ci,
)
from .head import HeadFinding
from .page_tables import files_tables, with_gpu_memory
from .page_text import imatrix_lines
from .pair_card import SidecarFile, draft_lines, find_sidecar, pair_lines, trunk_intro, trunk_sidecar
from .quality_card import quality_lines
from .search_card import search_lines
from .statement import (
    ArmSection,
    CurveSection,
    MatrixSection,
    Predicate,
    ProfilesSection,
    ResultSection,
    Statement,
    SubjectEntry,
    Verification,
)
from .vacuous import vacuous_notice
from .verdict import OVERALL_RULE, HeadBasis, judge_record

__all__ = ["TAGS", "UNVERIFIED_HEADING", "CardMeta", "card_text", "make_card", "unverified_reason"]

# The heading of the section a card carries when its artifact has no passing verification bound to
# it; ``upload --allow-unverified`` requires it in the card it publishes.
UNVERIFIED_HEADING = "## Not verified"


# The card's number styles: fmt.py's formatters, "n/a" for an unknown number (never 0), "×" for ratios.
_pct = functools.partial(pct, space=False)
_x = functools.partial(times, nd=2)
_tps = functools.partial(num, nd=1)
_ci_pct = functools.partial(ci_phrase, scale=100, digits=1, unit="%")
_ci_x = functools.partial(ci_phrase, digits=2, unit="×")


def _hardware(v: Verification) -> str:
    hw = v.get("hardware") or {}
    gpu = hw.get("gpu") or hw.get("gpus")
    if isinstance(gpu, list):
        gpu = ", ".join(str(g) for g in gpu)
    if gpu and hw.get("offloaded", True):
        return str(gpu)
    return f"CPU ({hw.get('cpu') or hw.get('cpu_model') or 'unknown'}, {hw.get('cores', '?')} cores)"


def _unverified_notice(problem: str | None) -> list[str]:
    if problem is None:
        return []
    return [f"{UNVERIFIED_HEADING}\n", f"This artifact has no passing runtime verification: {problem}. "
            "It was not checked in llama-server to the recipe's standard; any figures below are not a "
            "verified claim.\n"]


def card_text(statement: Statement, artifact_name: str | None = None, options: PageOptions | None = None,
              chat_template: str | None = None, sidecar: SidecarFile | None = None,
              row: FileRow | None = None) -> tuple[CardMeta, str]:
    """(YAML metadata, markdown body) for the artifact a receipt describes: the model page
    (:mod:`.card_page`, :mod:`.page_tables`: title, the Files table by memory, download and run
    lines, prompt template, imatrix), then the evidence. ``chat_template``: the GGUF's
    ``tokenizer.chat_template`` where known. A trunk's (its receipt names its MTP sidecar) explains
    the pair (:mod:`.pair_card`; ``sidecar``: that file's sizes, where at hand). ``row``: the file's
    row as :func:`make_card` reads it with the file at hand (its GPU memory, its signature)."""
    o = options or PageOptions()
    p = statement["predicate"]
    subj = statement["subject"][0]
    name = artifact_name or subj["name"]
    res = p["result"]
    rec = p["recipe"]
    v = p.get("verification")
    unverified = unverified_reason(statement)
    row = row or FileRow.of(statement, name, name + ".receipt.json", chat_template)
    shown = v if not v or enough_evidence(v) else without_ci(v)  # no 95% CI below the evidence minimum
    named = trunk_sidecar(p)
    side = sidecar or (SidecarFile(named["name"]) if named else None)
    intro = (trunk_intro(name, row.model, side.name) if side else
             f"`{name}`: an MTP runtime GGUF of {row.model}. The multi-token-prediction (NextN) {_heads(res)} "
             f"({res['mtp_status']}) so `llama-server --spec-type draft-mtp` can draft with it.")
    lines = [f"# {card_title(row.model)}\n", f"{intro} Recipe `{rec['name']}` ({rec['ftype']}), "
             f"{_bits(res.get('bpw'))} bits per weight, {human_bytes(res['size_bytes'])}.\n"]
    lines += _unverified_notice(unverified) + vacuous_notice(v)
    lines += files_tables([row], o, quality=False) + _how_to_run(name, v, [row], o, side)
    lines += pair_lines([row], [side], o) if side else []
    modes = (v or {}).get("modes")
    lines += prompt_format_lines(chat_template, list(modes) if isinstance(modes, dict) else [])
    if shown:
        lines += _claim(shown, v, unverified) + _tables(shown)
    lines += quality_lines(p) + imatrix_lines([row]) + search_lines(rec.get("search"), rec["name"])
    lines += _caveats(p) + _provenance(p, subj, name)
    return page_meta([row], o), "\n".join(lines)


def _bits(bpw: object) -> str:
    return f"{bpw:.2f}" if isinstance(bpw, (int, float)) else "n/a"


def _heads(res: ResultSection) -> str:
    """"head `blk.40` is kept", or "heads `blk.40`, `blk.41` are kept" for a chain (a receipt
    without ``mtp_blocks`` predates chains: its ``mtp_block`` is the head)."""
    blocks = res.get("mtp_blocks") or [res["mtp_block"]]
    named = ", ".join(f"`blk.{b}`" for b in blocks)
    return f"heads {named} are kept" if len(blocks) > 1 else f"head {named} is kept"


def _speed_checked(v: Verification) -> bool:
    from .verdict import speed_judged_record

    return speed_judged_record(v)


def _claim(v: Verification, judged_v: Verification, unverified: str | None) -> list[str]:
    """The verification in one sentence, saying exactly what was verified: acceptance always; the
    fair speedup (against vanilla with the same non-speculative settings) only where the verdict
    judged it (GPU offload); elsewhere "speed not verified on this hardware" with the measured ratio.
    ``v`` is what is shown (without CIs below the evidence minimum), ``judged_v`` the recorded
    section the verdict is re-derived from; with ``unverified`` (why it is no publishable
    verification) the sentence says "measured" and the verdict "not verified", never "pass"."""
    from .verdict import Evidence, Placement

    m, suite, settings = v["mtp"], v.get("suite", {}), v.get("settings", {})
    length = m.get("mean_acceptance_length")
    acceptance = (f"**{_pct(m['acceptance'])}** draft acceptance{_ci_pct(m.get('acceptance_ci95'))}"
                  + (f" (mean acceptance length {num(length)} tokens per verification step)" if length is not None else ""))
    speed = (f"**{_x(v.get('speedup'))}** decode speedup{_ci_x(v.get('speedup_ci95'))} against vanilla llama-server "
             f"with the same non-speculative settings" + _default_phrase(v))
    where = (f" on {suite.get('n_prompts', 'the')} prompts of suite `{suite.get('name')}`, {_hardware(v)}, "
             f"k={settings.get('draft_n_max')}, seeds {', '.join(str(s) for s in settings.get('seeds', []))}. ")
    th = v.get("thresholds") or {}
    if unverified:
        head = (f"Measured in llama-server (not a verified claim: see {UNVERIFIED_HEADING.lstrip('# ')}): "
                f"{acceptance}" + (f" and {speed}" if _speed_checked(v) else "") + where)
    elif _speed_checked(v):
        head = f"Runtime-verified in llama-server: {acceptance} and {speed}{where}"
    else:
        head = (f"MTP head verified in llama-server: {acceptance}{where}**Speed not verified on this hardware**: "
                f"{_x(v.get('speedup'))} vanilla{_ci_x(v.get('speedup_ci95'))} ({Placement.of_record(v).why_unjudged()}; "
                f"the speedup threshold was not applied). ")
    ev = Evidence.of_settings(settings)
    j = judge_record(judged_v)  # what audit judges: the card states the findings as the audit re-derives them
    verdict = (f"**not verified** (its figures alone: {j.findings.text()})" if unverified and j.verdict.value == "pass"
               else f"**{j.verdict.value}** ({j.findings.text()})")
    basis = (f"the head non-inferior to the reference within {_head_margin(v)}"
             if j.findings.head_basis in (HeadBasis.REFERENCE, HeadBasis.BOTH) else "")
    minimum = (f"acceptance >= {_pct(th.get('min_acceptance'))}"
               if j.findings.head_basis in (HeadBasis.MINIMUM, HeadBasis.BOTH) else "")
    judged = ", ".join(x for x in (basis, minimum, f"speedup >= {_x(th.get('min_speedup'))}" if _speed_checked(v) else "")
                       if x)
    return ["## One-line claim\n",
            head + f"Output identical to vanilla decoding for {_pct(v.get('identical_output_fraction'))} of requests"
            f"{_numerics_phrase(v)}. Verdict: {verdict} against thresholds from "
            f"{th.get('source', 'nowhere')} ({judged}); evidence: {ev.text()}.\n"] + _head_lines(v, enough_evidence(v)) + \
        [f"Rule: {OVERALL_RULE}.\n"]


def _head_margin(v: Verification) -> str:
    h = v.get("head") if isinstance(v.get("head"), dict) else {}
    m = h.get("margin")
    return f"{m * 100:.1f} acceptance points" if isinstance(m, (int, float)) else "its margin"


def _head_lines(v: Verification, with_ci: bool = True) -> list[str]:
    """The head against its reference, as audit re-derives it from the recorded pairs (its 95% CI
    only ``with_ci``: not below the evidence minimum)."""
    from .head import HeadComparison

    if v.get("head") is None:
        return []
    try:
        hc = HeadComparison.of_dict(v.get("head"))
    except ValueError:
        return []
    ref = f"`{hc.reference.name}` (sha256 `{hc.reference.sha256[:16]}`)"
    return [f"Head against the reference {ref}, paired by prompt and seed at k={hc.k}: "
            + "; ".join(f"{'' if m == 'default' else m + ': '}{f.text() if with_ci else _head_text(f)}"
                        for m, f in hc.findings().items()) + ".\n"]


def _head_text(f: HeadFinding) -> str:
    """:meth:`HeadFinding.text` without the CI (below the evidence minimum)."""
    return (f"{_pct(f.acceptance)} vs reference {_pct(f.reference_acceptance)}, difference {points(f.difference)} "
            f"({f.decision.value}; margin {f.margin * 100:.1f} points)")


def _numerics_phrase(v: Verification) -> str:
    """How many listed differences the numerics rule explains, and at what drift (empty: none)."""
    from .numerics import RecordedMismatch, explained_by_numerics

    drift, positions = v.get("numerics_drift_nats"), v.get("numerics_positions")
    mism = v.get("mismatches") if isinstance(v.get("mismatches"), list) else []
    n = sum(explained_by_numerics(RecordedMismatch.of(x), drift if isinstance(drift, (int, float)) else None,
                                  positions if isinstance(positions, int) else 0) for x in mism)
    if not n:
        return ""
    return (f"; {n} difference(s) explained by numerics (vanilla's runner-up at a near-tie within the batching drift "
            f"of {drift:.3g} nats, measured on {positions} positions)")


def _default_phrase(v: Verification) -> str:
    """The speedup against llama-server's defaults, labelled so (empty when not measured)."""
    if "speedup_vs_default_vanilla" not in v:
        return ""
    return (f" ({_x(v.get('speedup_vs_default_vanilla'))}{_ci_x(v.get('speedup_vs_default_vanilla_ci95'))} "
            "against vanilla with llama-server's defaults, which also counts what those settings give plain decoding)")


def _how_to_run(name: str, v: Verification | None, rows: list[FileRow], options: PageOptions,
                sidecar: SidecarFile | None = None) -> list[str]:
    """Download and run from the Hub (:func:`.card_page.run_lines`) with the draft that tag loads
    (:func:`.pair_card.draft_lines`, the ladder card's), the llama-server command on the downloaded
    file the verification's numbers are true for (a trunk's with its ``sidecar``), and a request."""
    lines = ["## How to run\n", *run_lines(rows, options, {name: sidecar.name} if sidecar else None),
             *draft_lines(rows, [sidecar] if sidecar else [], options), "With the downloaded file:\n"]
    local, side = options.at(name), options.at(sidecar.name) if sidecar else None
    lines.append("```sh\n"
                 f"{verified_mtp_env(v)}llama-server -m {local}{f' -md {side}' if side else ''} -ngl 999 -c 4096 \\\n"
                 f"  --spec-type draft-mtp {' '.join(verified_mtp_flags(v))}\n"
                 "```\n")
    lines.append("Request (through the chat template):\n\n```sh\n"
                 "curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' -d '{\n"
                 '  "messages": [{"role": "user", "content": "Write a Python function that reverses a string."}],\n'
                 '  "max_tokens": 256, "temperature": 0}\'\n```\n')
    lines.append("`timings.draft_n` (drafted) and `timings.draft_n_accepted` (accepted) in the response show the "
                 "MTP head at work; speculation is configured by server flags only.\n")
    return lines


def _caveats(p: Predicate) -> list[str]:
    """What the numbers do not say."""
    lines = ["## Caveats\n"]
    lines.append("- Send requests through `/v1/chat/completions` (or apply the chat template yourself): raw prompts "
                 "through `/completion` are out of distribution for the head and lower acceptance.\n"
                 "- The speedup depends on the hardware: it needs a memory-bound decode (a large model on a GPU); "
                 "on small or compute-bound setups MTP can be slower than vanilla decoding.\n"
                 "- Acceptance is runtime-verified, not a calibrated claim about the draft head"
                 + (f"; the imatrix has no statistics for {len(p['imatrix']['missing'])} tensor(s) "
                    f"(llama-imatrix never collects the MTP block)" if p.get("imatrix") and p["imatrix"]["missing"] else "")
                 + ".\n")
    return lines


def _provenance(p: Predicate, subj: SubjectEntry, name: str) -> list[str]:
    """Where every input came from, with digests, and how to check the artifact."""
    src, rec, v = p["base_model"]["source"], p["recipe"], p.get("verification")
    lines = ["## Provenance\n"]
    base = src.get("repo_id") or src.get("name") or src.get("path")
    lines.append(f"- Base model: `{base}`" + (f" at revision `{src['commit']}`" if src.get("commit") else ""))
    for f in p["base_model"]["files"]:
        lines.append(f"  - `{f['name']}` sha256 `{f['sha256']}`")
    if p.get("imatrix"):
        im = p["imatrix"]
        lines.append(f"- Imatrix: `{im['file']}` sha256 `{im['sha256']}` ({im['entries']} entries, "
                     f"{im['chunk_count']} chunks, datasets: {', '.join(im['datasets']) or '-'})")
    digest = f"sha256 `{rec['sha256']}`" if rec.get("sha256") else "(a llama-quantize type, no recipe file)"
    lines.append(f"- Recipe: `{rec['name']}` {digest}; equivalent command: "
                 f"`{rec.get('llama_quantize_command', '')}`")
    tc = p["toolchain"]
    lines.append(f"- llama.cpp commit `{tc['quantizer']['llama_cpp_commit']}` (quantizer: libllama via "
                 f"llama-cpp-python {tc['llama_cpp_python']}); ggufmtp {tc['ggufmtp']}")
    if v and v.get("server"):
        lines.append(f"- Verified with llama-server `{v['server'].get('build_info')}`")
    lines.append(f"- Artifact sha256: `{subj['digest']['sha256']}`")
    lines.append("\nCheck it: `ggufmtp audit " + name + " --receipt " + name + ".receipt.json`\n")
    return lines


def _tables(v: Verification) -> list[str]:
    out: list[str] = []
    cats = v.get("per_category") or {}
    if cats:
        out += ["## Measured\n", "| arm | acceptance | tok/s | speedup vs vanilla |", "|---|---|---|---|",
                f"| overall | {_pct(v['mtp']['acceptance'])}{_ci_pct(v['mtp'].get('acceptance_ci95'))} | "
                f"{_tps(v['mtp'].get('tokens_per_second'))} | {_x(v.get('speedup'))}{_ci_x(v.get('speedup_ci95'))} |"]
        if "speedup_vs_default_vanilla" in v:
            out.append(f"| vs default vanilla | | {_tps(v['mtp'].get('tokens_per_second'))} | "
                       f"{_x(v.get('speedup_vs_default_vanilla'))}{_ci_x(v.get('speedup_vs_default_vanilla_ci95'))} "
                       "(llama-server's defaults) |")
        for cat, c in cats.items():
            out.append(f"| {cat} | {_pct(c.get('acceptance'))}{_ci_pct(c.get('acceptance_ci95'))} | "
                       f"{_tps(c.get('tokens_per_second'))} | {_x(c.get('speedup'))} |")
        out.append(f"\nVanilla decode: {_tps(v['vanilla'].get('tokens_per_second'))} tok/s with the same "
                   "non-speculative settings as the MTP arm.\n")
        out += _arm_settings(v) + _draft_line(v["mtp"])
        bw = format_bandwidth(v.get("bandwidth"))
        if bw:
            out.append(bw[0].upper() + bw[1:] + ".\n")
    seeds = v.get("per_seed") or {}
    if seeds:
        out.append("Per seed: " + " · ".join(f"seed {s} → {_pct(x.get('acceptance'))} / {_x(x.get('speedup'))}"
                                              for s, x in seeds.items()) + "\n")
    sweep = v.get("sweep") or []
    if sweep:
        out += ["## Draft window\n", "| k | acceptance | tok/s | speedup |", "|---|---|---|---|"]
        for row in sweep:
            out.append(f"| {row.get('k')} | {_pct(row.get('acceptance'))}{_ci_pct(row.get('acceptance_ci95'))} | "
                       f"{_tps(row.get('tokens_per_second'))} | {_x(row.get('speedup'))}{_ci_x(row.get('speedup_ci95'))} |")
        out.append("")
    out += _recommended(v)
    out += _curve(v.get("acceptance_curve")) + _profiles(v.get("profiles")) + _matrix(v.get("matrix"))
    return out


def _recommended(v: Verification) -> list[str]:
    """The command the receipt's ``tuned`` section recommends (:mod:`.tuned`: a search's, a sweep's,
    or the profile ``verify --tuned-from`` verified on this file), said plainly to be vanilla's when
    MTP is not recommended on the hardware measured (slower, undecided or not lossless, as its CI
    says: :func:`_not_recommended_why`), never shown as MTP settings then."""
    tuned = v.get("tuned")
    if not tuned or not tuned.get("command"):
        return []
    out = ["## Recommended server settings\n"]
    speedup = tuned.get("speedup", tuned.get("best_speedup"))
    ci = tuned.get("speedup_ci95", tuned.get("best_speedup_ci95"))
    figures = f"speedup {_x(speedup)}{_ci_x(ci)}"
    profile, beats = tuned.get("profile"), tuned.get("mtp_beats_vanilla") is not False
    if profile:
        out.append(f"The profile `{profile.get('name')}` ({tuned.get('kind') or 'hand-written'}, sha256 "
                   f"`{str(profile.get('sha256'))[:16]}…`), verified on this file with `ggufmtp verify --tuned-from` "
                   "against vanilla with the same non-speculative settings" + (f": {figures}.\n" if beats else ".\n"))
    block = f"```sh\n{tuned['command']}\n```\n"
    if beats:
        return [*out, block]
    hardware = _hardware(cast(Verification, {"hardware": tuned.get("hardware") or v.get("hardware") or {}}))
    out += [f"{_not_recommended_why(ci)}, {hardware}: {figures}. The recommendation is to serve this file "
            "without MTP:\n", block]
    mtp = tuned.get("mtp_command")
    if mtp and mtp != tuned["command"]:
        out += ["The best MTP configuration measured, not recommended on that hardware:\n", f"```sh\n{mtp}\n```\n"]
    return out


def _not_recommended_why(ci: Sequence[float | None] | None) -> str:
    """Why MTP is not recommended, as its CI says: slower only when the whole CI is below 1.0; an
    interval spanning 1.0 (or none) is undecided, not a loss; a CI above 1.0 means the output failed."""
    lo, hi = (ci[0], ci[1]) if ci and len(ci) == 2 else (None, None)
    if lo is None or hi is None:
        return "**MTP was not shown to be faster on the hardware measured** (undecided: no CI)"
    if hi < 1.0:
        return "**MTP was slower on the hardware measured** (its 95% CI below 1.0)"
    if lo > 1.0:
        return "**MTP was faster, but its output was not vanilla's on the hardware measured** (not lossless)"
    return "**MTP was not shown to be faster on the hardware measured** (undecided: its 95% CI spans 1.0)"


def _arm_settings(v: Verification) -> list[str]:
    """The arms' exact llama-server arguments (what the speedup compares)."""
    flags = (v.get("settings") or {}).get("mtp_flags")
    van = (v.get("vanilla") or {}).get("server_args")
    out = []
    if flags:
        out.append(f"MTP arm run with the tuned flags `{verified_mtp_env(v)}{' '.join(flags)}`; the vanilla arm with "
                   "their non-speculative part too.\n")
    if van is not None:
        out.append(f"Arms: vanilla `{' '.join(van)}`; MTP `{' '.join((v.get('mtp') or {}).get('server_args') or [])}`"
                   + (f"; default vanilla `{' '.join(v['default_vanilla'].get('server_args') or [])}`"
                      if v.get("default_vanilla") else "") + ".\n")
    return out


def _draft_line(m: ArmSection) -> list[str]:
    """Mean acceptance length and acceptance by position, as llama.cpp and vLLM report them."""
    length, by_pos = m.get("mean_acceptance_length", m.get("tokens_per_step")), m.get("acceptance_by_position")
    if length is None and not by_pos:
        return []
    return [f"Mean acceptance length (1 + accepted / verification steps): {num(length)}"
            + ("; acceptance by position (accepted at i / steps): "
               + " · ".join(f"{i + 1}: {_pct(p)}" for i, p in enumerate(by_pos)) if by_pos else "") + ".\n"]


def _curve(c: CurveSection | None) -> list[str]:
    points = (c or {}).get("points") or []
    if not points:
        return []
    out = [f"## Speedup versus acceptance on this hardware (k={c.get('draft_n_max')})\n",
           "Synthetic acceptance (`--spec-synth-len`): what a head of any quality would gain here.\n",
           "| acceptance | mean acceptance length | speedup |", "|---|---|---|"]
    for p in points:
        out.append(f"| {_pct(p.get('acceptance'))}{_ci_pct(p.get('acceptance_ci95'))} | "
                   f"{num(p.get('tokens_per_step'))} | {_x(p.get('speedup'))}{_ci_x(p.get('speedup_ci95'))} |")
    if c.get("breakeven_acceptance") is not None:
        out.append(f"\nBreak-even acceptance: {_pct(c['breakeven_acceptance'])}.\n")
    return out + [""]


def _profiles(pr: ProfilesSection | None) -> list[str]:
    rows = (pr or {}).get("decision_table") or []
    if not rows:
        return []
    out = ["## Serving profiles\n", "| workload | shape | vanilla tok/s | MTP tok/s | MTP helps? | why |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.get('workload')} {r.get('title', '')} | {r.get('shape', '')} | "
                   f"{_tps(r.get('vanilla_tokens_per_second'))} | {_tps(r.get('mtp_tokens_per_second'))} | "
                   f"{r.get('mtp_helps')} | {r.get('reasoning', '')} |")
    return out + [""]


def _matrix(mx: MatrixSection | None) -> list[str]:
    """``verify --matrix``: acceptance and fair speedup per KV-cache type and context depth."""
    cells = (mx or {}).get("cells") or []
    if not cells:
        return []
    out = ["## KV cache and context depth\n",
           "Speedup against vanilla with the same KV-cache type, depth and server settings; decode speed at depth.\n",
           "| KV cache | depth | acceptance | mean acceptance length | speedup | identical output | verdict |",
           "|---|---|---|---|---|---|---|"]
    for c in cells:
        length = c.get("mean_acceptance_length")
        out.append(f"| {c.get('kv_type') or 'default'} | {c.get('depth')} | {_pct(c.get('acceptance'))}"
                   f"{_ci_pct(c.get('acceptance_ci95'))} | {'-' if length is None else f'{length:.2f}'} | "
                   f"{_x(c.get('speedup'))}{_ci_x(c.get('speedup_ci95'))} | "
                   f"{_pct(c.get('identical_output_fraction'))} | {c.get('verdict')} |")
    return out + [""]


def make_card(artifact: str | Path, receipt: str | Path, output: str | Path | None = None, *,
              quantized_by: str = "ggufmtp", license: str | None = None, repo_id: str | None = None,
              path_in_repo: str | None = None, base_model: str | None = None) -> Path:
    """Write the model card (default: README.md beside the artifact); returns its path. A receipt
    edited after it was written (its integrity digest does not hold) is refused: a card states
    only what an intact receipt claims (``audit`` and ``upload`` re-check the bytes). ``repo_id``:
    the Hub repo the card's download and run lines name, ``path_in_repo`` the folder the files go to
    there; ``license`` overrides the inherited one, ``base_model`` the upstream model the receipt
    names (CardError: not a Hub model repo id); the prompt template is read from the artifact where
    it reads as a GGUF, and the GPU memory it needs from its header."""
    from huggingface_hub import ModelCard, ModelCardData

    from ..errors import AuditError
    from .receipt import read_receipt

    rc = read_receipt(receipt)
    st = rc.statement
    if not rc.intact:
        raise AuditError(f"{receipt}: the receipt was edited after it was written (its integrity digest does not "
                         f"match); no card is written from it (check it: ggufmtp audit {Path(artifact).name})")
    options = PageOptions(repo_id=repo_id, quantized_by=quantized_by, license=license, path_in_repo=path_in_repo,
                          base_model=base_model)
    named = trunk_sidecar(st["predicate"])
    sidecar = find_sidecar(Path(artifact), named) if named else None
    name, template = Path(artifact).name, read_chat_template(artifact)
    row = dataclasses.replace(FileRow.of(st, name, name + ".receipt.json", template), signed=rc.signed)
    row = with_gpu_memory(row, artifact, sidecar.path if sidecar else None)  # a trunk's with its sidecar, if found
    meta, body = card_text(st, name, options, template, sidecar, row)
    data = ModelCardData(**meta)
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
    out = Path(output) if output else Path(artifact).with_name("README.md")
    atomic_write_text(out, str(card))
    return out
