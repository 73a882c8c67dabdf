"""``ggufmtp receipt show``: a receipt for people."""

from __future__ import annotations

from collections.abc import Sequence

from .signing import UNSIGNED_NOTE
from .statement import Statement


def format_receipt(st: Statement, signed: bool | None = None) -> str:
    """The receipt for people; ``signed`` (when known) adds what the file's signature proves."""
    p = st.get("predicate", {})
    lines = [f"receipt ({st.get('predicateType')})"]
    for s in st.get("subject", []):
        lines.append(f"  artifact  {s['name']}  {s.get('annotations', {}).get('size')} bytes  sha256 {s['digest']['sha256']}")
    bm = p.get("base_model") or {}
    src = bm.get("source", {})
    lines.append(f"  base      {src.get('repo_id') or src.get('name') or src.get('path')}"
                 + (f" @ {src['commit']}" if src.get("commit") else ""))
    for f in bm.get("files", []):
        lines.append(f"            {f['name']}  {f['size']} bytes  sha256 {f['sha256']}")
    im = p.get("imatrix")
    lines.append(f"  imatrix   {im['file']} sha256 {im['sha256']} ({im['format']}, {im['entries']} entries, "
                 f"{im['chunk_count']} chunks, datasets {', '.join(im['datasets']) or '-'}, no stats for {len(im['missing'])})"
                 if im else "  imatrix   none")
    r = p.get("recipe", {})
    lines.append(f"  recipe    {r.get('name')} ({r.get('ftype')}) sha256 {r.get('sha256')}")
    for rule in r.get("rules", []):
        lines.append(f"            {rule['source']:<18} {rule['pattern']} -> {rule['type']}")
    res = p.get("result", {})
    lines.append(f"  result    {res.get('file_type')}, {res.get('size_bytes')} bytes, {res.get('bpw')} bpw, "
                 f"{len(res.get('tensor_types', {}))} tensors (table sha256 {str(res.get('tensor_types_sha256'))[:16]}...)")
    blocks: Sequence[int | None] = res.get("mtp_blocks") or [res.get("mtp_block")]  # older receipts name only the first
    lines.append(f"  MTP       {', '.join(f'blk.{b}' for b in blocks)} {res.get('mtp_status')}, "
                 f"nextn_predict_layers {res.get('nextn_predict_layers')}")
    tc = p.get("toolchain", {})
    q = tc.get("quantizer", {})
    lines.append(f"  toolchain ggufmtp {tc.get('ggufmtp')}, llama.cpp {q.get('llama_cpp_commit')} ({q.get('variant')}), "
                 f"llama-cpp-python {tc.get('llama_cpp_python')}, gguf {tc.get('gguf')}, python {tc.get('python')}")
    lines.append(f"            {tc.get('compiler')}; {tc.get('os')}; cpu {' '.join(tc.get('cpu_flags', []))}")
    lines.append(f"  time      {p.get('started_at')} -> {p.get('finished_at')}")
    v = p.get("verification")
    if v:
        m = v.get("mtp", {})
        lines.append(f"  verified  acceptance {m.get('acceptance')} CI95 {m.get('acceptance_ci95')}, "
                     f"speedup {v.get('speedup')} CI95 {v.get('speedup_ci95')}, verdict {v.get('verdict')}")
    else:
        lines.append("  verified  not yet")
    if signed is not None:
        lines.append("  signature " + ("DSSE envelope (check it: ggufmtp audit ARTIFACT --public-key PUB.pem)"
                                       if signed else UNSIGNED_NOTE))
    return "\n".join(lines)
