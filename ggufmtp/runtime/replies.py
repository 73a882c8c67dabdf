"""What llama-server answers, as typed records: a reply's timings and text (:class:`Reply`) and the
speculative-decoding counters of ``/metrics`` (:class:`SpecCounters`).

Both are parsed from the JSON / Prometheus text that :class:`ggufmtp.runtime.server.LlamaServer`
returns; the measurement code (verify, tune, profiles) works on these records, never on raw dicts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ServerError

__all__ = ["Reply", "SpecCounters", "parse_prometheus", "require_drafting", "reply_text"]

DRAFTS_TOTAL = "llamacpp:spec_decode_num_drafts_total"
DRAFT_TOKENS_TOTAL = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED_TOTAL = "llamacpp:spec_decode_num_accepted_tokens_total"
PER_POS_RE = re.compile(r'^llamacpp:spec_decode_num_accepted_tokens_per_pos_total\{position="(\d+)"\}$')


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{"name" or "name{labels}": value}``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][\w:]*(?:\{[^}]*\})?)\s+(\S+)", line)
        if not m:
            continue
        try:
            out[m.group(1)] = float(m.group(2))
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class SpecCounters:
    """llama-server's cumulative speculative-decoding counters (``/metrics``), or the difference of
    two readings (:meth:`since`): drafted tokens, accepted tokens, draft rounds (verification
    steps) and accepted tokens per draft position. ``available`` is False when the server exports
    no speculative counters (a vanilla server)."""

    draft_tokens: int = 0
    accepted: int = 0
    n_drafts: int = 0
    per_position: tuple[int, ...] = ()
    available: bool = False

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float]) -> SpecCounters:
        """The counters of a parsed ``/metrics`` answer (:func:`parse_prometheus`)."""
        pos: dict[int, int] = {}
        for key, v in metrics.items():
            m = PER_POS_RE.match(key)
            if m:
                pos[int(m.group(1))] = int(v)
        return cls(draft_tokens=int(metrics.get(DRAFT_TOKENS_TOTAL, 0)),
                   accepted=int(metrics.get(ACCEPTED_TOTAL, 0)),
                   n_drafts=int(metrics.get(DRAFTS_TOTAL, 0)),
                   per_position=tuple(pos[i] for i in sorted(pos)),
                   available=DRAFTS_TOTAL in metrics)

    def since(self, earlier: SpecCounters) -> SpecCounters:
        """What was counted between ``earlier`` and this reading (per-position lists padded to the
        longer one)."""
        n = max(len(self.per_position), len(earlier.per_position))
        now = list(self.per_position) + [0] * (n - len(self.per_position))
        before = list(earlier.per_position) + [0] * (n - len(earlier.per_position))
        return SpecCounters(draft_tokens=self.draft_tokens - earlier.draft_tokens,
                            accepted=self.accepted - earlier.accepted,
                            n_drafts=self.n_drafts - earlier.n_drafts,
                            per_position=tuple(y - x for x, y in zip(before, now)),
                            available=self.available)

    def matches(self, draft_n: int | None, draft_n_accepted: int | None) -> bool:
        """Whether these counts agree with a reply's own ``timings.draft_n``/``draft_n_accepted``."""
        return (self.draft_tokens, self.accepted) == ((draft_n or 0), (draft_n_accepted or 0))

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens emitted per verification step (1 + accepted per draft round); None without drafts."""
        return 1 + self.accepted / self.n_drafts if self.n_drafts else None

    @property
    def acceptance_by_position(self) -> list[float] | None:
        """Accepted tokens per draft round at each draft position; None without drafts."""
        return [c / self.n_drafts for c in self.per_position] if self.n_drafts else None


def reply_text(resp: Mapping[str, Any], endpoint: str = "chat") -> tuple[str, str | None]:
    """(text, finish reason) of a reply: ``/completion``'s ``content`` (endpoint "raw"), or the chat
    message with its reasoning wrapped in ``<think>...</think>`` before the answer."""
    if endpoint == "raw":
        return str(resp.get("content", "")), resp.get("stop_type")
    ch = (resp.get("choices") or [{}])[0]
    msg = ch.get("message") or {}
    text = msg.get("content") or ""
    if msg.get("reasoning_content"):
        text = f"<think>{msg['reasoning_content']}</think>{text}"
    return text, ch.get("finish_reason")


@dataclass(frozen=True)
class Reply:
    """One non-streaming reply: decode timings (``timings``), draft counts and the text."""

    predicted_n: int
    predicted_ms: float
    prompt_n: int | None
    draft_n: int | None
    draft_n_accepted: int | None
    text: str
    finish_reason: str | None = None

    @classmethod
    def parse(cls, resp: Mapping[str, Any], endpoint: str = "chat") -> Reply:
        """The reply of a ``/v1/chat/completions`` (endpoint "chat") or ``/completion`` ("raw")
        answer; ServerError when it has no ``timings.predicted_n``/``predicted_ms``."""
        t = resp.get("timings")
        if not isinstance(t, dict) or "predicted_n" not in t or "predicted_ms" not in t:
            raise ServerError(f"llama-server's answer has no timings.predicted_n/predicted_ms: {str(resp)[:300]}")
        text, finish = reply_text(resp, endpoint)
        return cls(predicted_n=int(t["predicted_n"]), predicted_ms=float(t["predicted_ms"]),
                   prompt_n=t.get("prompt_n"), draft_n=t.get("draft_n"), draft_n_accepted=t.get("draft_n_accepted"),
                   text=text, finish_reason=finish)

    @property
    def drafted(self) -> bool:
        """Whether speculation ran on this reply (``timings.draft_n`` present and non-zero)."""
        return bool(self.draft_n)


def require_drafting(resp: Mapping[str, Any]) -> tuple[int, int]:
    """(draft_n, draft_n_accepted) from a response's ``timings``; ServerError if it did not draft."""
    t = resp.get("timings") or {}
    if "draft_n" not in t:
        raise ServerError("the response has no timings.draft_n: speculative decoding did not run")
    return int(t["draft_n"]), int(t.get("draft_n_accepted", 0))
