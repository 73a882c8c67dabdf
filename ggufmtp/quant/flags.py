"""llama-quantize's command line in ggufmtp: its per-tensor flags as recipe overrides.

``ggufmtp quantize`` and ``plan`` take llama-quantize's flags with its names and meaning
(``--tensor-type PATTERN=TYPE``, ``--output-tensor-type``, ``--token-embedding-type``, ``--pure``,
``--leave-output-tensor``, ``--allow-requantize``) and its positional ``IN [OUT] TYPE [NTHREADS]``;
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
from .recipe import Rule, normalize_type, validate_pattern

# boolean flags -> the Recipe / QuantizeFlags field they set
BOOL_FLAGS: dict[str, str] = {"--pure": "pure", "--leave-output-tensor": "leave_output_tensor",
                              "--allow-requantize": "allow_requantize"}
_VALUE_FLAGS = ("--output-tensor-type", "--token-embedding-type", "--tensor-type", "--imatrix")
_NO_EQUIVALENT = ("--keep-split", "--dry-run", "--tensor-type-file", "--include-weights", "--exclude-weights",
                  "--prune-layers", "--override-kv", "--max-buffer-size")


@dataclasses.dataclass(frozen=True)
class QuantizeFlags:
    """llama-quantize's per-tensor flags, as it means them; :meth:`Recipe.with_flags` applies them."""

    tensor_types: tuple[Rule, ...] = ()  # --tensor-type, in order (first match wins), source "flags"
    output_type: str | None = None  # --output-tensor-type
    token_embedding_type: str | None = None  # --token-embedding-type
    pure: bool = False  # --pure
    leave_output_tensor: bool = False  # --leave-output-tensor
    allow_requantize: bool = False  # --allow-requantize

    @classmethod
    def build(cls, tensor_types: Sequence[str] = (), output_type: str | None = None,
              token_embedding_type: str | None = None, *, pure: bool = False, leave_output_tensor: bool = False,
              allow_requantize: bool = False) -> QuantizeFlags:
        """The flags from their command-line values (``--tensor-type`` as ``PATTERN=TYPE`` strings);
        RecipeError naming a malformed one."""
        return cls(tensor_types=tuple(tensor_type_rule(v) for v in tensor_types),
                   output_type=normalize_type(output_type, "--output-tensor-type") if output_type else None,
                   token_embedding_type=(normalize_type(token_embedding_type, "--token-embedding-type")
                                         if token_embedding_type else None),
                   pure=pure, leave_output_tensor=leave_output_tensor, allow_requantize=allow_requantize)

    @property
    def given(self) -> bool:
        return self != QuantizeFlags()


def tensor_type_rule(value: str) -> Rule:
    """``--tensor-type PATTERN=TYPE`` as llama-quantize reads it (the pattern lower-cased, searched
    unanchored in each tensor name; the type case-insensitive)."""
    pat, sep, typ = value.partition("=")
    if not sep or not pat or not typ:
        raise RecipeError(f"--tensor-type: malformed {value!r} (want PATTERN=TYPE, e.g. 'blk\\.40\\.nextn\\.eh_proj=q8_0')")
    validate_pattern(pat.lower(), f"--tensor-type {value!r}")
    return Rule(pat.lower(), normalize_type(typ, f"--tensor-type {value!r}"), "flags")


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
        """Flags with llama-quantize's names (a leading ``llama-quantize`` program name is skipped);
        RecipeError for a flag that has no equivalent, an unknown one or a missing value."""
        args = shlex.split(argv) if isinstance(argv, str) else list(argv)
        if args and Path(args[0]).name.startswith("llama-quantize"):
            args = args[1:]
        values: dict[str, str] = {}
        tensor_types: list[str] = []
        bools: dict[str, bool] = {}
        positional: list[str] = []
        it = iter(args)
        for a in it:
            if a in _VALUE_FLAGS:
                try:
                    val = next(it)
                except StopIteration:
                    raise RecipeError(f"llama-quantize flags: {a} needs a value") from None
                if a == "--tensor-type":
                    tensor_types.append(val)
                else:
                    values[a] = val
            elif a in BOOL_FLAGS:
                bools[BOOL_FLAGS[a]] = True
            elif a in _NO_EQUIVALENT:
                raise RecipeError(f"llama-quantize flags: {a} has no recipe equivalent")
            elif a.startswith("-") and not a.lstrip("-").isdigit():
                raise RecipeError(f"llama-quantize flags: unknown flag {a}")
            else:
                positional.append(a)
        flags = QuantizeFlags.build(tensor_types, values.get("--output-tensor-type"),
                                    values.get("--token-embedding-type"), **bools)
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
