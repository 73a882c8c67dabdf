"""Test helper: run many ``ggufmtp`` command lines in one process, one JSON line per case.

``python tests/cli_batch.py CASES.json RESULTS.jsonl``: ``CASES.json`` is a list of
``{"id": ..., "argv": [...], "out": FILE}``, run in the current folder; each case's line ``{"id",
"exit", "output", "exception", "sha256", "left"}`` is written (and flushed) when it ends: ``sha256``
of ``out`` when the case made it (the file is then removed: a sweep would fill the disk), ``left``
the names in the folder that look like a partial output. A ``{"id", "started": true}`` line comes
first, so a case that kills the process (llama.cpp's GGML_ASSERT aborts it) is the last one started.
One process and one libllama for all the cases: hundreds of quantizations of a tiny model spend no
time on interpreter start-ups, and an abort fails the sweep without killing pytest.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback

from click.testing import CliRunner

from ggufmtp.cli import main


def run(cases_path: str, results_path: str) -> None:
    with open(cases_path) as f:
        cases = json.load(f)
    with open(results_path, "a") as out:
        for case in cases:
            out.write(json.dumps({"id": case["id"], "started": True}) + "\n")
            out.flush()
            res = CliRunner().invoke(main, case["argv"])
            exc = res.exception if res.exception is not None and not isinstance(res.exception, SystemExit) else None
            made = case.get("out")
            digest = None
            if made and os.path.exists(made):
                with open(made, "rb") as g:
                    digest = hashlib.file_digest(g, "sha256").hexdigest()
                os.remove(made)
            out.write(json.dumps({"id": case["id"], "exit": res.exit_code, "output": res.output,
                                  "exception": "".join(traceback.format_exception(exc)) if exc else None,
                                  "sha256": digest, "left": sorted(n for n in os.listdir(".") if ".partial" in n)})
                      + "\n")
            out.flush()


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2])
