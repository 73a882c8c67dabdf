"""The command line's shared vocabulary: every option that several commands take, defined once.

A name means one thing in every command that has it, llama.cpp's meaning where llama.cpp has the
name (``-ngl/--n-gpu-layers/--gpu-layers``, ``-c/--ctx-size``, ``-t/--threads``,
``--spec-draft-n-max``), huggingface_hub's where it has it (``--revision``, ``--include``,
``--exclude``, ``--token``), and ``-o/--output`` is always the path of the command's main product.
:data:`VOCABULARY` is the table (the docs' ``reference/flags.md`` and ``tests/test_flag_vocabulary.py``
read it); each ``*_option`` below makes the one option of a row. ``-t/--threads`` is llama.cpp's:
the CPU threads of the llama.cpp program that runs the model (llama-server, llama-perplexity,
llama-imatrix); quantization threads (llama-quantize's NTHREADS) are ``--quantize-threads``.

An old spelling that users may depend on stays accepted as a hidden alias (:class:`SharedOption`'s
``hidden``): ``verify --out`` is ``-o/--output``; ``quantize -t`` and ``sidecar -t`` are their
``--quantize-threads`` (those commands run no model, so nothing else could be meant); ``plan
--out`` is ``--emit-output``, ``train --threads`` is ``--torch-threads``; each is listed in
:data:`LEGACY_ALIASES`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ..quant.flags import QUANTIZE_REFUSALS

__all__ = ["LEGACY_ALIASES", "LLAMA_SPELLINGS", "VOCABULARY", "GpuLayers", "LlamaCommand", "LlamaGroup", "SharedName",
           "SharedOption", "FiniteFloatRange", "ctx_size_option",
           "draft_n_max_option", "exclude_option", "gpu_layers_option", "include_option", "output_option",
           "model_at_revision", "NonEmptyPath", "quantize_threads_option",
           "refuse_empty_model", "revision_option", "split_max_size_option", "threads_option",
           "token_option", "with_revision"]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class SharedName:
    """One row of the vocabulary: the spellings, the parameter they fill, its kind, the words its
    help starts with in every command, and whose name it is."""

    names: tuple[str, ...]
    dest: str
    kind: str  # "integer", "text", "path", "gpu layers", "text (repeatable)"
    stem: str
    origin: str


VOCABULARY: tuple[SharedName, ...] = (
    SharedName(("-ngl", "--n-gpu-layers", "--gpu-layers"), "gpu_layers", "gpu layers",
               "Layers offloaded to the GPU (llama.cpp's -ngl: N, auto or all)", "llama.cpp"),
    SharedName(("-t", "--threads"), "threads", "integer",
               "CPU threads of the llama.cpp program that runs the model (llama.cpp's -t)", "llama.cpp"),
    SharedName(("--quantize-threads",), "quantize_threads", "integer",
               "Quantization threads (llama-quantize's NTHREADS; 0: all cores)", "llama-quantize"),
    SharedName(("-c", "--ctx-size"), "ctx_size", "integer", "Context size in tokens (llama.cpp's -c)", "llama.cpp"),
    SharedName(("--draft-n-max", "--spec-draft-n-max"), "draft_n_max", "integer",
               "Draft window k: tokens drafted per step (llama-server's --spec-draft-n-max)", "llama.cpp"),
    SharedName(("-o", "--output"), "output", "path", "Output path: ", "ggufmtp"),
    SharedName(("--split-max-size",), "split_max_size", "size",
               "Largest file to write (llama-gguf-split's --split-max-size: 48G, 500M, decimal; none: one file); "
               "a larger model is written as shards NAME-00001-of-0000N.gguf", "llama-gguf-split"),
    SharedName(("--revision",), "revision", "text", "Hub revision (branch, tag or commit)", "huggingface_hub"),
    SharedName(("--include",), "include", "text (repeatable)",
               "Only the repo files matching this glob pattern (repeatable; huggingface_hub's allow_patterns)",
               "huggingface_hub"),
    SharedName(("--exclude",), "exclude", "text (repeatable)",
               "Leave out the repo files matching this glob pattern (repeatable; huggingface_hub's ignore_patterns)",
               "huggingface_hub"),
    SharedName(("--token",), "token", "text",
               "Hub token (default: $HF_TOKEN or `hf auth login`; a command line is visible to other users: "
               "prefer HF_TOKEN)", "huggingface_hub"),
)

# (command path, old spelling) -> the spelling it is a hidden alias of (every hidden spelling is here).
LEGACY_ALIASES: dict[tuple[str, str], str] = {
    ("verify", "--out"): "--output", ("tune", "--out"): "--output", ("curve", "--out"): "--output",
    ("profiles", "--out"): "--output",
    ("quantize", "-t"): "--quantize-threads", ("quantize", "--threads"): "--quantize-threads",
    ("sidecar", "-t"): "--quantize-threads", ("sidecar", "--threads"): "--quantize-threads",
    ("plan", "--out"): "--emit-output",  # the OUT of the llama-quantize line plan prints, not plan's output
    ("train", "--threads"): "--torch-threads",  # PyTorch's threads: train runs no llama.cpp program
}


def _row(name: str) -> SharedName:
    return next(r for r in VOCABULARY if name in r.names)


class SharedOption(click.Option):
    """A click option whose ``hidden`` spellings are accepted but not shown (in ``--help`` and the
    docs): an old name kept for the command lines that use it."""

    def __init__(self, param_decls: Sequence[str], *, hidden: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(list(param_decls), **kwargs)
        self.hidden_opts = tuple(hidden)

    @property
    def shown_opts(self) -> list[str]:
        return [o for o in self.opts if o not in self.hidden_opts]

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        opts = self.opts
        self.opts = self.shown_opts
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts


def _shared(name: str, detail: str = "", *, hidden: Sequence[str] = (), extra: Sequence[str] = (),
            **kwargs: Any) -> Decorator:
    """The option of vocabulary row ``name``: its spellings (then ``extra``, then the ``hidden``
    old ones), its dest, and help text starting with the row's stem (then ``detail``)."""
    row = _row(name)
    stem = row.stem if row.stem.endswith(" ") or not detail else row.stem + ". "
    return click.option(*row.names, *extra, *hidden, row.dest, cls=SharedOption, hidden=tuple(hidden),
                        help=(stem + detail).strip(), **kwargs)


