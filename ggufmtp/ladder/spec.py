"""What a ladder makes: :class:`LadderSpec` (the model, the recipes, the shared settings), from the
command line or a ladder file, and :class:`VariantJob`, one variant's work as an engine ships it.

A ladder file is TOML::

    model = "Qwen/Qwen3.6-35B-A3B"        # REPO_ID[@REV], a GGUF, a safetensors folder, builtin:NAME
    recipes = ["q8_0-mtp", "hifi-q4_k_m-mtp", "iq4_xs-mtp"]
    imatrix_corpus = "builtin:calib-v1"   # or: imatrix = "imatrix.gguf"
    imatrix_chunks = 64
    threads = 8                            # quantization threads per variant
    split_max_size = "48G"                 # larger variants as shards <Model>-<TAG>-00001-of-0000N.gguf ("none": one file)
    quantized_by = "me"                    # the cards' quantized_by (default: ggufmtp)
    base_model = "Qwen/Qwen3.6-35B-A3B"    # the cards' base_model (default: what the source's receipt names)
    layout = "sidecar"                     # "full" (default): every variant with its head;
    sidecars = ["Q8_0"]                    # "sidecar": trunk-only variants + these MTP sidecars

    [verify]                               # as `ggufmtp run`: seeds, limit, max_tokens, gpu_layers
    seeds = [42, 1337, 2024]
    gpu_layers = 999

    [eval]                                 # KLD against the base model; leave out for none
    corpus = "builtin:calib-v1"
    chunks = 16

Command-line options override the file's values.
"""

from __future__ import annotations

import datetime
import enum
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from ..errors import GgufmtpError, LadderError, QualityError, TomlError, VerifyError
from ..files.fsutil import MAX_TEXT_FILE_BYTES, read_regular_file
from ..files.shape import fits, wanted
from ..files.tomlfile import loads_toml
from ..imatrix.corpus import check_later_inputs
from ..measure.core.options import JudgeOptions, ServerOptions, VerifyOptions
from ..quality.options import EvalOptions
from ..quant.hf_resolve import Planned, find_draft, release_problems, split_info
from ..quant.naming import ambiguous_tags, sidecar_file_name, tag_problem, variant_file_name, variant_folder
from ..quant.recipe import Recipe
from ..quant.split import DEFAULT_SPLIT_MAX_SIZE, NO_SPLIT, SplitSize, parse_split_size

# the model name the checks before any work use (the source's own name is known later): the repo's
# files are compared with the release only under the real name (a rerun replaces its own files)
_STAND_IN = "M"

__all__ = ["DEFAULT_SIDECARS", "Layout", "LadderFields", "LadderSpec", "VariantJob", "load_ladder_file"]

_FILE_KEYS = {"model", "recipes", "imatrix", "imatrix_corpus", "imatrix_chunks", "threads", "quantized_by", "verify",
              "eval", "layout", "sidecars", "split_max_size", "base_model"}


class Layout(enum.StrEnum):
    """What a ladder publishes per variant (docs/how-to/ladder.md, "Trunks and a sidecar")."""

    FULL = "full"  # DIR/<TAG>/<Model>-<TAG>.gguf: every variant with its own MTP head
    SIDECAR = "sidecar"  # the same names without the head (trunk-only), and DIR/mtp-<Model>-<TYPE>.gguf beside them


DEFAULT_SIDECARS = ("Q8_0",)  # the sidecar layout's MTP sidecars: recipes or llama-quantize types
_VERIFY_KEYS = {"seeds", "limit", "max_tokens", "gpu_layers", "threads", "ctx_size", "draft_n_max", "reference",
                "head_margin", "absolute_acceptance", "server_args", "mtp_server_args", "vanilla_server_args"}
_EVAL_KEYS = {"corpus", "chunks", "ctx_size", "gpu_layers", "threads"}


