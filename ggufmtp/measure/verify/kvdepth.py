"""KV-cache types and context depth for ``ggufmtp verify``: the checks made before any server
starts, and the neutral prefix that puts every request ``depth`` tokens deep.

KV-cache types
--------------
``--cache-type-k``/``--cache-type-v`` go to BOTH arms (a non-speculative setting: the vanilla arm
must run with the same cache as the MTP arm, or the speedup measures the cache, not MTP). They set
the *target's* cache only: in the pinned llama.cpp the MTP draft context takes its types from
``--spec-draft-type-k/-v`` (``-ctkd``/``-ctvd``, default f16; ``common_base_params_to_speculative``
in ``common/speculative.cpp``), which ``verify --matrix "draft-kv=..."`` varies on the MTP arm
(tests/test_matrix.py reads both contexts' types off the server's log). A type must
be one of the ``allowed values`` llama-server's ``--help`` lists for ``--cache-type-k`` (f32, f16,
bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 at the pinned commit). A quantized V cache needs flash
attention (``llama_init_from_model`` refuses it with ``--flash-attn off`` and turns ``auto`` on):
verify then passes ``--flash-attn on`` to both arms explicitly, so the arms' argument lists say so,
and a ``-fa off`` among the server arguments is an error before anything starts.

Context depth
-------------
``context_fill=N`` puts every request N tokens deeper, in both arms, for every seed and mode: the
same neutral prefix goes before every prompt as a system message of its own (at the start of the
prompt's system message when it has one; before the text on ``/completion``). Its length is set
with the vanilla server's ``/apply-template`` and ``/tokenize`` so that the templated prompt grows by
N tokens (exactly, or within a few where a cut cannot land exactly; :class:`ContextFill` records
the count). Its text is a deterministic, suite-independent generated description of places
(``neutral-v1``), opened by a line saying it is unrelated to the request that follows. Requests
keep ``cache_prompt: false``: each one prefills its whole prompt (slow at depth, but prompt
processing is not in the decode figure: decode tok/s is ``predicted_n / predicted_ms``), and each
decodes with exactly ``N + prompt`` tokens in its KV cache in both arms, whatever ran before it.
Caching the shared prefix would make a request's state depend on the previous request in the ABBA
order (and on the MTP arm's draft-context reuse), which the paired design exists to avoid; so for
a decode measurement at depth, paying the prefill is the fairer choice.

The depth check (before any server starts): ``N`` + the longest prompt (bounded by its UTF-8 bytes
plus the chat template's tokens) + ``max_tokens`` must fit one slot's context (``--ctx-size``, or the
model's ``context_length`` when 0/None, divided by ``--parallel``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import GgufmtpError, RuntimeMissingError, ServerError, VerifyError
from ...gguf.reader import read_header
from ...runtime import build as runtime
from ...runtime.server import LlamaServer, binary_help
from ..core.suite import Prompt, Suite

__all__ = ["KNOWN_CACHE_TYPES", "UNQUANTIZED_CACHE_TYPES", "NEUTRAL_TEXT", "KvDepth", "ContextFill",
           "allowed_cache_types", "check_cache_type", "check_kv_depth", "neutral_text", "fill_context", "kv_depth_text"]

# --cache-type-k's allowed values at the pinned llama.cpp (used when --help cannot be read for them)
KNOWN_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
UNQUANTIZED_CACHE_TYPES = frozenset({"f32", "f16", "bf16"})
FLASH_ATTN_FLAGS = ("-fa", "--flash-attn")
NEUTRAL_TEXT = "neutral-v1"
TEMPLATE_TOKENS_PER_MESSAGE = 16  # a chat template's role markers per message (generous)
_ALLOWED_RE = re.compile(r"--cache-type-k(?![\w-]).*?allowed values:\s*([^\n]+)", re.S)


# ----------------------------------------------------------------------------- the checks


@dataclass(frozen=True)
class KvDepth:
    """The checked KV-cache and depth settings of a run: the cache types (None: llama-server's
    default), the flags both arms get for them (``--flash-attn on`` with a quantized V cache) and
    the requested context depth."""

    cache_type_k: str | None
    cache_type_v: str | None
    server_args: tuple[str, ...]
    depth: int

    def server_fields(self, extra_args: Sequence[str] = ()) -> dict[str, Any]:
        """The :class:`~ggufmtp.runtime.server.ServerConfig` fields every arm gets for them, after
        the run's ``extra_args``."""
        return {"extra_args": [*extra_args, *self.server_args], "cache_type_k": self.cache_type_k,
                "cache_type_v": self.cache_type_v}