class NonEmptyPath(click.Path):
    """click.Path that refuses ``""`` (``-o "$OUT"`` of an unset variable): click.Path takes it, and
    it is the current folder to every reader (``run -o ""`` filled it with the run's files,
    ``audit ""`` was a ValueError traceback). :class:`LlamaCommand` gives every path option this type."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("'': an empty path", param, ctx)
        return super().convert(value, param, ctx)


class GpuLayers(click.ParamType):
    """llama.cpp's ``-ngl`` value: a number of layers (0 or more), ``auto`` or ``all``."""

    name = "gpu layers"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if value in ("auto", "all"):
            return value
        try:
            n = int(value)
        except ValueError:
            n = -1
        if n < 0:  # llama.cpp reads -1 as auto: a negative count is never a number of layers
            self.fail(f"{value!r}: a number of layers, auto or all", param, ctx)
        return n


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange that also refuses ``nan`` and ``inf`` (``1e999``): click's bounds pass
    ``nan`` (every comparison with it is false), and no threshold, margin or scale means either."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


def gpu_layers_option(detail: str = "") -> Decorator:
    return _shared("--gpu-layers", detail, type=GpuLayers(), default=None, metavar="N")


def threads_option(detail: str = "") -> Decorator:
    return _shared("--threads", detail or "Default: llama.cpp's.", type=click.IntRange(min=1), default=None)


def quantize_threads_option(detail: str = "", *, hidden: Sequence[str] = (), default: int | None = 0) -> Decorator:
    return _shared("--quantize-threads", detail, hidden=hidden, type=click.IntRange(min=0), default=default,
                   show_default=default is not None)


def ctx_size_option(detail: str = "", *, default: int | None, min_ctx: int = 256) -> Decorator:
    return _shared("--ctx-size", detail, type=click.IntRange(min=min_ctx), default=default,
                   show_default=default is not None)


def draft_n_max_option(detail: str = "", *, default: int | None = None) -> Decorator:
    return _shared("--draft-n-max", detail, type=click.IntRange(min=1), default=default,
                   show_default=default is not None)