@dataclass(frozen=True)
class LadderSpec:
    """Every variant of ``model``, one per recipe, into ``out_dir`` (``out_dir/<tag>/``, the recipe's release tag)."""

    model: str
    recipes: tuple[str, ...]
    out_dir: Path
    imatrix: str | None = None
    imatrix_corpus: str | None = None
    imatrix_chunks: int | None = None
    threads: int = 0
    verify: bool = True
    verify_options: VerifyOptions = field(default_factory=VerifyOptions)
    eval_options: EvalOptions | None = None  # None: no eval
    signing_key: Path | None = None
    token: str | None = None
    reference_base: bool = True  # judge each head against the source model (RunOptions.reference_base)
    quantized_by: str = "ggufmtp"  # the cards' quantized_by (the ladder's and each variant's)
    base_model: str | None = None  # the cards' base_model, the upstream model (None: what the receipts name)
    repo_id: str | None = None  # the Hub repo the card's download and run lines name (ladder --upload REPO)
    layout: Layout = Layout.FULL
    sidecars: tuple[str, ...] = ()  # with layout sidecar: one MTP sidecar per recipe or type (none given: Q8_0)
    split_max_size: str = str(DEFAULT_SPLIT_MAX_SIZE)  # a larger variant is written as shards; "none": one file
    path_in_repo: str | None = None  # the repo folder --upload puts the files in (UploadOptions.path_in_repo)
    repo_files: tuple[str, ...] = ()  # the --upload repo's files, listed before any work: part of its final listing

    @property
    def split(self) -> SplitSize | None:
        return parse_split_size(self.split_max_size)

    def check(self) -> LadderSpec:
        """The spec with its recipes resolved; LadderError naming the first problem."""
        if not self.recipes:
            raise LadderError("a ladder needs at least one recipe (-r RECIPE, or recipes = [...] in the ladder file)")
        dup = sorted({r for r in self.recipes if self.recipes.count(r) > 1})
        if dup:
            raise LadderError(f"recipe {', '.join(dup)} given twice")
        if self.imatrix and self.imatrix_corpus:
            raise LadderError(f"give imatrix {self.imatrix} or imatrix_corpus {self.imatrix_corpus}, not both")
        # not each variant's failure after the shared stages: one error before any work
        check_later_inputs(self.imatrix, [self.imatrix_corpus, self.eval_options.corpus if self.eval_options else None])
        _split_size(self.split_max_size, "split_max_size")
        loaded = [Recipe.load(r) for r in self.recipes]  # RecipeError naming a bad one, before any work
        names = [r.name for r in loaded]
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise LadderError(f"recipes {', '.join(self.recipes)} name the variant {', '.join(clash)} twice")
        if self.base_model is not None:  # refused before any work, not when the card is written
            from ..provenance.card_page import check_base_model

            check_base_model(self.base_model)
        self._check_sidecars()
        self.check_names(_STAND_IN)  # the tags and the folder alone must tell the files apart
        return self

    def check_names(self, model: str) -> None:
        """LadderError unless every variant's Hub label names it alone, for llama.cpp's ``-hf`` and the
        Hub's parser (:func:`~ggufmtp.quant.naming.ambiguous_tags`), in the ladder's ``<TAG>/`` folders
        and as ``--upload`` commits them (flat, under ``path_in_repo``), with the model's release name
        ``model``, and unless ``-hf REPO:TAG --spec-type draft-mtp`` on each of those listings loads
        every variant with the draft it is verified with (:func:`~ggufmtp.quant.hf_resolve.release_problems`):
        a folder or model name holding another variant's type is refused here, before any work."""
        loaded = [Recipe.load(r) for r in self.recipes]
        folder = (self.path_in_repo or "").strip("/")
        at = f"{folder}/" if folder not in ("", ".") else ""
        # the ladder's folder (sidecars at its root), then the repo as --upload lays it out (flat)
        for root, layout in (("", lambda t: f"{variant_folder(t)}/"), (at, lambda t: at)):
            problems = ambiguous_tags([(r.release_tag, layout(r.release_tag) + variant_file_name(model, r.release_tag))
                                       for r in loaded])
            under = f" under --path-in-repo {folder}" if at else ""
            if problems:
                tags = ", ".join(f"{given} -> {r.release_tag}" for given, r in zip(self.recipes, loaded, strict=True))
                raise LadderError(f"the recipes' tags ({tags}) of model {model}{under} would not name distinct "
                                  f"variants for the Hub and llama.cpp's -hf REPO:TAG: {'; '.join(problems)}")
            served = release_problems(*self.planned_release(model, root, layout))
            if served:
                where = f"the repo {self.repo_id}" if self.repo_files and root == at else "the release"
                raise LadderError(f"in {where}, llama-server -hf REPO:TAG --spec-type draft-mtp would not serve the "
                                  f"variants of model {model}{under} as they are verified: {'; '.join(served)}")

    def planned_release(self, model: str, root: str, folder: Callable[[str], str]) -> tuple[list[str], list[Planned]]:
        """The model files of the release (each variant in ``folder(tag)``, the sidecars in ``root``)
        as a listing, and each variant as it is verified: with its own head, or (the sidecar layout)
        with the sidecar ``-hf REPO:TAG`` takes for its tag (:func:`pair_jobs` pairs it so)."""
        tags = [Recipe.load(r).release_tag for r in self.recipes]
        sidecar = Layout(self.layout) == Layout.SIDECAR
        sidecars = [root + sidecar_file_name(model, Recipe.load(s).release_tag)
                    for s in (self.sidecar_recipes if sidecar else ())]
        variants = [folder(t) + variant_file_name(model, t) for t in tags]
        listing = [*variants, *sidecars]
        if root == folder("") and model != _STAND_IN:  # as --upload lays it out: beside what the repo holds
            listing += _other_files(self.repo_files, listing)
        # a trunk has no head: it is verified with the sidecar the resolver picks (None: none reachable)
        return listing, [Planned(t, v, find_draft(sidecars, v, t) if sidecar else None)
                         for t, v in zip(tags, variants, strict=True)]

    def _check_sidecars(self) -> None:
        """The sidecar layout's sidecars: at least one, loadable, with distinct tags (their names)."""
        try:
            layout = Layout(self.layout)
        except ValueError:
            raise LadderError(f"layout {self.layout!r}: one of {', '.join(v.value for v in Layout)}") from None
        if layout != Layout.SIDECAR:
            if self.sidecars:
                raise LadderError(f"sidecars {', '.join(self.sidecars)}: a ladder makes MTP sidecars only in the "
                                  "sidecar layout (layout = \"sidecar\", --layout sidecar)")
            return
        tags = [Recipe.load(s).release_tag for s in self.sidecar_recipes]  # RecipeError naming a bad one
        twice = sorted({t for t in tags if tags.count(t) > 1})
        if twice:
            raise LadderError(f"sidecars {', '.join(self.sidecars)} name the sidecar {', '.join(twice)} twice")
        bad = next((p for t in tags if (p := tag_problem(t))), None)
        if bad:
            raise LadderError(f"sidecar: {bad}")

    @property
    def sidecar_recipes(self) -> tuple[str, ...]:
        """The recipes (or types) of the sidecar layout's sidecars: ``sidecars``, else :data:`DEFAULT_SIDECARS`."""
        return self.sidecars or DEFAULT_SIDECARS

    def sidecar_paths(self, model: str) -> list[Path]:
        """The sidecar layout's sidecars, ``DIR/mtp-<Model>-<TYPE>.gguf`` (``model``: the release name)."""
        if Layout(self.layout) != Layout.SIDECAR:
            return []
        return [self.out_dir / sidecar_file_name(model, Recipe.load(s).release_tag) for s in self.sidecar_recipes]

    def variant_dir(self, recipe: str) -> Path:
        return self.out_dir / variant_folder(Recipe.load(recipe).release_tag)