def allowed_cache_types(llama_cpp_bin: str | os.PathLike | None = None) -> tuple[str, ...]:
    """The KV-cache types the llama-server that would run accepts (its ``--help``'s allowed values
    for ``--cache-type-k``; :data:`KNOWN_CACHE_TYPES` when the list cannot be read from it)."""
    try:
        text = binary_help(runtime.find_binary("llama-server", llama_cpp_bin))
    except (RuntimeMissingError, ServerError, OSError) as e:
        raise VerifyError(f"cannot check the KV-cache types: {e}") from e
    if "--cache-type-k" not in text:
        raise VerifyError("this llama-server has no --cache-type-k flag (not in its --help)")
    m = _ALLOWED_RE.search(text)
    found = tuple(t.strip() for t in m.group(1).split(",") if t.strip()) if m else ()
    return found or KNOWN_CACHE_TYPES


def check_cache_type(name: str, value: str | None, allowed: Sequence[str]) -> str | None:
    """``value`` (None: the default) lower-cased; VerifyError naming flag ``name`` unless ``allowed``."""
    if value is None:
        return None
    t = str(value).strip().lower()
    if t not in allowed:
        raise VerifyError(f"{name} {value!r}: not a KV-cache type this llama-server supports "
                          f"(allowed: {', '.join(allowed)})")
    return t


def _flash_attn_value(args: Sequence[str]) -> str | None:
    """The value of the last -fa/--flash-attn among ``args`` (``-fa off`` or ``--flash-attn=off``)."""
    out = None
    for i, a in enumerate(args):
        flag, eq, val = str(a).partition("=")
        if flag in FLASH_ATTN_FLAGS:
            out = val if eq else (str(args[i + 1]) if i + 1 < len(args) else "")
    return out


def _slot_context(model: Path, ctx_size: int | None, parallel: int | None) -> tuple[int | None, str]:
    """(tokens one slot holds, where that number comes from)."""
    where = f"--ctx-size {ctx_size}"
    n = ctx_size
    if not n:
        try:
            h = read_header(model)
            n = int(h.metadata[f"{h.metadata['general.architecture']}.context_length"])
        except (GgufmtpError, KeyError, ValueError, OSError):
            return None, "unknown"
        where = f"the model's context_length {n} (--ctx-size 0)"
    if parallel and parallel > 1:
        return n // parallel, f"{where} / --parallel {parallel}"
    return n, where


def prompt_token_bound(p: Prompt) -> int:
    """An upper bound of the tokens ``p`` takes through a chat template: its UTF-8 bytes (a
    byte-level tokenizer never spends more than one token per byte) plus the template's markers."""
    return sum(len(m["content"].encode()) + TEMPLATE_TOKENS_PER_MESSAGE for m in p.messages) \
        + TEMPLATE_TOKENS_PER_MESSAGE


def _check_depth(depth: int, model: Path, ctx_size: int | None, parallel: int | None, max_tokens: int,
                 suite: Suite) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise VerifyError(f"context fill {depth!r}: must be a whole number of tokens, 0 or more")
    if depth == 0:
        return
    n_ctx, where = _slot_context(model, ctx_size, parallel)
    if n_ctx is None:
        return
    prompt = max(prompt_token_bound(p) for p in suite.prompts)
    need = depth + prompt + max_tokens
    if need > n_ctx:
        raise VerifyError(
            f"context depth {depth} does not fit: {depth} (fill) + up to {prompt} (the longest prompt) + "
            f"{max_tokens} (max_tokens) = {need} tokens, but a slot holds {n_ctx} ({where}); "
            f"raise --ctx-size to at least {need * max(parallel or 1, 1)} or lower the depth")


