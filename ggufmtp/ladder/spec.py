"""What a ladder makes: :class:`LadderSpec` (the model, the recipes, the shared settings), from the
command line or a ladder file, and :class:`VariantJob`, one variant's work as an engine ships it.

A ladder file is TOML::

    model = "Qwen/Qwen3.6-35B-A3B"        # REPO_ID[@REV], a GGUF, a safetensors folder, builtin:NAME
    recipes = ["q8_0-mtp", "hifi-q4_k_m-mtp", "iq4_xs-mtp"]
    imatrix_corpus = "builtin:calib-v1"   # or: imatrix = "imatrix.gguf"
    imatrix_chunks = 64
    threads = 8                            # quantization threads per variant

    [verify]                               # as `ggufmtp run`: seeds, limit, max_tokens, gpu_layers
    seeds = [42, 1337, 2024]
    gpu_layers = 999

    [eval]                                 # KLD against the base model; leave out for none
    corpus = "builtin:calib-v1"
    chunks = 16

Command-line options override the file's values.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from ..errors import LadderError, QualityError, VerifyError
from ..measure.core.options import VerifyOptions
from ..quality.options import EvalOptions
from ..quant.recipe import Recipe

__all__ = ["LadderFields", "LadderSpec", "VariantJob", "load_ladder_file"]

_FILE_KEYS = {"model", "recipes", "imatrix", "imatrix_corpus", "imatrix_chunks", "threads", "verify", "eval"}
_VERIFY_KEYS = {"seeds", "limit", "max_tokens", "gpu_layers", "threads", "ctx_size"}
_EVAL_KEYS = {"corpus", "chunks", "ctx_size", "gpu_layers", "threads"}


@dataclass(frozen=True)
class LadderSpec:
    """Every variant of ``model``, one per recipe, into ``out_dir`` (``out_dir/<recipe>/``)."""

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

    def check(self) -> LadderSpec:
        """The spec with its recipes resolved; LadderError naming the first problem."""
        if not self.recipes:
            raise LadderError("a ladder needs at least one recipe (-r RECIPE, or recipes = [...] in the ladder file)")
        dup = sorted({r for r in self.recipes if self.recipes.count(r) > 1})
        if dup:
            raise LadderError(f"recipe {', '.join(dup)} given twice")
        if self.imatrix and self.imatrix_corpus:
            raise LadderError(f"give imatrix {self.imatrix} or imatrix_corpus {self.imatrix_corpus}, not both")
        names = [Recipe.load(r).name for r in self.recipes]  # RecipeError naming a bad one, before any work
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise LadderError(f"recipes {', '.join(self.recipes)} name the variant {', '.join(clash)} twice")
        return self

    def variant_dir(self, recipe: str) -> Path:
        return self.out_dir / Recipe.load(recipe).name


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

    @classmethod
    def of(cls, spec: LadderSpec, recipe: str, imatrix: str | None) -> VariantJob:
        ev = spec.eval_options
        gpu = bool(spec.verify_options.server.gpu_layers) or bool(ev is not None and ev.gpu_layers)
        return cls(recipe=recipe, model=spec.model, out_dir=spec.variant_dir(recipe), base_dir=spec.out_dir,
                   imatrix=imatrix, threads=spec.threads, verify=spec.verify, verify_options=spec.verify_options,
                   eval_options=ev, signing_key=str(spec.signing_key) if spec.signing_key else None,
                   token=spec.token, uses_gpu=gpu)


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


def load_ladder_file(path: str | Path) -> LadderFields:
    """The ladder file's settings as :class:`LadderSpec` fields, its ``[verify]`` and ``[eval]``
    tables as :class:`~ggufmtp.measure.core.options.VerifyOptions` and
    :class:`~ggufmtp.quality.options.EvalOptions` (LadderError naming the file and the problem)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise LadderError(f"{p}: cannot read the ladder file ({e.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise LadderError(f"{p}: not a TOML ladder file ({e})") from None
    bad = sorted(set(data) - _FILE_KEYS)
    if bad:
        raise LadderError(f"{p}: unknown keys {', '.join(bad)} (known: {', '.join(sorted(_FILE_KEYS))})")
    recipes = data.get("recipes", [])
    if not isinstance(recipes, list) or not all(isinstance(r, str) for r in recipes):
        raise LadderError(f"{p}: recipes must be a list of recipe names or files")
    out = LadderFields(recipes=tuple(recipes))
    for k in ("model", "imatrix", "imatrix_corpus", "imatrix_chunks", "threads"):
        if data.get(k) is not None:
            out[k] = data[k]
    verify, ev, table = _table(data, "verify", _VERIFY_KEYS, p), _table(data, "eval", _EVAL_KEYS, p), "verify"
    try:
        if verify is not None:
            out["verify_options"] = VerifyOptions.from_dict(verify)
        table = "eval"
        if ev is not None:
            out["eval_options"] = EvalOptions(**ev)
    except (VerifyError, QualityError, TypeError, ValueError) as e:
        raise LadderError(f"{p}: [{table}] {e}") from None
    return out