def output_option(detail: str, *, directory: bool = False, default: str | None = None, required: bool = False,
                  extra: Sequence[str] = (), hidden: Sequence[str] = ()) -> Decorator:
    """``-o/--output``, the path of the command's main product: a file, or with ``directory`` a folder."""
    return _shared("--output", detail, extra=extra, hidden=hidden, default=default, required=required,
                   show_default=default is not None,
                   type=click.Path(file_okay=False) if directory else click.Path(dir_okay=False))


class SplitSizeParam(click.ParamType):
    """``--split-max-size``: a :class:`~ggufmtp.quant.split.SplitSize` (``48G``, ``500M``) or None
    for ``none``; ``as_text``: the value checked and spelled as a ladder file spells it (``48G``, ``none``)."""

    name = "size"

    def __init__(self, as_text: bool = False) -> None:
        self.as_text = as_text

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from ..errors import QuantizeError
        from ..quant.split import NO_SPLIT, parse_split_size

        try:
            size = parse_split_size(value)
        except QuantizeError as e:
            self.fail(str(e), param, ctx)
        return (str(size) if size else NO_SPLIT) if self.as_text else size


def split_max_size_option(detail: str = "", *, from_file: bool = False) -> Decorator:
    """``--split-max-size``; ``from_file``: its default is a ladder file's (the option gives text, None when not given)."""
    from ..quant.split import DEFAULT_SPLIT_MAX_SIZE

    if from_file:
        return _shared("--split-max-size", detail, type=SplitSizeParam(as_text=True), default=None)
    return _shared("--split-max-size", detail, type=SplitSizeParam(), default=str(DEFAULT_SPLIT_MAX_SIZE),
                   show_default=True)


def revision_option(detail: str = "") -> Decorator:
    return _shared("--revision", detail, default=None, metavar="REVISION")


def include_option(detail: str = "") -> Decorator:
    return _shared("--include", detail, multiple=True, metavar="PATTERN")


def exclude_option(detail: str = "") -> Decorator:
    return _shared("--exclude", detail, multiple=True, metavar="PATTERN")


def token_option(detail: str = "") -> Decorator:
    return _shared("--token", detail, default=None, metavar="TOKEN")


def refuse_empty_model(model: str, what: str = "MODEL") -> str:
    """``model`` unless it is empty (``"$MODEL"`` of an unset variable): Path("") is the current
    folder, which every reader of it then reported as "." (a directory, no such GGUF)."""
    if not model.strip():
        raise click.BadParameter("'': an empty value", param_hint=what)
    return model


def with_revision(model: str, revision: str | None) -> tuple[str, str | None]:
    """``(MODEL, REVISION)`` of a model reference and ``--revision``: huggingface_hub's
    ``--revision`` and the ``REPO@REV`` form mean the same; given both, they must agree (a
    click.UsageError otherwise). ``--revision`` with a local path or ``builtin:`` is refused."""
    if Path(refuse_empty_model(model)).exists() or model.startswith("builtin:"):
        if revision is not None:
            raise click.UsageError(f"--revision {revision}: {model} is not a Hub repo (a revision names a Hub commit)")
        return model, None
    repo, at, rev = model.partition("@")
    if ":" in repo:  # llama.cpp's -hf REPO:QUANT picks a GGUF of a quantized repo; ggufmtp makes that file
        raise click.UsageError(f"{model}: REPO:QUANT names a file of a quantized repo (llama.cpp's -hf); ggufmtp "
                               f"starts from the source model: give -hf REPO (or -m REPO), and -r {repo.partition(':')[2]}"
                               f" for the type")
    if at and revision is not None and rev != revision:
        raise click.UsageError(f"two revisions: {model} and --revision {revision}; give one")
    return repo, (revision or rev or None)


def model_at_revision(model: str, revision: str | None) -> str:
    """``MODEL`` with ``--revision`` folded in, as ``REPO@REV`` (:func:`with_revision`)."""
    ident, rev = with_revision(model, revision)
    return f"{ident}@{rev}" if rev else ident


# ------------------------------------------------------------------------------------------------
# llama.cpp's spellings: one table, attached to every command by :class:`LlamaCommand`
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaSpelling:
    """llama.cpp's names of a concept (``-n, --n-predict``) and the ggufmtp options that are that
    concept (``--max-tokens``): a command with exactly one of them takes llama.cpp's names too."""

    names: tuple[str, ...]
    targets: tuple[str, ...]
    meaning: str
    only: tuple[str, ...] = ()  # these commands only (by name); empty: every command with a target


