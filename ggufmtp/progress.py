"""The one progress policy: every progress bar ggufmtp draws comes from :func:`bar`.

One switch, as huggingface_hub has one (``HF_HUB_DISABLE_PROGRESS_BARS``): a bar is drawn when the
caller asked for progress (``enabled``, the functions' ``progress=`` argument), bars are not
turned off for the whole process (:func:`disable`, which ``ggufmtp --no-progress`` calls, or
``$GGUFMTP_NO_PROGRESS`` set to anything but ``0``/``false``), and stderr is a terminal (tqdm's
``disable=None``: a log file or a pipe gets no bar). Bars go to stderr, never stdout, so ``--json``
output stays one JSON document, and they clear themselves when done (``leave=False``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tqdm import tqdm

__all__ = ["ENV", "bar", "disable", "enable", "is_disabled"]

ENV = "GGUFMTP_NO_PROGRESS"
_disabled = False


def disable() -> None:
    """Turn every bar of this process off (``ggufmtp --no-progress``)."""
    global _disabled
    _disabled = True


def enable() -> None:
    """Undo :func:`disable` (the environment variable still applies)."""
    global _disabled
    _disabled = False


def is_disabled() -> bool:
    """Whether bars are off for the whole process (the switch or ``$GGUFMTP_NO_PROGRESS``)."""
    return _disabled or os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")


def bar(total: float | None, desc: str, unit: str = "it", *, enabled: bool = True, **kw: Any) -> tqdm:
    """A progress bar under the policy above (``kw``: tqdm's, e.g. ``unit_scale``)."""
    kw.setdefault("leave", False)
    kw.setdefault("dynamic_ncols", True)
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr,
                disable=True if (not enabled or is_disabled()) else None, **kw)
