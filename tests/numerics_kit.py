"""A designed near-tie for the numerics analysis (:mod:`ggufmtp.measure.verify.divergence`), on any
machine: whether batching flips vanilla's argmax is a CPU's rounding and cannot be designed with
the real server, so the test designs the two things the analysis reads instead.

- The MTP reply: vanilla's (a synthetic model's, identical in both arms by construction) with one
  letter changed (:func:`designed_mtp_text`), fed to verify or tune where their runs record it, and
  the MTP server's replay of it (:class:`NearTieMtp`): the real server's answer, its text the
  designed one and its token there the designed runner-up (:func:`designed_token_id`).
- The vanilla server's answers (:class:`NearTieVanilla`): every request goes to the real vanilla
  llama-server, and two answers are rewritten: vanilla's listing at the divergence (its token wins
  by :data:`NEAR_TIE` nats over the designed runner-up, whose text is the MTP reply's there) and
  vanilla's one-batch evaluation of that prefix (the runner-up wins by :data:`BATCHED_MARGIN`), so
  the drift measured there is their sum. The other sampled positions are the real server's (margins of ~16
  nats on the synthetic trunk; what batching moves them by only adds to the drift, whose maximum is
  at least that sum on any machine).

The protocol the stand-in imitates (the listed token first in its ``top_logprobs``, a one-token
evaluation of a prefix listing one entry) is pinned on the real server in tests/test_verify_numerics.py.
"""

from __future__ import annotations

import itertools
from typing import Any

NEAR_TIE = 0.01  # vanilla's designed top-2 margin at the divergence (nats)
# the runner-up's designed lead in vanilla's one-batch evaluation of that prefix: the drift there is
# NEAR_TIE + BATCHED_MARGIN (a flip), while |NEAR_TIE - BATCHED_MARGIN| (the change without the flip
# counted) would be below NEAR_TIE: an analysis that missed the flip explains nothing
BATCHED_MARGIN = 0.015
TOP_LOGPROB = -0.69  # vanilla's token's designed log-probability there (about one half)


def designed_token_id(vanilla_id: int) -> int:
    """The designed runner-up's token id where vanilla's token there is ``vanilla_id`` (another id)."""
    return vanilla_id + 1


def _token_at(probs: list[dict[str, Any]], at: int) -> tuple[int, int]:
    """(index, start character) of the listed token over character ``at`` of the listing's text."""
    ends = list(itertools.accumulate(len(str(e["token"])) for e in probs))
    j = next((t for t, end in enumerate(ends) if end > at), None)
    assert j is not None, f"the designed divergence (character {at}) lies past the reply"
    return j, ends[j] - len(str(probs[j]["token"]))


class NearTieMtp:
    """The MTP llama-server ``srv`` as the replay of a designed MTP reply reads it: the real answer
    (the synthetic model's reply, vanilla's), its text the designed ``mtp`` and its token over the
    changed letter the designed runner-up's id (see the module docstring)."""

    def __init__(self, srv: Any, vanilla: str, mtp: str):
        self.srv, self.mtp = srv, mtp
        self.at = next(i for i, (a, b) in enumerate(zip(vanilla, mtp)) if a != b)
        self.replays = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.srv, name)

    def complete(self, ids: list[int], n_predict: int, **kw: Any) -> dict[str, Any]:
        assert kw.get("return_tokens"), "the replay asks the server for its token ids"
        r = self.srv.complete(ids, n_predict=n_predict, **kw, n_probs=1)  # the listing: where each token lies
        j, _ = _token_at(list(r["completion_probabilities"]), self.at)
        content = str(r["content"])
        assert content.startswith(self.mtp[:self.at]), ("the designed case needs the chat reply to be the generated text",
                                                        content, self.mtp)
        tokens = list(r["tokens"])
        tokens[j] = designed_token_id(tokens[j])
        self.replays += 1
        return {**r, "tokens": tokens, "content": content[:self.at] + self.mtp[self.at] + content[self.at + 1:]}


def designed_mtp_text(vanilla: str, at: int = 10) -> str:
    """The designed MTP reply: ``vanilla`` with its first letter at or after character ``at`` changed."""
    c = next(i for i in range(at, len(vanilla)) if vanilla[i].isalpha())
    return vanilla[:c] + ("Q" if vanilla[c] != "Q" else "Z") + vanilla[c + 1:]


class NearTieVanilla:
    """The vanilla llama-server ``srv`` as the numerics analysis reads it, with a designed near-tie
    where the MTP reply ``mtp`` first departs from vanilla's reply ``vanilla`` (see the module docstring)."""

    def __init__(self, srv: Any, vanilla: str, mtp: str):
        self.srv, self.vanilla, self.mtp = srv, vanilla, mtp
        self.at = next(i for i, (a, b) in enumerate(zip(vanilla, mtp)) if a != b)
        self.prompt_n: int | None = None
        self.j: int | None = None  # the divergence's token index
        self.tokens: tuple[dict[str, Any], dict[str, Any]] | None = None  # (vanilla's, the runner-up), as listed
        self.requests = {"sequential": 0, "batched": 0, "designed_batched": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.srv, name)

    def post_json(self, path: str, body: dict) -> Any:
        return self.srv.post_json(path, body)

    def tokenize(self, text: str, **kw: Any) -> list[int]:
        return self.srv.tokenize(text, **kw)

    def complete(self, ids: list[int], n_predict: int, **kw: Any) -> dict[str, Any]:
        r = self.srv.complete(ids, n_predict=n_predict, **kw)
        probs = list(r["completion_probabilities"])
        if n_predict > 1:  # vanilla's reply, reproduced
            self.requests["sequential"] += 1
            return {**r, "completion_probabilities": self._sequential(len(ids), probs)}
        self.requests["batched"] += 1
        if self.prompt_n is not None and len(ids) - self.prompt_n == self.j:
            self.requests["designed_batched"] += 1
            return {**r, "completion_probabilities": [self._batched(probs[0])]}
        return r

    def _sequential(self, prompt_n: int, probs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The real listing, vanilla's token at the divergence nearly tied with the MTP reply's."""
        raw = "".join(str(e["token"]) for e in probs)
        assert raw.startswith(self.vanilla), ("the designed case needs the chat reply to be the generated text",
                                              raw, self.vanilla)
        j, start = _token_at(probs, self.at)
        e = probs[j]
        top = e["top_logprobs"]
        runner_up = self.mtp[start:start + len(str(e["token"]))]  # the MTP reply's text over vanilla's token there
        mine = dict(top[0], logprob=TOP_LOGPROB)
        other = dict(top[1], id=designed_token_id(int(e["id"])), token=runner_up, bytes=list(runner_up.encode()),
                     logprob=TOP_LOGPROB - NEAR_TIE)
        self.prompt_n, self.j, self.tokens = prompt_n, j, (mine, other)
        probs[j] = dict(e, logprob=TOP_LOGPROB, top_logprobs=[mine, other])
        return probs

    def _batched(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Vanilla's one-batch evaluation of the prefix before the divergence: the runner-up wins."""
        assert self.tokens is not None
        mine, other = self.tokens
        lead = dict(other, logprob=TOP_LOGPROB + BATCHED_MARGIN / 2)
        return dict(entry, id=other["id"], token=other["token"], bytes=other["bytes"], logprob=lead["logprob"],
                    top_logprobs=[lead, dict(mine, logprob=TOP_LOGPROB - BATCHED_MARGIN / 2)])