LLAMA_SPELLINGS: tuple[LlamaSpelling, ...] = (
    LlamaSpelling(("-md", "--model-draft", "--spec-draft-model"), ("--sidecar",),
                  "the draft model: ggufmtp's MTP-only sidecar"),
    LlamaSpelling(("-hf", "--hf-repo"), ("--model",), "a Hub repo REPO_ID[@REVISION] to pull the model from",
                  only=("run", "ladder")),  # the commands whose --model takes a Hub repo
    LlamaSpelling(("-f", "--file"), ("--corpus", "--suite"), "the text file: a corpus, or a prompt suite"),
    LlamaSpelling(("-n", "--n-predict"), ("--max-tokens",), "tokens to generate per reply"),
    LlamaSpelling(("-s", "--seed"), ("--seeds", "--seed"), "the RNG seed (verify: the request seeds, comma-separated)"),
)

# (spelling) -> why a command without it refuses it, where llama.cpp's meaning has no place here
LLAMA_REFUSALS: dict[str, str] = {
    "-hf": "this command takes a local model file or builtin:NAME; `ggufmtp pull REPO` fetches one; "
           "run and ladder take -hf REPO themselves",
    "-md": "only verify (and audit, as --sidecar) take a draft model: ggufmtp's MTP-only sidecar",
    "-f": "this command reads no text file, or more than one: give --corpus or --suite",
    # llama-quantize's options that ggufmtp's quantize does not take (docs/reference/flags.md says why)
    **QUANTIZE_REFUSALS,
}
# (command, option) -> the options one of which must be given for it to mean anything: given alone it
# did nothing, silently ("With --workers: ..." in its help); now a usage error, "--gpus goes with --workers"
_UPLOAD_ONLY = ("private", "dry_run_upload")
NEEDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("run", "imatrix_chunks"): ("imatrix_corpus",),
    **{("run", d): ("upload_repo",) for d in _UPLOAD_ONLY},
    ("ladder", "imatrix_chunks"): ("imatrix_corpus", "ladder_file"),  # a ladder file may name the corpus
    ("ladder", "gpus"): ("workers",),
    **{("ladder", d): ("upload_repo",) for d in (*_UPLOAD_ONLY, "upload_revision", "create_pr", "commit_message",
                                                 "path_in_repo", "passing_only", "commit_max_bytes")},
    ("audit", "all_tensors"): ("source",),
    ("search", "acceptance_groups"): ("acceptance",),
    ("search", "prove_head"): ("prove",),
    ("verify", "budget"): ("tune",),
    ("verify", "concurrency"): ("tune",),
}


def _refuse_alone(cmd: click.Command, ctx: click.Context) -> None:
    """A usage error for an option of :data:`NEEDS` given without any option it goes with."""
    given = {p.name: p for p in cmd.params if p.name and ctx.get_parameter_source(p.name) not in
             (None, click.core.ParameterSource.DEFAULT)}
    for (name, dest), needs in NEEDS.items():
        if name == cmd.name and dest in given and not any(n in given for n in needs):
            flags = {p.name: _spelled(p) for p in cmd.params}
            raise click.UsageError(f"{flags[dest]} goes with {' or '.join(flags[n] for n in needs)}", ctx)


def _spelled(p: click.Parameter) -> str:
    """The option's long name as its help shows it (``--prove-head/--no-prove-head`` for a switch)."""
    opts = getattr(p, "shown_opts", None) or p.opts
    name = next((o for o in opts if o.startswith("--")), opts[0])
    return "/".join([name, *p.secondary_opts])


# a positional argument llama.cpp's -m/--model names (the model file)
MODEL_ARGUMENTS = ("model", "artifact")
MODEL_SPELLINGS = ("-m", "--model")


def _attach_llama_spellings(cmd: click.Command) -> None:
    """Give each option of ``cmd`` that is the concept of a :data:`LLAMA_SPELLINGS` row that row's
    names (those the command does not already use), shown first in ``--help``."""
    taken = {s for p in cmd.params if isinstance(p, click.Option) for s in (*p.opts, *p.secondary_opts)}
    by_name = {s: p for p in cmd.params if isinstance(p, click.Option) for s in p.opts}
    for row in LLAMA_SPELLINGS:
        if row.only and cmd.name not in row.only:
            continue
        targets = [by_name[t] for t in row.targets if t in by_name]
        if len({id(t) for t in targets}) != 1:
            continue  # none, or ambiguous (search has --corpus and --suite): the spelling stays unknown here
        new = [n for n in row.names if n not in taken]
        targets[0].opts = [*new, *targets[0].opts]
        taken.update(new)


