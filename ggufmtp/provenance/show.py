"""``ggufmtp receipt show``: a receipt for people."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..fmt import ci_phrase, human_bytes, num, pct, times
from ..gguf.model import format_blocks
from .signing import UNSIGNED_NOTE
from .statement import Statement


def _size(n: object) -> str:
    """A byte count as the console shows one: ``6.9 MiB (7,254,816 bytes)``; ``unknown`` when missing."""
    return f"{human_bytes(n)} ({n:,} bytes)" if isinstance(n, int) and not isinstance(n, bool) else "size unknown"


def _text(v: object, missing: str = "unknown") -> str:
    return missing if v is None or v == "" else str(v)


def _digest(sha256: object) -> str:
    """`` sha256 HEX``, or nothing where the receipt records none (a llama-quantize type has no file)."""
    return f" sha256 {sha256}" if sha256 else ""


def _blocks(res: Mapping[str, Any]) -> str:
    """The MTP blocks and status, ``blk.4 complete``; ``no block (absent)`` for a trunk (none recorded)."""
    listed = res.get("mtp_blocks")
    blocks = [b for b in (listed if isinstance(listed, list) else [res.get("mtp_block")]) if isinstance(b, int)]
    status = _text(res.get("mtp_status"))
    return f"{format_blocks(blocks)} {status}" if blocks else f"no block ({status})"


def _recipe_line(r: Mapping[str, Any]) -> str:
    what = f"file {r['file']}{_digest(r.get('sha256'))}" if r.get("file") else (
        _digest(r.get("sha256")).strip() or "a llama-quantize type, no recipe file")
    return f"  recipe    {_text(r.get('name'))} ({_text(r.get('ftype'))}), {what}"


def _verified_line(v: Mapping[str, Any]) -> str:
    m = v.get("mtp") or {}
    return (f"  verified  acceptance {pct(m.get('acceptance'))}{ci_phrase(m.get('acceptance_ci95'), 100, 1, ' %')}, "
            f"speedup {times(v.get('speedup'), 2)}{ci_phrase(v.get('speedup_ci95'), 1, 2, '×')}, "
            f"verdict {_text(v.get('verdict'))}")


def format_receipt(st: Statement, signed: bool | None = None) -> str:
    """The receipt for people (numbers, sizes and percentages as the console writes them,
    :mod:`ggufmtp.fmt`; nothing missing reads ``None``); ``signed`` (when known) adds what the
    file's signature proves."""
    p = st.get("predicate", {})
    lines = [f"receipt ({st.get('predicateType')})"]
    for s in st.get("subject", []):
        lines.append(f"  artifact  {s['name']}  {_size(s.get('annotations', {}).get('size'))}  sha256 {s['digest']['sha256']}")
    bm = p.get("base_model") or {}
    src = bm.get("source", {})
    lines.append(f"  base      {_text(src.get('repo_id') or src.get('name') or src.get('path'))}"
                 + (f" @ {src['commit']}" if src.get("commit") else ""))
    for f in bm.get("files", []):
        lines.append(f"            {f['name']}  {_size(f.get('size'))}  sha256 {f['sha256']}")
    im = p.get("imatrix")
    lines.append(f"  imatrix   {im['file']} sha256 {im['sha256']} ({im['format']}, {im['entries']} entries, "
                 f"{im['chunk_count']} chunks, datasets {', '.join(im['datasets']) or '-'}, no stats for {len(im['missing'])})"
                 if im else "  imatrix   none")
    r = p.get("recipe", {})
    lines.append(_recipe_line(r))
    for rule in r.get("rules", []):
        lines.append(f"            {rule['source']:<18} {rule['pattern']} -> {rule['type']}")
    res = p.get("result", {})
    lines.append(f"  result    {_text(res.get('file_type'))}, {_size(res.get('size_bytes'))}, {num(res.get('bpw'), 2)} bpw, "
                 f"{len(res.get('tensor_types', {}))} tensors (table sha256 {_text(res.get('tensor_types_sha256'))[:16]}...)")
    lines.append(f"  MTP       {_blocks(res)}, "
                 f"nextn_predict_layers {_text(res.get('nextn_predict_layers'))}")
    tc = p.get("toolchain", {})
    q = tc.get("quantizer", {})
    lines.append(f"  toolchain ggufmtp {_text(tc.get('ggufmtp'))}, llama.cpp {_text(q.get('llama_cpp_commit'))} "
                 f"({_text(q.get('variant'))}), llama-cpp-python {_text(tc.get('llama_cpp_python'))}, "
                 f"gguf {_text(tc.get('gguf'))}, python {_text(tc.get('python'))}")
    lines.append(f"            {_text(tc.get('compiler'))}; {_text(tc.get('os'))}; cpu {' '.join(tc.get('cpu_flags', []))}")
    lines.append(f"  time      {_text(p.get('started_at'))} -> {_text(p.get('finished_at'))}")
    v = p.get("verification")
    lines.append(_verified_line(v) if v else "  verified  not yet")
    if signed is not None:
        lines.append("  signature " + ("DSSE envelope (check it: ggufmtp audit ARTIFACT --public-key PUB.pem)"
                                       if signed else UNSIGNED_NOTE))
    return "\n".join(lines)
