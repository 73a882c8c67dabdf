"""The run's stage cache (:mod:`ggufmtp.pipeline`): each stage's record in
``OUT/.ggufmtp/stages/<stage>.json`` under a key on its inputs, reused while the key is the same and
the files it recorded still hold their bytes. A module of its own so that the pipeline stays within
its size. A stage that runs says why (:attr:`StageRecord.why`): no record, which of its named inputs
changed (:func:`named_key` keeps each input's digest in the record), its files changed since, or its
last verdict failed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from .files.fsutil import atomic_write_json
from .files.hashing import sha256_file
from .jsontypes import JsonObject
from .run_summary import StageStatus

__all__ = ["StageCache", "StageRecord", "intact", "named_key", "stage_key"]


@dataclasses.dataclass
class StageRecord:
    """One stage of a run: its input key, whether its result came from the cache, and the result
    (the JSON the stage stored in ``OUT/.ggufmtp/stages/<stage>.json``)."""

    stage: str
    key: str
    cached: bool
    result: JsonObject
    seconds: float = 0.0  # the stage's wall time in this run (a cached one: checking its record)
    why: str | None = None  # why it ran (None: cached): "no record", "the recipe changed", ...

    @property
    def status(self) -> StageStatus:
        return StageStatus.CACHED if self.cached else StageStatus.RAN


def stage_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def intact(*keys: str) -> Callable[[Mapping[str, object]], bool]:
    """A cached result (any stage's record) is valid while the files it recorded under ``keys``
    (:class:`FileRecord`) still hold the same bytes (hashed again: a file rewritten with its size and
    mtime restored is not intact)."""
    def check(r: Mapping[str, object]) -> bool:  # a key holding a list: every record of it (a split's shards)
        recs = [rec for v in (r.get(k) for k in keys) for rec in (v if isinstance(v, list) else [v])]
        return all(isinstance(rec, dict) and rec.get("sha256") and Path(rec["path"]).is_file()
                   and sha256_file(Path(rec["path"])) == rec["sha256"] for rec in recs)

    return check


_R = TypeVar("_R", bound=Mapping[str, object])  # a stage's record (stage_records.py)


def named_key(**inputs: Any) -> tuple[str, dict[str, str]]:
    """A stage's key from its named inputs (the same digest as :func:`stage_key` of their values in order), and
    each input's own digest: the stage's record keeps those, so a rerun can say which one changed."""
    return stage_key(*inputs.values()), {name: stage_key(v) for name, v in inputs.items()}


class StageCache:
    """Runs a stage unless ``OUT/.ggufmtp/stages/<stage>.json`` holds a successful result for the
    same key whose outputs are still intact; records what happened either way. A result that
    ``ok`` judges a failure (a failing verdict) is recorded but not reused (a rerun runs it again)
    unless ``reuse_failed``: the same bytes measured with the same settings again tell nothing new."""

    def __init__(self, out_dir: Path, log: Callable[[str], None], force: bool, reuse_failed: bool = False):
        self.dir = out_dir / ".ggufmtp" / "stages"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.force = force
        self.reuse_failed = reuse_failed
        self.records: list[StageRecord] = []

    def run(self, stage: str, key: str | tuple[str, dict[str, str]], fn: Callable[[], _R],
            still_valid: Callable[[_R], bool] = lambda r: True, ok: Callable[[_R], bool] = lambda r: True) -> _R:
        """``fn()``'s record (a JSON object: written to the stage's file), or the one that file holds.
        ``key``: a digest, or :func:`named_key`'s (digest, named inputs)."""
        digest, inputs = (key, None) if isinstance(key, str) else key
        path, t0 = self.dir / f"{stage}.json", time.monotonic()
        why: str | None = "--force" if self.force else "no record"
        if not self.force and path.exists():
            rec = json.loads(path.read_text())
            why = self._why_not(rec, digest, inputs, still_valid)
            if why is None:
                self.log(f"[{stage}] cached")
                self.records.append(StageRecord(stage, digest, True, rec["result"], time.monotonic() - t0))
                return cast(_R, rec["result"])
        self.log(f"[{stage}] running: {why}")
        path.unlink(missing_ok=True)
        result = fn()
        atomic_write_json(path, {"stage": stage, "key": digest, "ok": bool(ok(result)), "result": result,
                                 **({"inputs": inputs} if inputs else {})})
        self.records.append(StageRecord(stage, digest, False, cast(JsonObject, result), time.monotonic() - t0, why))
        return result

    def _why_not(self, rec: Mapping[str, Any], key: str, inputs: dict[str, str] | None,
                 still_valid: Callable[[Any], bool]) -> str | None:
        """Why the record cannot be reused (None: it can): which named input changed, files, a failure."""
        if rec.get("key") != key:
            was = rec.get("inputs") if isinstance(rec.get("inputs"), dict) else {}
            changed = [n for n, d in (inputs or {}).items() if was and was.get(n) != d]
            return f"{' and '.join(n.replace('_', ' ') for n in changed)} changed" if changed else "its inputs changed"
        if not rec.get("ok") and not self.reuse_failed:
            return "its last verdict failed (measured again)"
        return None if still_valid(rec["result"]) else "its files changed since"