def _other_files(repo_files: Sequence[str], planned: Sequence[str]) -> list[str]:
    """The repo's files that are not a planned file in another form: before any work the ladder
    does not know whether a variant will be written whole or in shards (its size decides), so a
    file of the repo with a planned file's split prefix (the same variant, published whole or split
    before: a rerun of the same ``--upload``) is not counted as a second file for its tag. The
    upload checks the repo's real final listing again before it commits."""
    prefixes = {split_info(p).prefix for p in planned}
    return sorted(f for f in set(repo_files) - set(planned) if split_info(f).prefix not in prefixes)


@dataclass(frozen=True)
class VariantJob:
    """One variant's work as it travels to a worker (picklable values only: paths, strings, frozen options)."""

    recipe: str
    model: str
    out_dir: Path
    base_dir: Path
    imatrix: str | None
    threads: int
    verify: bool
    verify_options: VerifyOptions
    eval_options: EvalOptions | None
    signing_key: str | None
    token: str | None
    uses_gpu: bool
    reference_base: bool = True
    sidecar: Path | None = None  # layout sidecar: the MTP sidecar this variant's trunk is served and verified with
    source: Path | None = None  # layout sidecar: the local source model (the reference arm, eval's base)
    split: SplitSize | None = DEFAULT_SPLIT_MAX_SIZE  # a larger variant is written as shards (quant/split.py)
    quantized_by: str = "ggufmtp"  # its card's quantized_by (LadderSpec's)
    base_model: str | None = None  # its card's base_model (LadderSpec's)

    @classmethod
    def of(cls, spec: LadderSpec, recipe: str, imatrix: str | None, sidecar: Path | None = None,
           source: Path | None = None) -> VariantJob:
        ev = spec.eval_options
        gpu = bool(spec.verify_options.server.gpu_layers) or bool(ev is not None and ev.gpu_layers)
        return cls(recipe=recipe, model=spec.model, out_dir=spec.variant_dir(recipe), base_dir=spec.out_dir,
                   imatrix=imatrix, threads=spec.threads, verify=spec.verify, verify_options=spec.verify_options,
                   eval_options=ev, signing_key=str(spec.signing_key) if spec.signing_key else None,
                   token=spec.token, uses_gpu=gpu, reference_base=spec.reference_base, sidecar=sidecar,
                   source=source, split=spec.split, quantized_by=spec.quantized_by, base_model=spec.base_model)

    @property
    def build_dir(self) -> Path:
        """Where ``ggufmtp run`` makes the variant: its folder, or, for a trunk, the full variant's
        (``DIR/.full/<TAG>/``, not published) that the trunk is cut from."""
        return self.out_dir if self.sidecar is None else self.base_dir / FULL_DIR / self.out_dir.name