def check_kv_depth(cache_type_k: str | None, cache_type_v: str | None, depth: int, model: str | Path,
                   ctx_size: int | None, parallel: int | None, max_tokens: int, suite: Suite,
                   llama_cpp_bin: str | Path | None = None, server_args: Sequence[str] = ()) -> KvDepth:
    """Every KV-cache and depth setting checked (VerifyError on the first bad one) before any server
    starts: the types against llama-server's ``--help``, a quantized V cache against ``-fa off`` in
    ``server_args``, the depth against one slot's context."""
    k = v = None
    if cache_type_k is not None or cache_type_v is not None:
        allowed = allowed_cache_types(llama_cpp_bin)
        k = check_cache_type("--cache-type-k", cache_type_k, allowed)
        v = check_cache_type("--cache-type-v", cache_type_v, allowed)
    extra: tuple[str, ...] = ()
    if v is not None and v not in UNQUANTIZED_CACHE_TYPES:
        fa = _flash_attn_value(server_args)
        if fa is not None and fa != "on":
            raise VerifyError(f"--cache-type-v {v}: a quantized V cache needs flash attention, but the server "
                              f"arguments set --flash-attn {fa or '(no value)'}; drop it (verify then passes "
                              f"--flash-attn on to both arms)")
        extra = () if fa == "on" else ("--flash-attn", "on")
    _check_depth(depth, Path(model), ctx_size, parallel, max_tokens, suite)
    return KvDepth(k, v, extra, depth)


# ----------------------------------------------------------------------------- the neutral prefix

_HEADER = ("Background notes follow. They are unrelated to the request that comes after them "
           "and can be ignored.\n\n")
_SEPARATOR = "\n\nEnd of the background notes.\n\n"
_SUBJECTS = ("The old stone bridge", "A narrow gravel path", "The village library", "A wooden fishing boat",
             "The eastern meadow", "A row of tall pine trees", "The clock tower", "A quiet harbour",
             "The north road", "A small apple orchard", "The weather station", "A red brick warehouse",
             "The ferry landing", "A low garden wall", "The hillside vineyard", "A disused railway line")
_VERBS = ("lies beside", "stands near", "looks out over", "runs along", "faces", "leads toward",
          "is a short walk from", "can be seen from", "was built close to", "borders")
_OBJECTS = ("the slow river", "a field of barley", "the market square", "the western hills", "a shallow pond",
            "the coastal cliffs", "the town hall", "an empty parking area", "the reed beds", "a row of cottages",
            "the cricket ground", "the lighthouse", "a birch wood", "the canal lock")
_TAILS = ("in the early morning", "during the dry season", "after the autumn rain", "on most weekdays",
          "when the tide is low", "under a grey sky", "in late spring", "at the end of the day",
          "in the first week of winter", "when the wind comes from the sea")
_NUMBERS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "eleven", "twelve")


def _lcg(state: int) -> int:
    return (1664525 * state + 1013904223) % (1 << 32)


def neutral_text(min_chars: int) -> str:
    """At least ``min_chars`` characters of the deterministic neutral text (the same text on every
    machine and Python: a fixed linear congruential generator over fixed word lists)."""
    parts, size, state, n = [_HEADER], len(_HEADER), 12345, 0
    while size < min_chars:
        picks = []
        for pool in (_SUBJECTS, _VERBS, _OBJECTS, _TAILS, _NUMBERS):
            state = _lcg(state)
            picks.append(pool[(state >> 16) % len(pool)])
        s, v, o, t, num = picks
        n += 1
        sentence = (f"{s} {v} {o} {t}, and {num} people were counted there." if n % 3 == 0
                    else f"{s} {v} {o} {t}.") + ("\n\n" if n % 7 == 0 else " ")
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)


@dataclass(frozen=True)
class ContextFill:
    """The prefix a run put before every prompt: the requested depth, the tokens it puts a chat
    request deeper by (the server's ``/apply-template`` and ``/tokenize`` with and without it), the
    text it was cut from and the prefix's sha256."""

    depth: int
    tokens: int
    text: str
    sha256: str
    prefix: str = dataclasses.field(repr=False, compare=False, default="")

    def to_dict(self) -> dict[str, Any]:
        return {"depth": self.depth, "tokens": self.tokens, "text": self.text, "sha256": self.sha256,
                "cache_prompt": False, "placement": "system message before the prompt, both arms"}


