"""Quantization recipes: the shipped ``recipes/*.toml`` (:func:`recipes_dir`) or a file, loaded by :class:`Recipe`.

A recipe is a llama.cpp ftype plus ordered override rules, matched exactly as llama-quantize
matches ``--tensor-type``: the pattern is lower-cased, searched (unanchored, ECMAScript regex)
in the tensor name, and the first matching rule wins. The ``[mtp]`` table sets types for the
MTP block by role; its rules come first and use the ``{mtp}`` placeholder for the block index,
so one recipe serves blk.40 of Qwen3.6-35B-A3B and blk.4 of a 4-layer test model alike.

Several MTP blocks (``nextn_predict_layers`` > 1, e.g. step35's chain): ``{mtp}`` stands for every
one of them, as one alternation (``(40|41)``: still one rule, so the first-match order and
``plan --emit llama-quantize`` are unchanged; with one block it is the bare index, as before), and
so do the ``[mtp]`` roles. ``{mtp0}``, ``{mtp1}`` ... stand for one block, by its position in the
chain. A rule whose placeholder names a block the model lacks is dropped, like a ``{mtp}`` rule on
a model without MTP; ``plan`` warns when the model has MTP blocks but fewer than a ``{mtpN}`` needs
(the recipe was written for a longer chain: the rest of it still applies).

Any type llama-quantize accepts is a recipe too (:meth:`Recipe.for_type`): ``-r Q4_K_M`` is that
type with the MTP block required and ggufmtp's head defaults (``nextn.eh_proj`` Q8_0, every other
MTP tensor at least Q4_K: ``[mtp] floor``) and the default ``[verify]`` thresholds; ``Q4_K_M-plain``
is llama-quantize's own Q4_K_M (no head defaults, MTP block optional). llama-quantize's per-tensor
flags become a recipe's ``overrides`` and switches (:mod:`ggufmtp.quant.flags`).

Example::

    name = "hifi-q4_k_m-mtp"
    description = "Q4_K_M, MTP eh_proj kept at Q8_0"
    ftype = "Q4_K_M"
    tag = "Q4_K_M_HiFi"               # optional: the release name <Model>-<tag>.gguf (default: the ftype)
    # output_type = "Q6_K"            # optional: --output-tensor-type
    # token_embedding_type = "Q4_K"   # optional: --token-embedding-type
    imatrix = "recommended"           # "required" | "recommended" | "none"

    # pure = true                     # optional: --pure; leave_output_tensor, allow_requantize alike

    [mtp]
    required = true                   # refuse models without a complete MTP block
    eh_proj = "Q8_0"                  # roles: eh_proj, attention, routed_experts, shared_expert, rest
    # floor = "Q4_K"                  # MTP tensors no rule names, planned below this type, are raised to it

    # [[overrides]]                   # rules before the [mtp] roles (what llama-quantize flags become)

    [[rules]]                         # ordered; {mtp} = the MTP block index(es), {mtp0} the first
    pattern = 'ffn_down_exps'
    type = "Q5_K"

    [verify]
    min_acceptance = 0.60
    min_speedup = 1.0
    draft_n_max = 4

    # [search]                        # written by `ggufmtp search`: how the recipe was found and what
                                      # was measured; read as a table and otherwise ignored
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import RecipeError, TomlError
from ..files.fsutil import MAX_TEXT_FILE_BYTES, read_regular_file
from ..files.tomlfile import loads_toml
from ..jsontypes import JsonObject
from ..stats import check_margin
from .naming import tag_problem
from .patterns import pattern_problem
from .qtypes import FTYPE_DEFAULT_TYPE, QUANT_OPTIONS, REFUSED_QUANT_OPTIONS, match_quant_option, valid_quant_types

MTP_PLACEHOLDER = "{mtp}"
# {mtp} (every MTP block) or {mtpN} (the N-th, from 0); group 1 is N or empty.
MTP_PLACEHOLDER_RE = re.compile(r"\{mtp(\d*)\}")

# Role -> pattern (with {mtp}), in the order they are applied.
MTP_ROLES: dict[str, str] = {
    "eh_proj": r"blk\.{mtp}\.nextn\.eh_proj\.weight",
    "attention": r"blk\.{mtp}\.attn_",
    "routed_experts": r"blk\.{mtp}\.ffn_(gate|up|down|gate_up)_exps\.weight",
    "shared_expert": r"blk\.{mtp}\.ffn_(gate|up|down)_shexp\.weight",
    "rest": r"blk\.{mtp}\.",
}
IMATRIX_MODES = ("required", "recommended", "none")
# ggufmtp's head defaults for a llama-quantize type given as a recipe (Recipe.for_type)
HEAD_EH_PROJ_TYPE = "Q8_0"
HEAD_FLOOR_TYPE = "Q4_K"
UNQUANTIZED_FTYPES = ("F32", "F16", "BF16")
# The types an imatrix does not change (llama.cpp's Q8_0 and the float types ignore the statistics).
NO_IMATRIX_TYPES = ("Q8_0", *UNQUANTIZED_FTYPES)


def ggml_type_names() -> dict[str, int]:
    import gguf

    return {t.name: int(t.value) for t in gguf.GGMLQuantizationType}


def ftype_names() -> dict[str, int]:
    """llama.cpp ftype names as llama-quantize spells them (``Q4_K_M``, ``IQ4_XS``, ``BF16`` ...)."""
    import gguf

    out = {}
    for ft in gguf.LlamaFileType:
        if ft.name == "GUESSED":
            continue
        out[ft.name.replace("MOSTLY_", "").replace("ALL_", "")] = int(ft.value)
    return out


def normalize_type(name: str, where: str) -> str:
    up = str(name).strip().upper()
    if up not in ggml_type_names():
        raise RecipeError(f"{where}: unknown tensor type {name!r} (known: Q8_0, Q6_K, Q5_K, Q4_K, IQ4_XS, ...)")
    return up


def normalize_ftype(name: str, where: str) -> str:
    """The ftype a llama-quantize type name stands for (case-insensitive; ``Q4_K`` is ``Q4_K_M``, as
    llama-quantize reads it); RecipeError naming the valid ones otherwise."""
    option = match_quant_option(str(name))
    if option in REFUSED_QUANT_OPTIONS:
        raise RecipeError(f"{where}: {name!r}: {REFUSED_QUANT_OPTIONS[option]}")
    if option is None or QUANT_OPTIONS[option] not in ftype_names():
        raise RecipeError(f"{where}: unknown ftype {name!r} (llama-quantize's types: {', '.join(valid_quant_types())})")
    return QUANT_OPTIONS[option]


def validate_pattern(pattern: str, where: str) -> None:
    """RecipeError unless ``pattern`` (placeholders filled in) is a regex whose matching time its
    shape bounds (:func:`.patterns.pattern_problem`: llama.cpp's std::regex has no time limit); a
    ``{mtp...}`` that is not a placeholder is refused (``{`` would reach std::regex as a bad quantifier)."""
    stray = MTP_PLACEHOLDER_RE.sub("", pattern)
    if "{mtp" in stray:
        raise RecipeError(f"{where}: {pattern!r}: placeholders are {{mtp}} (every MTP block) or {{mtp0}}, "
                          f"{{mtp1}} ... (one, by position)")
    filled = MTP_PLACEHOLDER_RE.sub("(0|1)", pattern)  # as a chain's {mtp} resolves: an alternation
    try:
        re.compile(filled)
        problem = pattern_problem(filled)
    except re.error as e:
        raise RecipeError(f"{where}: invalid regex {pattern!r}: {e}") from None
    if problem:
        raise RecipeError(f"{where}: pattern {pattern!r} is refused: {problem}; tensor names are short, "
                          f"so write it without nesting (e.g. 'blk\\.[0-9]+\\.ffn_down')")


def as_mtp_blocks(mtp_blocks: int | Sequence[int] | None) -> list[int]:
    """The MTP block indices from one index (single-block callers), a list of them, or None."""
    if mtp_blocks is None:
        return []
    if isinstance(mtp_blocks, int):
        return [mtp_blocks]
    return [int(b) for b in mtp_blocks]


def mtp_alternation(blocks: Sequence[int]) -> str:
    """What ``{mtp}`` becomes: ``4`` for one block, ``(40|41)`` for a chain (ECMAScript and Python alike)."""
    return str(blocks[0]) if len(blocks) == 1 else "(" + "|".join(str(b) for b in blocks) + ")"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One override: tensors whose name matches ``pattern`` (unanchored) get ``type``."""

    pattern: str
    type: str
    source: str = "rules"  # "mtp.<role>" or "rules"

    def resolve(self, mtp_blocks: int | Sequence[int] | None) -> Rule | None:
        """The rule with ``{mtp}`` replaced by every MTP block (:func:`mtp_alternation`) and ``{mtpN}``
        by the N-th; None if it needs an MTP block the model lacks (none at all, or fewer than N+1)."""
        if not MTP_PLACEHOLDER_RE.search(self.pattern):
            return self
        blocks = as_mtp_blocks(mtp_blocks)
        if not blocks or self.max_mtp_index() >= len(blocks):
            return None

        def fill(m: re.Match[str]) -> str:
            return mtp_alternation(blocks) if m.group(1) == "" else str(blocks[int(m.group(1))])

        return dataclasses.replace(self, pattern=MTP_PLACEHOLDER_RE.sub(fill, self.pattern))

    def max_mtp_index(self) -> int:
        """The highest N of the ``{mtpN}`` placeholders in the pattern (-1 when it has none)."""
        return max((int(m.group(1)) for m in MTP_PLACEHOLDER_RE.finditer(self.pattern) if m.group(1)), default=-1)

    @property
    def llama_pattern(self) -> str:
        """The pattern as llama-quantize uses it (it lower-cases ``--tensor-type`` names)."""
        return self.pattern.lower()

    def to_dict(self) -> dict[str, str]:
        """The rule as plan JSON and receipts record it."""
        return {"pattern": self.pattern, "type": self.type, "source": self.source}


@dataclasses.dataclass(frozen=True)
class VerifyThresholds:
    min_acceptance: float | None = None
    min_speedup: float | None = None
    draft_n_max: int = 4
    head_margin: float | None = None  # the head's non-inferiority margin (None: ggufmtp's, provenance.head)


@dataclasses.dataclass(frozen=True)
class QuantizeFlags:
    """llama-quantize's per-tensor flags, as it means them; :meth:`Recipe.with_flags` applies them."""

    tensor_types: tuple[Rule, ...] = ()  # --tensor-type, in order (first match wins), source "flags"
    output_type: str | None = None  # --output-tensor-type
    token_embedding_type: str | None = None  # --token-embedding-type
    pure: bool = False  # --pure
    leave_output_tensor: bool = False  # --leave-output-tensor
    allow_requantize: bool = False  # --allow-requantize
    kv_overrides: tuple[str, ...] = ()  # --override-kv KEY=TYPE:VALUE, checked (quant/kv.py)
    include_weights: tuple[str, ...] = ()  # --include-weights: only these imatrix entries (substring)
    exclude_weights: tuple[str, ...] = ()  # --exclude-weights: not these

    @classmethod
    def build(cls, tensor_types: Sequence[str] = (), output_type: str | None = None,
              token_embedding_type: str | None = None, *, pure: bool = False, leave_output_tensor: bool = False,
              allow_requantize: bool = False, kv_overrides: Sequence[str] = (), include_weights: Sequence[str] = (),
              exclude_weights: Sequence[str] = (), tensor_type_file: str | Path | None = None) -> QuantizeFlags:
        """The flags from their command-line values (``--tensor-type`` as ``PATTERN=TYPE`` strings,
        then the items of ``--tensor-type-file``, as llama-quantize orders them); RecipeError naming
        a malformed one."""
        from .kv import check_weights_filter, parse_kv_override, read_tensor_type_file

        tensor_types = [*tensor_types, *(read_tensor_type_file(tensor_type_file) if tensor_type_file else ())]
        for v in kv_overrides:
            parse_kv_override(v)
        check_weights_filter(include_weights, exclude_weights)
        return cls(tensor_types=tuple(tensor_type_rule(v) for v in tensor_types),
                   output_type=normalize_type(output_type, "--output-tensor-type") if output_type else None,
                   token_embedding_type=(normalize_type(token_embedding_type, "--token-embedding-type")
                                         if token_embedding_type else None),
                   pure=pure, leave_output_tensor=leave_output_tensor, allow_requantize=allow_requantize,
                   kv_overrides=tuple(kv_overrides), include_weights=tuple(include_weights),
                   exclude_weights=tuple(exclude_weights))

    @property
    def given(self) -> bool:
        return self != QuantizeFlags()


def _texts(doc: Mapping[str, object], key: str, where: str) -> tuple[str, ...]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RecipeError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def tensor_type_rule(value: str) -> Rule:
    """``--tensor-type PATTERN=TYPE`` as llama-quantize reads it (the pattern lower-cased, searched
    unanchored in each tensor name; the type case-insensitive)."""
    pat, sep, typ = value.partition("=")
    if not sep or not pat or not typ:
        raise RecipeError(f"--tensor-type: malformed {value!r} (want PATTERN=TYPE, e.g. 'blk\\.40\\.nextn\\.eh_proj=q8_0')")
    validate_pattern(pat.lower(), f"--tensor-type {value!r}")
    return Rule(pat.lower(), normalize_type(typ, f"--tensor-type {value!r}"), "flags")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A quantization policy. Build with :meth:`load`, :meth:`from_dict`, :meth:`for_type` or
    :func:`ggufmtp.quant.flags.recipe_from_flags`."""

    name: str
    ftype: str
    description: str = ""
    output_type: str | None = None
    token_embedding_type: str | None = None
    imatrix: str = "recommended"
    mtp_required: bool = True
    mtp_roles: tuple[tuple[str, str], ...] = ()  # (role, type) in MTP_ROLES order
    rules: tuple[Rule, ...] = ()
    verify: VerifyThresholds = VerifyThresholds()
    overrides: tuple[Rule, ...] = ()  # ahead of the [mtp] roles: llama-quantize flags given with a recipe win
    mtp_floor: str | None = None  # [mtp] floor: MTP tensors no rule names are raised to at least this type
    pure: bool = False  # llama-quantize --pure
    leave_output_tensor: bool = False  # --leave-output-tensor
    allow_requantize: bool = False  # --allow-requantize
    kv_overrides: tuple[str, ...] = ()  # --override-kv KEY=TYPE:VALUE (override_kv in a TOML)
    include_weights: tuple[str, ...] = ()  # --include-weights: the imatrix entries used (include_weights)
    exclude_weights: tuple[str, ...] = ()  # --exclude-weights: the imatrix entries left out (exclude_weights)
    path: str | None = None
    sha256: str | None = None
    tag: str | None = None  # the variant's name in a release (Q4_K_M_HiFi); None: the ftype (quant/naming.py)

    # --- loading --------------------------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str | Path) -> Recipe:
        """Load a recipe file, a shipped recipe by name (``hifi-q4_k_m-mtp``), or a llama-quantize
        type: ``Q4_K_M`` with ggufmtp's head defaults, ``Q4_K_M-plain`` without (:meth:`for_type`)."""
        typed = _type_recipe(name_or_path)
        if typed is not None:
            return typed
        path = resolve_recipe_path(name_or_path)
        try:
            data = read_regular_file(path, MAX_TEXT_FILE_BYTES)
        except OSError as e:
            raise RecipeError(f"{path}: {e.strerror or type(e).__name__}") from None
        try:
            doc = loads_toml(data)
        except TomlError as e:
            raise RecipeError(f"{path}: not valid TOML ({e})") from None
        try:
            recipe = cls.from_dict(doc, where=str(path))
        except (TypeError, ValueError, AttributeError) as e:  # a table where a list belongs, text for a number
            if isinstance(e, RecipeError):
                raise
            raise RecipeError(f"{path}: malformed recipe ({e})") from None
        return dataclasses.replace(recipe, path=str(path), sha256=hashlib.sha256(data).hexdigest())

    @classmethod
    def from_dict(cls, doc: JsonObject, where: str = "recipe") -> Recipe:
        known = {"name", "description", "ftype", "output_type", "token_embedding_type", "imatrix", "mtp",
                 "overrides", "pure", "leave_output_tensor", "allow_requantize", "override_kv", "include_weights",
                 "exclude_weights",
                 "rules", "verify", "tag", "search"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise RecipeError(f"{where}: unknown key(s) {', '.join(unknown)}")
        if not isinstance(doc.get("search", {}), dict):  # how `ggufmtp search` found it: provenance, not policy
            raise RecipeError(f"{where}: [search] must be a table (how the recipe was found), not {doc['search']!r}")
        for key in ("name", "ftype"):
            if key not in doc:
                raise RecipeError(f"{where}: missing required key {key!r}")
        ftype = normalize_ftype(doc["ftype"], f"{where}: ftype")
        tag = str(doc["tag"]) if doc.get("tag") is not None else None
        if tag is not None and (problem := tag_problem(tag)):
            raise RecipeError(f"{where}: {problem}")
        imatrix = str(doc.get("imatrix", "recommended"))
        if imatrix not in IMATRIX_MODES:
            raise RecipeError(f"{where}: imatrix must be one of {', '.join(IMATRIX_MODES)}, not {imatrix!r}")
        mtp = dict(doc.get("mtp", {}))
        mtp_required = bool(mtp.pop("required", True))
        floor = normalize_type(mtp.pop("floor"), f"{where}: mtp.floor") if mtp.get("floor") else None
        bad_roles = sorted(set(mtp) - set(MTP_ROLES))
        if bad_roles:
            raise RecipeError(f"{where}: [mtp] unknown role(s) {', '.join(bad_roles)} "
                              f"(roles: {', '.join(MTP_ROLES)}, required, floor)")
        roles = tuple((role, normalize_type(mtp[role], f"{where}: mtp.{role}")) for role in MTP_ROLES if role in mtp)
        rules = _parse_rules(doc.get("rules", []), where, "rules")
        v = dict(doc.get("verify", {}))
        verify = VerifyThresholds(
            min_acceptance=_opt_float(v.get("min_acceptance")),
            min_speedup=_opt_float(v.get("min_speedup")),
            draft_n_max=int(v.get("draft_n_max", 4)),
            head_margin=_head_margin(v.get("head_margin"), where),
        )
        return cls(
            name=str(doc["name"]),
            ftype=ftype,
            description=str(doc.get("description", "")),
            output_type=normalize_type(doc["output_type"], f"{where}: output_type") if doc.get("output_type") else None,
            token_embedding_type=(normalize_type(doc["token_embedding_type"], f"{where}: token_embedding_type")
                                  if doc.get("token_embedding_type") else None),
            imatrix=imatrix,
            mtp_required=mtp_required,
            mtp_roles=roles,
            rules=rules,
            verify=verify,
            overrides=_parse_rules(doc.get("overrides", []), where, "overrides"),
            mtp_floor=floor,
            pure=_flag(doc, "pure", where),
            leave_output_tensor=_flag(doc, "leave_output_tensor", where),
            allow_requantize=_flag(doc, "allow_requantize", where),
            tag=tag,
        ).with_flags(QuantizeFlags.build(kv_overrides=_texts(doc, "override_kv", where),
                                         include_weights=_texts(doc, "include_weights", where),
                                         exclude_weights=_texts(doc, "exclude_weights", where)))

    @classmethod
    def for_type(cls, type_name: str, head_defaults: bool = True) -> Recipe:
        """The recipe of a llama-quantize type (``Q4_K_M``, ``q4_k``, ``IQ2_XXS``, ...). With
        ``head_defaults``: the MTP block required, ``nextn.eh_proj`` at Q8_0 and every other MTP
        tensor at least Q4_K (the learned-head study in ``benchmarks/README.md``: heads down to Q4_K
        draft as well as BF16's; only those below are raised, the type's mix may keep others higher);
        without: llama-quantize's own (named ``<TYPE>-plain``, MTP block optional). Either way the
        default ``[verify]`` thresholds, and ``imatrix = "required"`` where the type needs one."""
        from ..imatrix.check import needs_imatrix

        option = match_quant_option(type_name)
        if option in REFUSED_QUANT_OPTIONS:
            raise RecipeError(f"{type_name}: {REFUSED_QUANT_OPTIONS[option]}")
        if option is None:
            raise RecipeError(f"{type_name}: not a llama-quantize type (types: {', '.join(valid_quant_types())})")
        ftype = QUANT_OPTIONS[option]
        imatrix = ("required" if needs_imatrix(FTYPE_DEFAULT_TYPE[ftype], ftype)
                   else "none" if ftype in NO_IMATRIX_TYPES else "recommended")
        if not head_defaults:
            return cls(name=f"{ftype}-plain", ftype=ftype, imatrix=imatrix, mtp_required=False,
                       description=f"llama-quantize {ftype}: its own per-tensor types, no MTP head defaults")
        quantized = ftype not in UNQUANTIZED_FTYPES  # an F16/BF16/F32 ftype ignores every override
        return cls(name=ftype, ftype=ftype, imatrix=imatrix, mtp_required=True,
                   mtp_roles=(("eh_proj", HEAD_EH_PROJ_TYPE),) if quantized else (),
                   mtp_floor=HEAD_FLOOR_TYPE if quantized else None,
                   description=f"llama-quantize {ftype} with the MTP block kept and ggufmtp's head defaults" +
                               (f" (nextn.eh_proj {HEAD_EH_PROJ_TYPE}, the rest at least {HEAD_FLOOR_TYPE})"
                                if quantized else ""))

    def with_flags(self, flags: QuantizeFlags) -> Recipe:
        """This recipe with llama-quantize's per-tensor flags applied as llama-quantize means them:
        ``--tensor-type`` rules ahead of every rule of the recipe (first match wins, so they override
        it), ``--output-tensor-type``/``--token-embedding-type`` replacing the recipe's, ``--pure``,
        ``--leave-output-tensor``, ``--allow-requantize`` switched on. The name, file and digest stay
        the recipe's (its ``[verify]`` still judges); the plan and receipt list the rules as applied."""
        if not flags.given:
            return self
        return dataclasses.replace(
            self, overrides=flags.tensor_types + self.overrides,
            output_type=flags.output_type or self.output_type,
            token_embedding_type=flags.token_embedding_type or self.token_embedding_type,
            pure=self.pure or flags.pure, leave_output_tensor=self.leave_output_tensor or flags.leave_output_tensor,
            allow_requantize=self.allow_requantize or flags.allow_requantize,
            kv_overrides=self.kv_overrides + flags.kv_overrides,
            include_weights=self.include_weights + flags.include_weights,
            exclude_weights=self.exclude_weights + flags.exclude_weights)

    # --- resolution -----------------------------------------------------------------------
    def all_rules(self) -> list[Rule]:
        """The overrides (llama-quantize flags), MTP role rules (in role order), then the recipe's
        rules: the override order (``[mtp] floor`` rules are added by the plan, after all of them)."""
        mtp = [Rule(MTP_ROLES[role], typ, f"mtp.{role}") for role, typ in self.mtp_roles]
        return list(self.overrides) + mtp + list(self.rules)

    def resolved_rules(self, mtp_blocks: int | Sequence[int] | None) -> list[Rule]:
        """The override rules for a model with these MTP blocks (one index, a list, or None), in
        order; rules needing a block the model lacks are left out (:meth:`Rule.resolve`)."""
        out = []
        for r in self.all_rules():
            rr = r.resolve(mtp_blocks)
            if rr is not None:
                out.append(rr)
        return out

    def rules_beyond(self, mtp_blocks: int | Sequence[int] | None) -> list[Rule]:
        """Rules whose ``{mtpN}`` names a block past the model's last, on a model that has some:
        the recipe was written for a longer chain (``plan`` warns about each)."""
        n = len(as_mtp_blocks(mtp_blocks))
        return [r for r in self.all_rules() if n and r.max_mtp_index() >= n]

    @property
    def release_tag(self) -> str:
        """The variant's tag in release names (``<Model>-<TAG>.gguf``): the declared ``tag``, else the ftype."""
        return self.tag or self.ftype

    @property
    def is_unquantized(self) -> bool:
        return self.ftype in UNQUANTIZED_FTYPES

    def to_dict(self) -> JsonObject:
        return {
            "name": self.name, "description": self.description, "ftype": self.ftype, "tag": self.release_tag,
            "output_type": self.output_type, "token_embedding_type": self.token_embedding_type,
            "imatrix": self.imatrix, "mtp": {"required": self.mtp_required, **dict(self.mtp_roles),
                                             **({"floor": self.mtp_floor} if self.mtp_floor else {})},
            "overrides": [{"pattern": r.pattern, "type": r.type} for r in self.overrides],
            "rules": [{"pattern": r.pattern, "type": r.type} for r in self.rules],
            "pure": self.pure, "leave_output_tensor": self.leave_output_tensor,
            "allow_requantize": self.allow_requantize,
            **{k: list(v) for k, v in (("override_kv", self.kv_overrides), ("include_weights", self.include_weights),
                                       ("exclude_weights", self.exclude_weights)) if v},
            "verify": dataclasses.asdict(self.verify), "path": self.path, "sha256": self.sha256,
        }

    def to_toml(self) -> str:
        """The recipe as a TOML document (what ``recipe from-flags`` writes)."""
        lines = [f"name = {_q(self.name)}", f"description = {_q(self.description)}", f"ftype = {_q(self.ftype)}"]
        if self.tag:
            lines.append(f"tag = {_q(self.tag)}")
        if self.output_type:
            lines.append(f"output_type = {_q(self.output_type)}")
        if self.token_embedding_type:
            lines.append(f"token_embedding_type = {_q(self.token_embedding_type)}")
        lines.append(f"imatrix = {_q(self.imatrix)}")
        lines += [f"{key} = true" for key in ("pure", "leave_output_tensor", "allow_requantize") if getattr(self, key)]
        lines += [f"{key} = [{', '.join(_q(v) for v in values)}]" for key, values in (
            ("override_kv", self.kv_overrides), ("include_weights", self.include_weights),
            ("exclude_weights", self.exclude_weights)) if values]
        lines += ["", "[mtp]", f"required = {str(self.mtp_required).lower()}"]
        lines += [f"{role} = {_q(t)}" for role, t in self.mtp_roles]
        if self.mtp_floor:
            lines.append(f"floor = {_q(self.mtp_floor)}")
        for r in self.overrides:
            lines += ["", "[[overrides]]", f"pattern = {_lit(r.pattern)}", f"type = {_q(r.type)}"]
        for r in self.rules:
            lines += ["", "[[rules]]", f"pattern = {_lit(r.pattern)}", f"type = {_q(r.type)}"]
        lines += ["", "[verify]", f"draft_n_max = {self.verify.draft_n_max}"]
        if self.verify.min_acceptance is not None:
            lines.append(f"min_acceptance = {self.verify.min_acceptance}")
        if self.verify.min_speedup is not None:
            lines.append(f"min_speedup = {self.verify.min_speedup}")
        if self.verify.head_margin is not None:
            lines.append(f"head_margin = {self.verify.head_margin}")
        return "\n".join(lines) + "\n"


def _with_mtp_placeholders(pattern: str, blocks: list[int]) -> str:
    """A llama-quantize pattern with the MTP block indices turned back into placeholders: the
    alternation of all of them (or the one block's ``blk.N.``) into ``{mtp}``, one of a chain into ``{mtpI}``."""
    if not blocks:
        return pattern
    pattern = pattern.replace(rf"blk\.{mtp_alternation(blocks)}\.", r"blk\.{mtp}\.")
    if len(blocks) > 1:
        for i, b in enumerate(blocks):
            pattern = pattern.replace(rf"blk\.{b}\.", rf"blk\.{{mtp{i}}}\.")
    return pattern


def _parse_rules(items: Any, where: str, key: str) -> tuple[Rule, ...]:
    """``[[rules]]`` or ``[[overrides]]``: each a pattern (placeholders allowed) and a type."""
    rules = []
    for i, r in enumerate(items):
        w = f"{where}: {key}[{i}]"
        if not isinstance(r, dict) or "pattern" not in r or "type" not in r:
            raise RecipeError(f"{w}: each rule needs 'pattern' and 'type'")
        validate_pattern(str(r["pattern"]), w)
        rules.append(Rule(str(r["pattern"]), normalize_type(r["type"], w), "flags" if key == "overrides" else "rules"))
    return tuple(rules)


def _flag(doc: Mapping[str, object], key: str, where: str) -> bool:
    v = doc.get(key, False)
    if not isinstance(v, bool):
        raise RecipeError(f"{where}: {key} must be true or false, not {v!r}")
    return v


def _type_recipe(name_or_path: str | Path) -> Recipe | None:
    """The recipe of a llama-quantize type name (``Q4_K_M``, ``Q4_K_M-plain``), unless a recipe file
    or a shipped recipe has that name; None when it names no type."""
    text = str(name_or_path)
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists() or (recipes_dir() / f"{text}.toml").is_file():
        return None
    plain = text.lower().endswith("-plain")
    base = text[: -len("-plain")] if plain else text
    if match_quant_option(base) is None:
        return None
    return Recipe.for_type(base, head_defaults=not plain)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _lit(s: str) -> str:
    return f"'{s}'" if "'" not in s else _q(s)


def recipes_dir() -> Path:
    """The shipped recipes. Their one home is the repository's top-level ``recipes/``; a wheel
    carries them as the package data ``ggufmtp/data/recipes/`` (``setup.py`` maps that package onto
    the folder: no copy), so an installed wheel finds them there, a checkout (an editable install, or
    the source on ``sys.path``) beside the package."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "data" / "recipes"
    return installed if any(installed.glob("*.toml")) else package.parent / "recipes"


def shipped_recipes() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.toml"))


def resolve_recipe_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.exists():
            raise RecipeError(f"{p}: no such recipe file")
        return p  # a directory, FIFO or device: Recipe.load says which
    shipped = recipes_dir() / f"{name_or_path}.toml"
    if shipped.is_file():
        return shipped
    raise RecipeError(f"{name_or_path}: no such recipe file, shipped recipe or llama-quantize type "
                      f"(shipped: {', '.join(shipped_recipes()) or 'none'}; types, with ggufmtp's head defaults "
                      f"or as <TYPE>-plain: {', '.join(valid_quant_types())})")


def _head_margin(x: Any, where: str) -> float | None:
    """A ``[verify] head_margin`` within ggufmtp's bound (RecipeError naming the recipe otherwise)."""
    if x is None:
        return None
    try:
        return check_margin(x, f"{where}: [verify] head_margin")
    except ValueError as e:
        raise RecipeError(str(e)) from None