FULL_DIR = ".full"  # layout sidecar: DIR/.full/<TAG>/, the full variants the trunks are cut from


class LadderFields(TypedDict, total=False):
    """What a ladder file sets, as :class:`LadderSpec` fields (:func:`load_ladder_file`)."""

    model: str
    recipes: tuple[str, ...]
    imatrix: str
    imatrix_corpus: str
    imatrix_chunks: int
    threads: int
    verify_options: VerifyOptions
    eval_options: EvalOptions
    quantized_by: str
    base_model: str
    layout: Layout
    sidecars: tuple[str, ...]
    split_max_size: str


def _split_size(value: str, where: str) -> str:
    """A split size as a ladder file spells it (``48G``, ``none``); LadderError naming ``where``."""
    try:
        size = parse_split_size(value)
    except GgufmtpError as e:
        raise LadderError(f"{where}: {e}") from None
    return str(size) if size else NO_SPLIT


def _table(data: dict[str, Any], key: str, allowed: set[str], path: Path) -> dict[str, Any] | None:
    t = data.get(key)
    if t is None:
        return None
    if not isinstance(t, dict):
        raise LadderError(f"{path}: [{key}] must be a table")
    bad = sorted(set(t) - allowed)
    if bad:
        raise LadderError(f"{path}: [{key}] has unknown keys {', '.join(bad)} (known: {', '.join(sorted(allowed))})")
    return dict(t)


