"""The numerics rule: when a differing MTP reply is explained by numerics rather than a real
divergence (see :mod:`ggufmtp.provenance.verdict`'s docstring for the policy and
:mod:`ggufmtp.measure.verify.divergence` for the measurement). Everything is re-derived from the
recorded figures; these bounds are policy, not thresholds: a receipt cannot loosen them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EXCERPT_BEFORE", "MAX_DRIFT_NATS", "MAX_EXPLAINED_SHARE", "MIN_DRIFT_POSITIONS", "TOKEN_ID_FIELDS",
           "Divergence", "RecordedMismatch", "explained_by_numerics", "numerics_failure", "nats",
           "unmeasured_mismatches"]


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def nats(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g} nats"


# The numerics analysis' bounds (see verdict's docstring).
MAX_DRIFT_NATS = 1.0  # the learned head's runs measured 0.56-0.68 nats; a real divergence 17-19
MIN_DRIFT_POSITIONS = 8  # a drift measured on fewer positions is no calibration
MAX_EXPLAINED_SHARE = 0.5  # past half the replies, "numerics" is the model, not a rounding
EXCERPT_BEFORE = 30  # the mismatch excerpts start this many characters before the difference


TOKEN_ID_FIELDS = ("vanilla_token_id", "mtp_token_id", "runner_up_token_id", "batched_token_id")


@dataclass(frozen=True)
class Divergence:
    """What the numerics rule reads of one differing reply: vanilla's top-2 margin where the
    replies part (the first token whose id differs), the tokens there by id as the servers generated
    them (vanilla's, the MTP reply's, vanilla's runner-up and vanilla's one-batch argmax) with their
    texts ("" for vanilla's end-of-generation token), and the replies' text around the first
    differing character (``vanilla``/``mtp``: from :data:`EXCERPT_BEFORE` characters before it)."""

    first_difference_at: int | None
    vanilla: str | None
    mtp: str | None
    margin_nats: float | None = None
    vanilla_token: str | None = None
    mtp_token: str | None = None
    runner_up_token: str | None = None
    batched_token: str | None = None
    vanilla_token_id: int | None = None
    mtp_token_id: int | None = None
    runner_up_token_id: int | None = None
    batched_token_id: int | None = None


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
        return cls(_int(d.get("first_difference_at")), _text(d.get("vanilla")), _text(d.get("mtp")),
                   _number(d.get("margin_nats")), vanilla_token=_text(d.get("vanilla_token")),
                   mtp_token=_text(d.get("mtp_token")), runner_up_token=_text(d.get("runner_up_token")),
                   batched_token=_text(d.get("batched_token")), vanilla_token_id=_int(d.get("vanilla_token_id")),
                   mtp_token_id=_int(d.get("mtp_token_id")), runner_up_token_id=_int(d.get("runner_up_token_id")),
                   batched_token_id=_int(d.get("batched_token_id")), prompt_id=_text(d.get("prompt_id")),
                   seed=_int(d.get("seed")), mode=_text(d.get("mode")), endpoint=_text(d.get("endpoint")),
                   k=_int(d.get("k")),
                   batched_flip=d.get("batched_flip") if isinstance(d.get("batched_flip"), bool) else None)


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _text(x: Any) -> str | None:
    return x if isinstance(x, str) else None


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
    return _token_failure(d)


def _token_failure(d: Divergence) -> str | None:
    """Why the recorded tokens do not show a runner-up or a batched argmax taken (None: they do).
    Judged on token ids, never on text: a runner-up whose text merely begins the MTP token's text
    (" t" against " tree") is another token. A record without the ids (older receipts recorded
    text only) cannot show it; one whose texts differ for one id is not what verify writes."""
    if d.vanilla_token_id is None or d.mtp_token_id is None:
        return "no token ids recorded at the divergence (a text-only record cannot show which token the MTP reply took)"
    if d.mtp_token_id == d.vanilla_token_id:
        return f"the recorded MTP token (id {d.mtp_token_id}) is vanilla's own"
    if d.mtp_token_id not in (d.runner_up_token_id, d.batched_token_id):
        return (f"the MTP reply's token there (id {d.mtp_token_id}, {d.mtp_token!r}) is neither vanilla's runner-up "
                f"(id {d.runner_up_token_id}, {d.runner_up_token!r}) nor vanilla's one-batch argmax "
                f"(id {d.batched_token_id}, {d.batched_token!r})")
    texts: dict[int, set[str]] = {}
    for tid, text in ((d.vanilla_token_id, d.vanilla_token), (d.mtp_token_id, d.mtp_token),
                      (d.runner_up_token_id, d.runner_up_token), (d.batched_token_id, d.batched_token)):
        if tid is not None and text is not None:
            texts.setdefault(tid, set()).add(text)
    if any(len(t) > 1 for t in texts.values()):
        return "the recorded tokens' texts disagree with their ids"
    return None


def explained_by_numerics(d: Divergence, drift_nats: float | None, positions: int) -> bool:
    """Whether a differing reply is explained by numerics (:func:`numerics_failure` finds nothing)."""
    return numerics_failure(d, drift_nats, positions) is None


ENDPOINT_NAMES = {"/v1/chat/completions": "chat", "/completion": "raw"}  # settings' endpoints, as mismatches name them


def unmeasured_mismatches(listed: Sequence[RecordedMismatch], settings: Any) -> dict[RecordedMismatch, str]:
    """The listed mismatches that are not the run's, each with why: a seed, prompt, mode, endpoint
    or draft window the ``settings`` do not record as measured. A mismatch with token ids (what
    verify writes with them also records ``seeds`` and ``prompt_ids``) needs both lists to be
    checked; an older receipt's text-only mismatch, which explains nothing, is checked against what
    its settings record."""
    st = settings if isinstance(settings, Mapping) else {}
    k_max, sweep = st.get("draft_n_max"), st.get("sweep")
    windows = ([k_max] if isinstance(k_max, int) else []) + (list(sweep) if isinstance(sweep, list) else [])
    out: dict[RecordedMismatch, str] = {}
    for m in listed:
        for name, key, x in (("seed", "seeds", m.seed), ("prompt", "prompt_ids", m.prompt_id), ("mode", "modes", m.mode),
                             ("endpoint", "endpoints", m.endpoint), ("window k", "windows", m.k)):
            measured = windows or None if key == "windows" else st.get(key)
            if key == "endpoints" and isinstance(measured, list):  # the settings name the server's paths
                measured = [ENDPOINT_NAMES.get(e, e) for e in measured]
            if isinstance(measured, list) and x not in measured:
                shown = ", ".join(repr(y) for y in measured[:8]) + (", ..." if len(measured) > 8 else "")
                out[m] = f"its {name} {x!r} is not among the run's ({shown})"
                break
            if measured is None and key in ("seeds", "prompt_ids") and m.mtp_token_id is not None:
                out[m] = f"it records token ids, but the settings do not record the run's {key}"
                break
    return out
