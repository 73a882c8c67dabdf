"""Why an MTP reply differs from vanilla's: a numerics divergence or a real one.

At temperature 0 speculative decoding is lossless only up to numerics: the MTP arm's target model
evaluates the k+1 tokens of a verification step as ONE batch, the vanilla arm one token at a time,
and on some models (Gated DeltaNet linear attention: its chunked and its recurrent algorithm;
quantized activations) the two evaluations of the same position give logits that differ by up to a
few tenths of a nat. Wherever vanilla's top-2 margin is smaller than that, greedy decoding can pick
the other token, and vanilla ITSELF does so when the same prefix is evaluated as one batch.

:func:`analyse_mismatches` tells the two apart on the VANILLA server, before the servers stop, with
evidence bound to the run:

- each differing MTP reply is replayed on the MTP server while it is still up
  (:func:`replay_mtp`): ``/completion`` on the templated prompt (``/apply-template`` with the same
  messages and ``chat_template_kwargs``; the raw prompt for ``--raw``) with ``return_tokens``, so
  the server itself says which token ids it generated (the end-of-generation token included);
- vanilla's reply is reproduced the same way on the vanilla server, with ``n_probs: 2`` (each
  token's id and its top-2 by id); both replies must reproduce their recorded text (else the
  mismatch is *unreproducible*: unexplained). The divergence is the first token whose ID differs
  (where vanilla's reply ends and the MTP reply goes on: vanilla's end-of-generation token, which
  ``completion_probabilities`` lists with the text ""), and vanilla's top-2 margin there (nats) is
  recorded (:class:`MismatchAnalysis`). Text is never compared to decide a token: a runner-up
  whose text begins the MTP token's text (" t" against " tree") is another token;
- the drift batching alone causes is calibrated on the same run (:class:`NumericsDrift`): at a
  seeded sample of positions of each analysed reply (up to :data:`POSITIONS_PER_REPLY`, always
  including the divergence), the prefix is evaluated as one batch (prompt ids + the reply's first j
  tokens, ``n_predict`` 1, ``n_probs`` 2) and ``|margin_sequential - margin_batched|`` taken (the sum
  of the two margins where the argmax flips); the drift is the maximum.

The tokens at the divergence are recorded by id, with their texts: vanilla's (top-1), its
runner-up, vanilla's own one-batch argmax there, and the MTP reply's. A mismatch is explained by
numerics when vanilla's margin at the divergence is at most the drift and the MTP token's id is the
runner-up's or the batched argmax's, within the bounds of :func:`ggufmtp.provenance.verdict.numerics_failure` (a batched flip at
the divergence is covered: the divergence is always sampled, and a flip there makes the drift at
least the margin).
Nothing runs without mismatches; requests are capped (:data:`MAX_REPLIES`, :data:`MAX_BATCHED`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ...errors import ServerError
from ...provenance.numerics import TOKEN_ID_FIELDS, Divergence, numerics_failure
from ...runtime.server import LlamaServer
from ..core.arms import MTP, VANILLA
from ..core.records import first_difference
from ..core.suite import Prompt, Suite, mode_request_fields
from .summary import MAX_LISTED_MISMATCHES, Comparison, Record

__all__ = ["MAX_BATCHED", "MAX_REPLIES", "POSITIONS_PER_REPLY", "MismatchAnalysis", "NumericsDrift", "Numerics",
           "TokenReply", "analyse_mismatches", "annotate", "mismatched_pairs", "replay_mtp"]

POSITIONS_PER_REPLY = 16  # batched evaluations per analysed reply (the divergence among them)
MAX_REPLIES = 64  # distinct vanilla replies analysed per run
MAX_BATCHED = 640  # batched evaluations per run

Key = tuple[int, str, str, str, int]  # (k, endpoint, mode, prompt_id, seed)


class TopLogprob(TypedDict, total=False):
    """One alternative of a ``completion_probabilities`` entry (llama-server's ``n_probs``)."""

    id: int
    token: str
    logprob: float


class ProbEntry(TopLogprob, total=False):
    """One generated token of llama-server's ``completion_probabilities``, with its top alternatives."""

    top_logprobs: list[TopLogprob]

TOKEN_FIELDS = ("vanilla_token", "mtp_token", "runner_up_token", "batched_token", *TOKEN_ID_FIELDS)


@dataclass(frozen=True)
class TokenReply:
    """A reply as the server generated it: its token ids (llama-server's ``return_tokens``, the
    end-of-generation token included) and its text (``content``)."""

    ids: tuple[int, ...]
    text: str


def _key(r: Record) -> Key:
    return (r.k, r.endpoint, r.mode, r.prompt_id, r.seed)


@dataclass(frozen=True)
class MismatchAnalysis:
    """One mismatch seen from the vanilla server: whether its reply reproduced through
    ``/completion``, the token index of the divergence, vanilla's top-2 margin there (nats) and
    whether vanilla's own one-batch evaluation of that prefix picks another token."""

    reproduced: bool
    token_index: int | None = None
    margin_nats: float | None = None
    batched_flip: bool | None = None
    why: str | None = None  # why it is unexplained before any margin (unreproducible, ...)
    divergence: Divergence | None = None  # the margin, the tokens and the texts the rule reads


@dataclass(frozen=True)
class NumericsDrift:
    """The largest change of vanilla's top-2 margin between the sequential and the one-batch
    evaluation of the same position, over ``positions`` sampled positions (``flips`` of them changed
    the argmax). ``drift_nats`` is None when nothing could be measured."""

    drift_nats: float | None
    positions: int
    flips: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"numerics_drift_nats": self.drift_nats, "numerics_positions": self.positions,
                "numerics_flips": self.flips}