def _tokenize(srv: LlamaServer, text: str, special: bool = False) -> list[int]:
    return srv.tokenize(text, add_special=False, parse_special=special)


_PROBE = ({"role": "user", "content": "Hello."},)


def _depth_of(srv: LlamaServer, prefix: str, without: int) -> int:
    """How many tokens deeper ``prefix`` (as a system message) puts a chat request: the templated
    prompt's tokens with it minus ``without`` (the same prompt's without it)."""
    text = srv.post_json("/apply-template", {"messages": [{"role": "system", "content": prefix}, *_PROBE]})["prompt"]
    return len(_tokenize(srv, text, special=True)) - without


def _prefix(srv: LlamaServer, depth: int) -> tuple[str, int]:
    """(a prefix of the neutral text ending with the separator, the depth it puts a chat request
    at): ``depth`` tokens, or within a few when a cut cannot land exactly."""
    chars = depth * 6 + 1024
    tokens = _tokenize(srv, neutral_text(chars))
    while len(tokens) < depth:
        chars *= 2
        tokens = _tokenize(srv, neutral_text(chars))
    plain = srv.post_json("/apply-template", {"messages": list(_PROBE)})["prompt"]
    without = len(_tokenize(srv, plain, special=True))
    body = max(depth - len(_tokenize(srv, _SEPARATOR)), 1)
    best: tuple[int, str, int] | None = None
    for _ in range(4):  # the template's markers and a cut that merges differently at the join: correct
        prefix = srv.post_json("/detokenize", {"tokens": tokens[:body]})["content"] + _SEPARATOR
        got = _depth_of(srv, prefix, without)
        if best is None or abs(depth - got) < best[0]:
            best = (abs(depth - got), prefix, got)
        if got == depth:
            break
        body = max(1, min(len(tokens), body + depth - got))
    assert best is not None
    return best[1], best[2]


def _filled(p: Prompt, prefix: str) -> Prompt:
    """``p`` behind ``prefix``: at the start of its system message, or as a system message of its
    own before the others (not in the user's turn, which some templates repeat); and before its raw text."""
    first, *rest = p.messages
    if first["role"] == "system":
        messages = ({**first, "content": prefix + first["content"]}, *rest)
    else:
        messages = ({"role": "system", "content": prefix}, *p.messages)
    return dataclasses.replace(p, messages=messages, prompt=None if p.prompt is None else prefix + p.prompt)


def fill_context(suite: Suite, srv: LlamaServer, depth: int) -> tuple[Suite, ContextFill | None]:
    """``suite`` with the neutral prefix of ``depth`` tokens (tokenized by ``srv``) before every
    prompt (:func:`_filled`), and what was put there; ``depth`` 0: unchanged."""
    if not depth:
        return suite, None
    try:
        prefix, n = _prefix(srv, depth)
    except (ServerError, KeyError, TypeError) as e:
        raise VerifyError(f"context fill {depth}: tokenizing the neutral prefix failed: {e}") from e
    fill = ContextFill(depth, n, NEUTRAL_TEXT, hashlib.sha256(prefix.encode()).hexdigest(), prefix)
    return dataclasses.replace(suite, prompts=tuple(_filled(p, prefix) for p in suite.prompts)), fill


def kv_depth_text(cache_type_k: str | None, cache_type_v: str | None, fill: ContextFill | None) -> str | None:
    """One line of a report on the KV cache and depth (None when both are llama-server's defaults)."""
    if cache_type_k is None and cache_type_v is None and fill is None:
        return None
    quantized_v = cache_type_v is not None and cache_type_v not in UNQUANTIZED_CACHE_TYPES
    kv = (f"KV cache K {cache_type_k or 'f16 (default)'} / V {cache_type_v or 'f16 (default)'}, both arms"
          + ("; --flash-attn on (a quantized V cache needs it)" if quantized_v else ""))
    depth = (f"context fill {fill.depth} tokens ({fill.tokens} by /tokenize; {fill.text} prefix, "
             f"cache_prompt false)" if fill is not None else "context fill none")
    return f"{kv}; {depth}"