def _looks_like_flag(token: str) -> bool:
    if len(token) < 2 or not token.startswith("-"):
        return False
    try:
        float(token)  # a negative number is a value
    except ValueError:
        return True
    return False


class LlamaCommand(click.Command):
    """A command that reads llama.cpp's spellings as llama.cpp does: a multi-letter short flag
    (``-md``, ``-hf``, ``-ngl``) is one whole name, never click's ``-m -d``; ``-m/--model MODEL``
    is the command's MODEL argument; an unknown flag is reported exactly as typed, with the nearest
    names (or why llama.cpp's name has no place here). The llama.cpp names of a concept come from
    :data:`LLAMA_SPELLINGS`, attached when the command is made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _attach_llama_spellings(self)
        for p in self.params:  # every path of every command: one reading, whoever declared the option
            if type(p.type) is click.Path:
                p.type.__class__ = NonEmptyPath

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not ctx.ignore_unknown_options:  # recipe from-flags: a llama-quantize line, read as such
            args = self._normalize(ctx, args)
        rest = super().parse_args(ctx, args)
        if not ctx.resilient_parsing:
            _refuse_alone(self, ctx)
        return rest

    def _model_argument(self) -> click.Argument | None:
        first = next((p for p in self.params if isinstance(p, click.Argument)), None)
        return first if first is not None and first.name in MODEL_ARGUMENTS else None

    def _normalize(self, ctx: click.Context, args: list[str]) -> list[str]:
        """``args`` with ``-m/--model X`` moved to the front as MODEL; every flag checked whole; a
        negative number given as an argument (llama-quantize's NTHREADS ``-1``), which click's parser
        would read as the flag ``-1``, passed with the arguments after ``--``, in their order."""
        options = {s: p for p in self.get_params(ctx) if isinstance(p, click.Option)
                   for s in (*p.opts, *p.secondary_opts)}
        model, out, flags, positional, i = [], [], [], [], 0
        while i < len(args):
            token = args[i]
            if token == "--":
                out.extend(args[i:])
                positional.extend(args[i + 1:])
                break
            if not _looks_like_flag(token):
                out.append(token)
                positional.append(token)
                i += 1
                continue
            name, eq, value = token.partition("=")
            opt = options.get(name)
            if opt is None and name in MODEL_SPELLINGS and self._model_argument() is not None:
                model.append(value if eq else (args[i + 1] if i + 1 < len(args) else ""))
                i += 1 if eq else 2
                continue
            if opt is None:
                raise _no_such_option(ctx, token, name, options)
            takes = 0 if eq or opt.is_flag or opt.count else opt.nargs
            if takes and getattr(opt, "_flag_needs_value", False) and i + 1 < len(args) and \
                    _looks_like_flag(args[i + 1]):
                takes = 0  # an option with an optional value (--eval), given none
            out.extend(args[i:i + 1 + takes])
            flags.extend(args[i:i + 1 + takes])
            i += 1 + takes
        if any(t.startswith("-") for t in positional):
            return [*model, *flags, "--", *positional]
        return model + out


def _no_such_option(ctx: click.Context, token: str, name: str, options: dict[str, click.Option]) -> click.UsageError:
    """The error for an unknown flag: named as typed, with the nearest names or llama.cpp's reason."""
    import difflib

    refusal = next((why for s, why in LLAMA_REFUSALS.items()
                    if name in next((r.names for r in LLAMA_SPELLINGS if s in r.names), (s,))), None)
    if refusal:
        return click.UsageError(f"No such option '{token}': {refusal}.", ctx)
    near = difflib.get_close_matches(name, list(options), n=3, cutoff=0.5)
    return click.NoSuchOption(token, possibilities=near, ctx=ctx)


class LlamaGroup(click.Group):
    """A group whose commands (and sub-groups' commands) are :class:`LlamaCommand`."""

    command_class = LlamaCommand


LlamaGroup.group_class = LlamaGroup  # a sub-group's sub-groups too
