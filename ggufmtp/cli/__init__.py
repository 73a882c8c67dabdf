"""The ``ggufmtp`` command line: a thin click layer over the Python API.

Every command prints for people by default and JSON with ``--json``; a ``GgufmtpError`` becomes
one ``error: ...`` line on stderr and exit status 1; a usage error is one ``error: ...`` line and
exit status 2 (``app._CommandLineError``). Shared options are defined once, in ``options.py``.
One module per command group registers its commands on :data:`main` (``app.py``).
"""

from __future__ import annotations

from . import (
               convert_cmds,
               hub_cmds,
               imatrix_cmds,
               ladder_cmd,
               model_cmds,
               provenance_cmds,
               quality_cmds,
               quant_cmds,
               run_cmd,
               runtime_cmds,
               search_cmd,
               sidecar_cmd,
               train_cmd,
               tune_cmds,
               verify_cmds,
)
from .app import main

# Importing a command module registers its commands on ``main``; a new module joins this list.
COMMAND_MODULES = (runtime_cmds, model_cmds, imatrix_cmds, quant_cmds, provenance_cmds, verify_cmds, tune_cmds,
                   hub_cmds, run_cmd, quality_cmds, convert_cmds, ladder_cmd, train_cmd, sidecar_cmd,
                   search_cmd)

__all__ = ["main"]
