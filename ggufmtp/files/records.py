"""What ggufmtp reads beside a model file, and the names it writes into one, below the stages that
need them (quant refuses a bad record before any work; provenance copies it into the receipt):

- the receipt's JSON Schema (:data:`SCHEMA_PATH`, package data), which also gives the shape of
- the conversion record ``MODEL.source.json`` that ``ggufmtp convert`` writes
  (:func:`read_conversion_record`, strict: one AuditError naming the file);
- an imatrix dataset's name as GGUF metadata and receipts carry it (:func:`dataset_name`: a file
  name, never a local path).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import AuditError
from .jsonfile import read_json_file

__all__ = ["SCHEMA_PATH", "dataset_name", "read_conversion_record", "receipt_schema"]

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "data" / "receipt.schema.json"


def receipt_schema() -> dict[str, Any]:
    """The receipt's JSON Schema (a fresh copy: callers may change it)."""
    return json.loads(_schema_text())


@functools.lru_cache(maxsize=1)
def _schema_text() -> str:
    return SCHEMA_PATH.read_text()


def read_conversion_record(model_path: str | os.PathLike) -> dict[str, Any] | None:
    """The checkpoint a converted GGUF came from, as the sidecar ``MODEL.source.json`` that `ggufmtp
    convert` writes records it, by name (None: no sidecar). Read strictly, and before any work
    (``quantize``): an AuditError naming the sidecar unless it has the schema's ``converted_from`` shape."""
    import jsonschema

    sidecar = Path(str(model_path) + ".source.json")  # hfconvert/convert.py source_record_path
    if not os.path.lexists(sidecar):
        return None
    data = read_json_file(sidecar, "conversion record")
    if isinstance(data, dict) and "path" in data:
        data = {**{k: v for k, v in data.items() if k != "path"}, "name": Path(str(data["path"])).name}
    full = receipt_schema()
    sub = full["properties"]["predicate"]["properties"]["base_model"]["properties"]["converted_from"]
    if (e := jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(
            {**sub, "$defs": full["$defs"]}).iter_errors(data))) is not None:
        raise AuditError(f"{sidecar}: not a conversion record as `ggufmtp convert` writes it "
                         f"({'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:160]})")
    return data if isinstance(data, dict) else None


def dataset_name(text: str) -> str:
    """How ggufmtp writes an imatrix's dataset (GGUF metadata, receipts): an absolute path becomes
    its file name (``/data/c.txt`` -> ``c.txt``), anything else (``builtin:calib-v1``) stays."""
    absolute = text.startswith(("/", "~")) or bool(re.match(r"[A-Za-z]:[\\/]", text))
    return re.split(r"[\\/]", text.rstrip("/\\"))[-1] or text if absolute else text
