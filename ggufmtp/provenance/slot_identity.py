"""Identity per request under several slots: the evidence ``verify --parallel N`` records and its re-judgment.

Upstream ggml-org/llama.cpp#28286 reports ``draft-mtp`` with ``--parallel`` > 1 mixing one request's
content into another's. A count of identical replies cannot see that when the mix-up leaves the
tally within ``min_identical``, and a recorded count alone cannot be re-judged. So each slot count's
row carries one record per request (:class:`ReplyRecord`), keyed by the request itself -- prompt id,
seed and the concurrent batch it was sent in -- with the sha256 of vanilla's and MTP's reply to THAT
request, the first character where they differ, and, when MTP's reply carries text of another request
of the same batch, which one (``text_of``).

The re-judgment (:func:`identity_failures`) derives everything from those records: the identical
count (a row whose recorded count is not its records' fails, and so does a row without records:
identity claimed, not shown); a reply whose hash is another concurrent request's vanilla hash
(a swap) or whose recorded ``text_of`` names one (a splice, found at measure time by
:func:`compare_batch`) fails whatever ``min_identical`` allows -- content of another request is never
numerics -- and the reason names both requests; other differing replies count against
``min_identical`` and are named with their first differing position.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..fmt import pct

__all__ = ["SPLICE_CHARS", "ReplyRecord", "compare_batch", "identity_failures", "request_label"]

# How many characters of MTP's reply, from where it leaves vanilla's, must occur in another
# concurrent request's vanilla reply (and not in the request's own) to call it that request's text:
# long enough that two prompts' ordinary replies do not share it by chance.
SPLICE_CHARS = 24
NAMED = 5  # differing requests a reason names before "and N more"


def request_label(prompt: Any, seed: Any) -> str:
    """How a reason names a request: ``p7/seed 42``."""
    return f"{prompt}/seed {seed}"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ReplyRecord:
    """One request of a slot count: its key, both arms' reply hashes, where they first differ
    (None: identical) and the request of the same batch whose text MTP's reply carries (None: none)."""

    prompt: str
    seed: int
    batch: int
    vanilla_sha256: str
    mtp_sha256: str
    first_difference: int | None
    text_of: str | None = None

    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "seed": self.seed, "batch": self.batch, "vanilla_sha256": self.vanilla_sha256,
                "mtp_sha256": self.mtp_sha256, "first_difference": self.first_difference, "text_of": self.text_of}


def _first_difference(a: str, b: str) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def compare_batch(batch: int, keys: Sequence[tuple[str, int]], vanilla: Sequence[str],
                  mtp: Sequence[str]) -> list[ReplyRecord]:
    """The records of one concurrent batch: ``keys`` (prompt id, seed) with each arm's reply text to
    that same request, in the same order."""
    out = []
    for i, ((prompt, seed), v, m) in enumerate(zip(keys, vanilla, mtp, strict=True)):
        at = _first_difference(v, m)
        source = None
        if at is not None:
            tail = m[at:at + SPLICE_CHARS]
            for j, other in enumerate(vanilla):
                spliced = len(tail) == SPLICE_CHARS and tail in other and tail not in v
                if j != i and other != v and (m == other or spliced):
                    source = request_label(*keys[j])
                    break
        out.append(ReplyRecord(prompt, seed, batch, _sha(v), _sha(m), at, source))
    return out


def _records(row: Mapping[str, Any]) -> list[ReplyRecord] | str:
    """The row's per-request records, or why they are not what verify writes."""
    raw = row.get("replies")
    if not isinstance(raw, list) or not raw:
        return "records no per-request evidence (identity is claimed, not shown)"
    out = []
    for d in raw:
        if not isinstance(d, Mapping) or not all(isinstance(d.get(k), str) for k in ("prompt", "vanilla_sha256", "mtp_sha256")) \
                or not all(isinstance(d.get(k), int) and not isinstance(d.get(k), bool) for k in ("seed", "batch")):
            return "has a per-request record that is not what verify writes"
        fd, src = d.get("first_difference"), d.get("text_of")
        if (fd is None) != (d["vanilla_sha256"] == d["mtp_sha256"]) or not (src is None or isinstance(src, str)):
            return f"has a record for {request_label(d['prompt'], d['seed'])} whose difference is not its hashes'"
        out.append(ReplyRecord(d["prompt"], d["seed"], d["batch"], d["vanilla_sha256"], d["mtp_sha256"], fd, src))
    if len({(r.prompt, r.seed) for r in out}) != len(out):
        return "records a request twice"
    return out


def _mixed(r: ReplyRecord, records: Sequence[ReplyRecord]) -> str | None:
    """The request of ``r``'s batch whose text MTP's reply to ``r`` carries: the recorded ``text_of``
    (checked to name a request of the batch by :func:`identity_failures`) or, re-derived from the
    hashes, the one whose vanilla reply MTP's reply to ``r`` is (a swap)."""
    if r.first_difference is None or r.text_of is not None:
        return r.text_of
    return next((request_label(o.prompt, o.seed) for o in records
                 if o.batch == r.batch and (o.prompt, o.seed) != (r.prompt, r.seed)
                 and o.vanilla_sha256 == r.mtp_sha256 != r.vanilla_sha256), None)


def identity_failures(row: Mapping[str, Any], min_identical: float) -> list[str]:
    """Why one slot count's replies fail identity per request (module docstring); none when they hold."""
    n, same, pairs = row.get("slots"), row.get("identical"), row.get("pairs")
    records = _records(row)
    if isinstance(records, str):
        return [f"the slots row at {n} slots {records}"]
    out = []
    labels = {request_label(r.prompt, r.seed): r.batch for r in records}
    for r in records:
        if r.text_of is not None and labels.get(r.text_of) != r.batch:
            out.append(f"the slots row at {n} slots says request {request_label(r.prompt, r.seed)} got text of "
                       f"{r.text_of!r}, which is not a request of its batch: not what verify writes")
    derived = sum(r.first_difference is None for r in records)
    if (same, pairs) != (derived, len(records)):
        out.append(f"the slots row at {n} slots records {same}/{pairs} identical, its {len(records)} per-request "
                   f"records show {derived}: not what verify writes")
    differing = [r for r in records if r.first_difference is not None]
    for r in differing:
        source = _mixed(r, records)
        if source is not None:
            out.append(f"at {n} slots, request {request_label(r.prompt, r.seed)} got text of another request "
                       f"({source}) from character {r.first_difference} (batch {r.batch}; upstream "
                       "ggml-org/llama.cpp#28286: draft-mtp mixing requests under -np > 1)")
    if derived / len(records) < min_identical:
        named = ", ".join(f"{request_label(r.prompt, r.seed)} from character {r.first_difference}"
                          for r in differing[:NAMED]) + (f" and {len(differing) - NAMED} more" if len(differing) > NAMED else "")
        out.append(f"identical output at {n} slots: {derived}/{len(records)} MTP replies equal vanilla's reply to the "
                   f"same request at {n} slots (required {pct(min_identical)}); differing: {named}")
    return out