@dataclass(frozen=True)
class Numerics:
    """What :func:`analyse_mismatches` found: each analysed mismatch by its key, and the drift."""

    by_key: dict[Key, MismatchAnalysis]
    drift: NumericsDrift

    def fields(self, key: Key) -> dict[str, Any]:
        """The fields a mismatch gains (``margin_nats``, ``batched_flip``, ``explained``)."""
        a = self.by_key.get(key)
        if a is None:
            return {"explained": False}
        d = a.divergence
        why = (numerics_failure(d, self.drift.drift_nats, self.drift.positions) if d is not None
               else a.why or "not analysed")
        tokens = {x: getattr(d, x) for x in TOKEN_FIELDS} if d is not None else {}
        return {"margin_nats": a.margin_nats, "batched_flip": a.batched_flip, "token_index": a.token_index,
                **tokens, "explained": why is None, "unexplained_why": why}


def mismatched_pairs(records: Sequence[Record], ks: Sequence[int], endpoints: Sequence[str],
                     modes: Sequence[str]) -> list[tuple[Record, Record]]:
    """The (vanilla, MTP) pairs whose replies differ, in the order the result lists its mismatches
    (comparison by comparison: k, endpoint, mode), at most :data:`MAX_LISTED_MISMATCHES` each and in
    all: exactly the mismatches the JSON and the receipt list, so a recorded verdict can re-judge them."""
    out: list[tuple[Record, Record]] = []
    for k in ks:
        for endpoint in endpoints:
            for mode in modes:
                sub = [r for r in records if (r.k, r.endpoint, r.mode) == (k, endpoint, mode)]
                van = {(r.prompt_id, r.seed): r for r in sub if r.arm == VANILLA}
                pairs = [(van[(r.prompt_id, r.seed)], r) for r in sub
                         if r.arm == MTP and (r.prompt_id, r.seed) in van and van[(r.prompt_id, r.seed)].text != r.text]
                out += pairs[:MAX_LISTED_MISMATCHES]
    return out[:MAX_LISTED_MISMATCHES]


def _align(parsed: str, raw: str) -> list[int] | None:
    """For each character of ``parsed`` (a reply as verify records it: the chat message, reasoning
    wrapped in ``<think>...</think>``) its index in ``raw`` (the generated text), whitespace the
    chat parser trimmed skipped; None when ``parsed`` is not ``raw`` up to such whitespace."""
    out, b = [], 0
    for ch in parsed:
        while b < len(raw) and raw[b] != ch and raw[b].isspace():
            b += 1
        if b < len(raw) and raw[b] == ch:
            out.append(b)
            b += 1
        elif not ch.isspace():
            return None
        else:
            out.append(b)
    return out if raw[b:].strip() == "" else None


Token = tuple[int | None, str | None]  # (id, text) of one listed token


def _top2(entry: ProbEntry) -> tuple[Token, Token]:
    """((id, text) of the top token, (id, text) of the runner-up) of one ``completion_probabilities`` entry."""
    top = list(entry.get("top_logprobs") or []) + [{}, {}]
    a, b = ((t.get("id"), str(t["token"]) if "token" in t else None) for t in top[:2])
    return a, b


def _margin(entry: ProbEntry) -> tuple[int | None, float | None]:
    """(top token id, top-2 margin in nats) of one ``completion_probabilities`` entry."""
    top = entry.get("top_logprobs") or []
    if len(top) < 2:
        return (top[0].get("id") if top else None), None
    return top[0].get("id"), float(top[0]["logprob"]) - float(top[1]["logprob"])


