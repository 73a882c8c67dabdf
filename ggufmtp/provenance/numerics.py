"""The numerics rule: when a differing MTP reply is explained by numerics rather than a real
divergence (see :mod:`ggufmtp.provenance.verdict`'s docstring for the policy and
:mod:`ggufmtp.measure.verify.divergence` for the measurement). Everything is re-derived from the
recorded figures; these bounds are policy, not thresholds: a receipt cannot loosen them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EXCERPT_BEFORE", "MAX_DRIFT_NATS", "MAX_EXPLAINED_SHARE", "MIN_DRIFT_POSITIONS", "Divergence",
           "RecordedMismatch", "explained_by_numerics", "numerics_failure", "nats", "token_covers"]


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def nats(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g} nats"


# The numerics analysis' bounds (see verdict's docstring).
MAX_DRIFT_NATS = 1.0  # the learned head's runs measured 0.56-0.68 nats; a real divergence 17-19
MIN_DRIFT_POSITIONS = 8  # a drift measured on fewer positions is no calibration
MAX_EXPLAINED_SHARE = 0.5  # past half the replies, "numerics" is the model, not a rounding
EXCERPT_BEFORE = 30  # the mismatch excerpts start this many characters before the difference


@dataclass(frozen=True)
class Divergence:
    """What the numerics rule reads of one differing reply: vanilla's top-2 margin where the
    replies part, the tokens there (vanilla's, the MTP reply's, vanilla's runner-up and vanilla's
    one-batch argmax; token texts, "" for an end-of-generation token) and the replies' text around
    the difference (``vanilla``/``mtp``: from :data:`EXCERPT_BEFORE` characters before it)."""

    first_difference_at: int | None
    vanilla: str | None
    mtp: str | None
    margin_nats: float | None = None
    vanilla_token: str | None = None
    mtp_token: str | None = None
    runner_up_token: str | None = None
    batched_token: str | None = None


@dataclass(frozen=True)
class RecordedMismatch(Divergence):
    """One listed mismatch as a receipt records it (the fields the policy reads)."""

    prompt_id: str | None = None
    seed: int | None = None
    mode: str | None = None
    endpoint: str | None = None
    k: int | None = None
    batched_flip: bool | None = None

    @classmethod
    def of(cls, d: Any) -> RecordedMismatch:
        d = d if isinstance(d, Mapping) else {}
        seed, k, at = (d.get(x) if isinstance(d.get(x), int) and not isinstance(d.get(x), bool) else None
                       for x in ("seed", "k", "first_difference_at"))
        tokens = {x: _text(d.get(x)) for x in ("vanilla_token", "mtp_token", "runner_up_token", "batched_token")}
        return cls(at, _text(d.get("vanilla")), _text(d.get("mtp")), _number(d.get("margin_nats")), **tokens,
                   prompt_id=_text(d.get("prompt_id")), seed=seed, mode=_text(d.get("mode")),
                   endpoint=_text(d.get("endpoint")), k=k,
                   batched_flip=d.get("batched_flip") if isinstance(d.get("batched_flip"), bool) else None)


def _text(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def token_covers(text: str, at: int, token: str | None) -> bool:
    """Whether a token with this text lies in ``text`` over character ``at`` (the first difference):
    starting at or before it and reaching past it. The end-of-generation token ("") covers the end
    of the reply; whitespace the chat parser trimmed is tolerated at either end of the token."""
    if token is None or at < 0:
        return False
    if not token.strip() and not text[at:].strip():  # the reply ends there
        return True
    for tok in dict.fromkeys(t for t in (token, token.strip(), token.lstrip(), token.rstrip()) if t):
        if any(text.startswith(tok, q) for q in range(max(0, at - len(tok) + 1), at + 1)):
            return True
    return False


def numerics_failure(d: Divergence, drift_nats: float | None, positions: int) -> str | None:
    """Why this differing reply is NOT explained by numerics (None: it is): see the module docstring.
    Everything is read from ``d`` and the run's drift, never from a recorded ``explained`` flag."""
    margin, drift = d.margin_nats, drift_nats
    if margin is None or not math.isfinite(margin) or margin < 0:
        return "no margin measured at the divergence"
    if drift is None or not math.isfinite(drift) or positions < MIN_DRIFT_POSITIONS:
        return (f"the batching drift was measured on {positions} position(s), fewer than the "
                f"{MIN_DRIFT_POSITIONS} a calibration needs")
    if not drift <= MAX_DRIFT_NATS:
        return (f"the batching drift {nats(drift)} exceeds the {nats(MAX_DRIFT_NATS)} ceiling: a batching that "
                "moves margins that much is not numerics")
    if not margin <= drift:
        return f"vanilla's margin there {nats(margin)} exceeds the batching drift {nats(drift)}"
    if d.mtp_token is None or d.mtp_token not in (d.runner_up_token, d.batched_token):
        return (f"the MTP reply's token there ({d.mtp_token!r}) is neither vanilla's runner-up ({d.runner_up_token!r}) "
                f"nor vanilla's one-batch argmax ({d.batched_token!r})")
    at = min(d.first_difference_at, EXCERPT_BEFORE) if d.first_difference_at is not None else -1
    if (d.vanilla_token == d.mtp_token or d.vanilla is None or d.mtp is None
            or not token_covers(d.vanilla, at, d.vanilla_token) or not token_covers(d.mtp, at, d.mtp_token)):
        return "the recorded tokens are not the replies' text at the first difference"
    return None


def explained_by_numerics(d: Divergence, drift_nats: float | None, positions: int) -> bool:
    """Whether a differing reply is explained by numerics (:func:`numerics_failure` finds nothing)."""
    return numerics_failure(d, drift_nats, positions) is None