# The type each top-level key must have (TOML gives bool for int's subclass, dates, tables, arrays).
_FILE_TYPES: dict[str, object] = {"model": str, "recipes": list[str], "imatrix": str, "imatrix_corpus": str,
                               "imatrix_chunks": int, "threads": int, "quantized_by": str, "base_model": str, "layout": str,
                               "sidecars": list[str], "split_max_size": str}
_TOML_NAMES = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"), (list, "an array"),
               (dict, "a table"), (datetime.datetime, "a date-time"), (datetime.date, "a date"),
               (datetime.time, "a time"))


def _toml_kind(value: Any) -> str:
    return next((name for t, name in _TOML_NAMES if isinstance(value, t)), type(value).__name__)


def _check_types(table: Mapping[str, object], hints: Mapping[str, object], where: str) -> None:
    """LadderError naming ``where`` and the first key whose value does not have its type."""
    for key, value in table.items():
        hint = hints.get(key)
        if hint is not None and not fits(value, hint):
            raise LadderError(f"{where}{key} must be {wanted(hint)}, not {_toml_kind(value)} ({str(value)[:60]})")


def _option_hints(*classes: type) -> dict[str, object]:
    out: dict[str, object] = {}
    for cls in classes:
        out.update(typing.get_type_hints(cls))
    return out


def load_ladder_file(path: str | Path) -> LadderFields:
    """The ladder file's settings as :class:`LadderSpec` fields, its ``[verify]`` and ``[eval]``
    tables as :class:`~ggufmtp.measure.core.options.VerifyOptions` and
    :class:`~ggufmtp.quality.options.EvalOptions` (LadderError naming the file and the problem)."""
    p = Path(path)
    try:
        data: Any = loads_toml(read_regular_file(p, MAX_TEXT_FILE_BYTES))  # its values: _check_types below
    except OSError as e:
        raise LadderError(f"{p}: cannot read the ladder file ({e.strerror})") from None
    except TomlError as e:
        raise LadderError(f"{p}: not a TOML ladder file ({e})") from None
    bad = sorted(set(data) - _FILE_KEYS)
    if bad:
        raise LadderError(f"{p}: unknown keys {', '.join(bad)} (known: {', '.join(sorted(_FILE_KEYS))})")
    _check_types(data, _FILE_TYPES, f"{p}: ")
    out = LadderFields(recipes=tuple(data.get("recipes", [])))
    if "layout" in data:
        try:
            out["layout"] = Layout(data["layout"])
        except ValueError:
            raise LadderError(f"{p}: layout must be one of {', '.join(repr(v.value) for v in Layout)}, not "
                              f"{data['layout']!r}") from None
    if "sidecars" in data:
        out["sidecars"] = tuple(data["sidecars"])
    if "split_max_size" in data:
        out["split_max_size"] = _split_size(data["split_max_size"], f"{p}: split_max_size")
    for k in ("model", "imatrix", "imatrix_corpus", "imatrix_chunks", "threads", "quantized_by", "base_model"):
        if data.get(k) is not None:
            out[k] = data[k]
    verify, ev, table = _table(data, "verify", _VERIFY_KEYS, p), _table(data, "eval", _EVAL_KEYS, p), "verify"
    if verify is not None:
        _check_types(verify, _option_hints(ServerOptions, JudgeOptions, VerifyOptions), f"{p}: [verify] ")
    if ev is not None:
        _check_types(ev, _option_hints(EvalOptions), f"{p}: [eval] ")
    try:
        if verify is not None:
            out["verify_options"] = VerifyOptions.from_dict(verify)
        table = "eval"
        if ev is not None:
            out["eval_options"] = EvalOptions(**ev)
    except (VerifyError, QualityError, TypeError, ValueError) as e:
        raise LadderError(f"{p}: [{table}] {e}") from None
    return out