class _Analyser:
    """The requests of one analysis on the vanilla server, with their caps."""

    def __init__(self, srv: LlamaServer, suite: Suite, max_tokens: int):
        self.srv, self.max_tokens = srv, max_tokens
        self.prompts = {p.id: p for p in suite.prompts}
        self.replies: dict[tuple[str, str, str], tuple[list[int], list[ProbEntry], str] | None] = {}
        self.batched = 0
        self.drifts: list[float] = []
        self.flips = 0
        self.sampled: set[tuple[str, str, str, int]] = set()

    def sequential(self, v: Record) -> tuple[list[int], list[ProbEntry], str] | None:
        """(prompt ids, per-token probabilities, generated text) of vanilla's reply, once per reply."""
        key = (v.prompt_id, v.mode, v.endpoint)
        if key not in self.replies:
            if len(self.replies) >= MAX_REPLIES:
                return None
            ids = prompt_ids(self.srv, self.prompts[v.prompt_id], v.mode, v.endpoint)
            r = self.srv.complete(ids, n_predict=self.max_tokens, temperature=0.0, seed=v.seed, cache_prompt=False,
                                  n_probs=2)
            probs = list(r.get("completion_probabilities") or [])
            self.replies[key] = (ids, probs, "".join(str(e.get("token", "")) for e in probs))
        return self.replies[key]

    def batched_entry(self, ids: list[int], probs: list[ProbEntry], j: int) -> ProbEntry:
        """Vanilla's one-batch evaluation of the prefix before token ``j`` ({} when it lists nothing)."""
        self.batched += 1
        r = self.srv.complete(ids + [int(e["id"]) for e in probs[:j]], n_predict=1, temperature=0.0,
                              cache_prompt=False, n_probs=2)
        entries = r.get("completion_probabilities") or []
        return entries[0] if entries else {}

    def drift_at(self, key: tuple[str, str, str], ids: list[int], probs: list[ProbEntry],
                 j: int) -> tuple[bool, Token] | None:
        """Measure position ``j`` once (cached per reply): whether the batched argmax flips there, and
        the batched argmax (id, text)."""
        if (*key, j) in self.sampled or self.batched >= MAX_BATCHED:
            return None
        self.sampled.add((*key, j))
        s_id, s_margin = _margin(probs[j])
        entry = self.batched_entry(ids, probs, j)
        b_id, b_margin = _margin(entry) if entry else (None, None)
        if s_margin is None or b_margin is None:
            return None
        flip = b_id != s_id
        self.flips += flip
        self.drifts.append(s_margin + b_margin if flip else abs(s_margin - b_margin))
        return flip, _top2(entry)[0]

    def one(self, v: Record, m: Record, mtp: TokenReply | str | None) -> MismatchAnalysis:
        if not isinstance(mtp, TokenReply):
            return MismatchAnalysis(False, why=mtp or "the MTP reply's token ids were not replayed")
        if _align(m.text, mtp.text) is None:
            return MismatchAnalysis(False, why="the MTP reply did not reproduce through /completion")
        rep = self.sequential(v)
        if rep is None:
            return MismatchAnalysis(False, why=f"not analysed (more than {MAX_REPLIES} distinct replies)")
        ids, probs, raw = rep
        if _align(v.text, raw) is None or not probs:
            return MismatchAnalysis(False, why="vanilla's reply did not reproduce through /completion")
        v_ids = [int(e["id"]) for e in probs]
        j = next((t for t, (a, b) in enumerate(zip(v_ids, mtp.ids)) if a != b), None)
        if j is None:  # one reply's ids begin the other's: it stopped without a token of its own there
            return MismatchAnalysis(True, why="vanilla's reply ends where the MTP reply goes on" if len(v_ids) < len(mtp.ids)
                                    else "the MTP reply ends where vanilla's goes on" if len(v_ids) > len(mtp.ids)
                                    else "the replies' token ids do not differ")
        key = (v.prompt_id, v.mode, v.endpoint)
        at_j = self.drift_at(key, ids, probs, j)
        flip, batched = at_j if at_j is not None else (None, (None, None))
        rng = random.Random(f"{v.prompt_id}/{v.mode}/{v.endpoint}")
        others = [t for t in range(len(probs)) if t != j]
        for t in sorted(rng.sample(others, min(len(others), POSITIONS_PER_REPLY - 1))):
            self.drift_at(key, ids, probs, t)
        margin = _margin(probs[j])[1]
        return MismatchAnalysis(True, token_index=j, margin_nats=margin, batched_flip=flip,
                                divergence=self.divergence(v.text, m.text, margin, probs[j], batched, mtp.ids[j]))

    def divergence(self, vanilla: str, mtp: str, margin: float | None, entry: ProbEntry, batched: Token,
                   mtp_id: int) -> Divergence:
        """The divergence as the rule reads it: the replies' excerpts at the first differing
        character, vanilla's margin there and the four tokens by id (the MTP token's text is the
        listed one of the same id, else the server's detokenization of it)."""
        i, v_ex, m_ex = first_difference(vanilla, mtp)
        (_, top), (ru_id, runner_up) = _top2(entry)
        listed = {t: x for t, x in ((ru_id, runner_up), batched) if t is not None}
        mtp_text = listed[mtp_id] if mtp_id in listed else self.detokenize(mtp_id)
        return Divergence(i, v_ex, m_ex, margin, vanilla_token=str(entry.get("token", top or "")), mtp_token=mtp_text,
                          runner_up_token=runner_up, batched_token=batched[1],
                          vanilla_token_id=int(entry["id"]), mtp_token_id=mtp_id,
                          runner_up_token_id=ru_id, batched_token_id=batched[0])

    def detokenize(self, token_id: int) -> str | None:
        try:
            return str(self.srv.post_json("/detokenize", {"tokens": [token_id]})["content"])
        except (ServerError, KeyError, TypeError, ValueError):
            return None  # the text is for the reader; the rule reads the id


