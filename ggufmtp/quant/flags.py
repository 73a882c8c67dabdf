"""llama-quantize's command line in ggufmtp: its per-tensor flags as recipe overrides.

``ggufmtp quantize`` and ``plan`` take llama-quantize's flags with its names and meaning
(``--tensor-type PATTERN=TYPE``, ``--output-tensor-type``, ``--token-embedding-type``, ``--pure``,
``--leave-output-tensor``, ``--allow-requantize``; ``--tensor-type-file``, ``--override-kv``,
``--include-weights``/``--exclude-weights``: :mod:`.kv`) and its positional ``IN [OUT] TYPE [NTHREADS]``;
``recipe from-flags`` turns a whole llama-quantize line into a recipe. All of them go through
:class:`QuantizeFlags` and :meth:`Recipe.with_flags <ggufmtp.quant.recipe.Recipe.with_flags>`: the
flags become the recipe's ``overrides`` (rules ahead of its ``[mtp]`` roles and rules, so they
win) and its ``output_type``/``token_embedding_type``/``pure``/``leave_output_tensor``/
``allow_requantize``, and the plan hands libllama exactly what llama-quantize would.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path

from ..errors import RecipeError
from .qtypes import match_quant_option, valid_quant_types
from .recipe import (
    QuantizeFlags,
    Recipe,
    Rule,
    _with_mtp_placeholders,
    as_mtp_blocks,
    normalize_ftype,
)

# boolean flags -> the Recipe / QuantizeFlags field they set
BOOL_FLAGS: dict[str, str] = {"--pure": "pure", "--leave-output-tensor": "leave_output_tensor",
                              "--allow-requantize": "allow_requantize"}
_VALUE_FLAGS = ("--output-tensor-type", "--token-embedding-type", "--imatrix", "--tensor-type-file")
# repeatable value flags -> QuantizeFlags.build's argument
_LIST_FLAGS: dict[str, str] = {"--tensor-type": "tensor_types", "--override-kv": "kv_overrides",
                               "--include-weights": "include_weights", "--exclude-weights": "exclude_weights"}
# llama-quantize's options ggufmtp does not take, and why (the CLI's refusals name these too:
# cli/options.py LLAMA_REFUSALS; docs/reference/flags.md)
QUANTIZE_REFUSALS: dict[str, str] = {
    "--keep-split": "llama-quantize's --keep-split is not taken: ggufmtp writes one file, or shards of "
                    "--split-max-size (give the first shard of a split input)",
    "--prune-layers": "llama-quantize's --prune-layers is not taken: pruning renumbers the blocks, the MTP block "
                      "included; prune with llama-quantize, then `ggufmtp inspect` and `audit` the result",
    "--max-buffer-size": "llama-quantize's --max-buffer-size is not taken: ggufmtp quantizes with libllama's "
                         "default buffer (8 GiB of rows)",
}
# ... and one that is a way of running, which a recipe does not hold
_NOT_A_RECIPE = {"--dry-run": "llama-quantize's --dry-run is a way of running, not a recipe: give it to "
                              "`ggufmtp quantize --dry-run -r RECIPE` (or run `ggufmtp plan`)"}


@dataclasses.dataclass(frozen=True)
class Positional:
    """llama-quantize's positional arguments ``IN [OUT] TYPE [NTHREADS]``; ``type`` is the
    QUANT_OPTIONS name (``Q4_K_M``, ``Q4_K``), as given."""

    model: str
    out: str | None = None
    type: str | None = None
    threads: int | None = None

    @classmethod
    def parse(cls, args: Sequence[str]) -> Positional:
        """As llama-quantize decides: the argument after IN is the type when it names one, else OUT
        (and the type must follow); then at most NTHREADS. RecipeError for anything else."""
        if not args:
            raise RecipeError("llama-quantize arguments: no input model (IN [OUT] TYPE [NTHREADS])")
        model, rest = args[0], list(args[1:])
        out = typ = None
        if rest and match_quant_option(rest[0]) is not None:
            typ = rest.pop(0)
        elif rest:
            out = rest.pop(0)
            if rest:
                typ = rest.pop(0)
                if match_quant_option(typ) is None:
                    raise RecipeError(f"{typ!r}: not a llama-quantize type (types: {', '.join(valid_quant_types())})")
        threads = None
        if rest:
            if not rest[0].lstrip("-").isdigit():
                raise RecipeError(f"{rest[0]!r}: not a thread count (IN [OUT] TYPE [NTHREADS])")
            threads = int(rest.pop(0))
        if rest:
            raise RecipeError(f"llama-quantize arguments: unexpected {' '.join(rest)!r} after NTHREADS")
        return cls(model, out, match_quant_option(typ) if typ else None, threads)


@dataclasses.dataclass(frozen=True)
class LlamaQuantizeLine:
    """A llama-quantize command line, read: its flags, ``--imatrix`` and positional arguments."""

    flags: QuantizeFlags
    imatrix: str | None
    positional: tuple[str, ...]

    @classmethod
    def parse(cls, argv: Sequence[str] | str) -> LlamaQuantizeLine:
        """Flags with llama-quantize's names and meaning, as ``ggufmtp quantize`` takes them (a leading
        ``llama-quantize`` program name is skipped; ``--tensor-type-file`` is read now, its items after
        the ``--tensor-type`` ones); RecipeError for a flag a recipe cannot hold (with why and what
        to do), an unknown one or a missing value."""
        args = shlex.split(argv) if isinstance(argv, str) else list(argv)
        if args and Path(args[0]).name.startswith("llama-quantize"):
            args = args[1:]
        values: dict[str, str] = {}
        lists: dict[str, list[str]] = {field: [] for field in _LIST_FLAGS.values()}
        bools: dict[str, bool] = {}
        positional: list[str] = []
        it = iter(args)
        for a in it:
            if a in _VALUE_FLAGS or a in _LIST_FLAGS:
                try:
                    val = next(it)
                except StopIteration:
                    raise RecipeError(f"llama-quantize flags: {a} needs a value") from None
                if a in _LIST_FLAGS:
                    lists[_LIST_FLAGS[a]].append(val)
                else:
                    values[a] = val
            elif a in BOOL_FLAGS:
                bools[BOOL_FLAGS[a]] = True
            elif a in QUANTIZE_REFUSALS or a in _NOT_A_RECIPE:
                raise RecipeError(f"llama-quantize flags: {a}: {QUANTIZE_REFUSALS.get(a) or _NOT_A_RECIPE[a]}")
            elif a.startswith("-") and not a.lstrip("-").isdigit():
                raise RecipeError(f"llama-quantize flags: unknown flag {a}")
            else:
                positional.append(a)
        flags = QuantizeFlags.build(lists.pop("tensor_types"), values.get("--output-tensor-type"),
                                    values.get("--token-embedding-type"), pure=bools.get("pure", False),
                                    leave_output_tensor=bools.get("leave_output_tensor", False),
                                    allow_requantize=bools.get("allow_requantize", False),
                                    tensor_type_file=values.get("--tensor-type-file"), **lists)
        return cls(flags, values.get("--imatrix"), tuple(positional))


def mtp_blocks_of(path: str | Path) -> list[int] | None:
    """The MTP blocks of a GGUF model (empty when it has none), or None when ``path`` is not a
    readable GGUF (``recipe from-flags`` with a line naming a model that is not here)."""
    from ..errors import GGUFReadError
    from ..gguf.model import GGUFModel, MTPStatus, check_mtp

    p = Path(path)
    if not p.is_file():
        return None
    try:
        mtp = check_mtp(GGUFModel(p))
    except (GGUFReadError, OSError):
        return None
    return list(mtp.blocks) if mtp.status in (MTPStatus.COMPLETE, MTPStatus.INCOMPLETE) else []


def recipe_from_flags(argv: list[str] | str, name: str = "from-flags",
                      mtp_block: int | Sequence[int] | None = None) -> Recipe:
    """A recipe equivalent to a llama-quantize command line (flags, with ``IN [OUT] TYPE
    [NTHREADS]`` or the type alone). With ``mtp_block``, ``blk.N.`` in patterns becomes ``{mtp}``;
    with several blocks (a list), ``blk.(N|M).`` becomes ``{mtp}`` and ``blk.M.`` ``{mtp1}``."""
    blocks = as_mtp_blocks(mtp_block)
    line = LlamaQuantizeLine.parse(argv)
    pos = line.positional
    typ = (match_quant_option(pos[0]) if len(pos) == 1 else Positional.parse(pos).type) if pos else None
    if typ is None:
        raise RecipeError("llama-quantize flags: no type given (e.g. Q4_K_M)")
    rules = tuple(Rule(_with_mtp_placeholders(r.pattern, blocks), r.type) for r in line.flags.tensor_types)
    flags = dataclasses.replace(line.flags, tensor_types=())
    base = Recipe(name=name, ftype=normalize_ftype(typ, "llama-quantize flags"), rules=rules,
                  imatrix="required" if line.imatrix else "recommended", mtp_required=bool(blocks),
                  description="made from llama-quantize flags")
    return base.with_flags(flags)
