"""How much a verification measured, against the minimum a published verdict needs
(:class:`Evidence`; :mod:`ggufmtp.provenance.verdict` judges with it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..jsontypes import JsonObject

__all__ = ["Evidence", "int_or_zero"]


@dataclass(frozen=True)
class Evidence:
    """How much a verification measured, against the minimum a published verdict needs: at least
    :attr:`MIN_PROMPTS` distinct prompts, each reply up to at least :attr:`MIN_MAX_TOKENS` tokens.
    (Seeds are recorded, not counted: at temperature 0 they do not change the greedy text.)"""

    prompts: int
    seeds: int
    max_tokens: int

    MIN_PROMPTS = 8
    MIN_MAX_TOKENS = 64

    @classmethod
    def of_settings(cls, settings: Mapping[str, Any] | None) -> Evidence:
        """The evidence of a recorded verification's ``settings`` (what verify ran, not a claim)."""
        st = settings if isinstance(settings, Mapping) else {}
        seeds = st.get("seeds")
        return cls(prompts=int_or_zero(st.get("n_prompts")), seeds=len(seeds) if isinstance(seeds, list) else 0,
                   max_tokens=int_or_zero(st.get("max_tokens")))

    @property
    def shortfall(self) -> str | None:
        """Why this is too little to publish (None: enough)."""
        short = []
        if self.prompts < self.MIN_PROMPTS:
            short.append(f"{self.prompts} prompt(s), the minimum is {self.MIN_PROMPTS}")
        if self.max_tokens < self.MIN_MAX_TOKENS:
            short.append(f"replies of up to {self.max_tokens} tokens, the minimum is {self.MIN_MAX_TOKENS}")
        return "; ".join(short) or None

    def text(self) -> str:
        """``54 prompts x 3 seeds x up to 64 tokens (publishable: >= 8 prompts, >= 64 tokens)``."""
        ok = "publishable" if self.shortfall is None else "NOT publishable"
        return (f"{self.prompts} prompts x {self.seeds} seed(s) x up to {self.max_tokens} tokens ({ok}: needs >= "
                f"{self.MIN_PROMPTS} prompts, >= {self.MIN_MAX_TOKENS} tokens per reply)")

    def to_dict(self) -> JsonObject:
        return {"prompts": self.prompts, "seeds": self.seeds, "max_tokens": self.max_tokens,
                "minimum": {"prompts": self.MIN_PROMPTS, "max_tokens": self.MIN_MAX_TOKENS},
                "sufficient": self.shortfall is None}


def int_or_zero(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else 0