def prompt_ids(srv: LlamaServer, p: Prompt, mode: str, endpoint: str) -> list[int]:
    """The prompt a measured request sent, as ``srv`` tokenizes it (templated for "chat")."""
    if endpoint == "raw":
        text = p.raw_text()
    else:
        text = srv.post_json("/apply-template", {"messages": p.chat_messages(), **mode_request_fields(mode)})["prompt"]
    return srv.tokenize(text, add_special=True, parse_special=True)


def replay_mtp(srv: LlamaServer, suite: Suite, pairs: Sequence[tuple[Record, Record]],
               max_tokens: int) -> dict[Key, TokenReply | str]:
    """Each differing MTP reply of ``pairs`` generated again on the MTP server ``srv`` (the run's,
    before it stops) through ``/completion`` with ``return_tokens``: the token ids the server itself
    generated, by key (a failed request: why, as text). At most :data:`MAX_REPLIES` replies."""
    prompts = {p.id: p for p in suite.prompts}
    out: dict[Key, TokenReply | str] = {}
    for _, m in pairs[:MAX_REPLIES]:
        try:
            r = srv.complete(prompt_ids(srv, prompts[m.prompt_id], m.mode, m.endpoint), n_predict=max_tokens,
                             temperature=0.0, seed=m.seed, cache_prompt=False, return_tokens=True)
            out[_key(m)] = TokenReply(tuple(int(t) for t in r["tokens"]), str(r.get("content", "")))
        except (ServerError, KeyError, ValueError, TypeError) as e:
            out[_key(m)] = f"the MTP reply's replay failed: {e}"
    return out


def analyse_mismatches(srv: LlamaServer, suite: Suite, pairs: Sequence[tuple[Record, Record]],
                       max_tokens: int, mtp_replies: Mapping[Key, TokenReply | str]) -> Numerics | None:
    """Analyse each mismatching (vanilla, MTP) pair on the vanilla server ``srv`` against the MTP
    reply's token ids (``mtp_replies``: :func:`replay_mtp`'s; see the module docstring); None when
    there is no pair. A request that fails, or a reply without its ids, leaves its mismatch unexplained."""
    if not pairs:
        return None
    an = _Analyser(srv, suite, max_tokens)
    by_key: dict[Key, MismatchAnalysis] = {}
    for v, m in pairs:
        try:
            a = an.one(v, m, mtp_replies.get(_key(m)))
        except (ServerError, KeyError, ValueError, TypeError) as e:
            a = MismatchAnalysis(False, why=f"analysis failed: {e}")
        by_key[_key(m)] = a
    drift = NumericsDrift(max(an.drifts) if an.drifts else None, len(an.drifts), an.flips)
    return Numerics(by_key, drift)


def annotate(comparisons: Sequence[Comparison], numerics: Numerics | None) -> None:
    """Give each listed mismatch of ``comparisons`` its analysis (``margin_nats``, ``batched_flip``,
    ``token_index``, ``explained``); nothing without an analysis."""
    if numerics is None:
        return
    for c in comparisons:
        c.mismatches[:] = [dataclasses.replace(x, **numerics.fields((x.k, x.endpoint, x.mode, x.prompt_id, x.seed)))
                           for x in c.mismatches]
