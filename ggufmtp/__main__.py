"""``python -m ggufmtp`` and the ``ggufmtp`` console script: Ctrl-C and SIGTERM behave from the first
instruction.

Before the CLI is imported there is nothing to clean up, so an interrupt there is one line and
exit 130 (SIGTERM: 143), never an import traceback. Once it is imported, SIGTERM (what ``timeout``,
CI time-outs and systemd send) raises :class:`Terminated`, a KeyboardInterrupt, so every cleanup
path written for Ctrl-C (partial outputs, servers, temp files) runs for it too.

This module imports only the standard library and ``ggufmtp.errors`` before it installs the
handlers; the CLI (whose imports take most of a second on a cold cache) comes after.
"""

from __future__ import annotations

import os
import signal

from .errors import Terminated


def _exit_now(signum: int, _frame: object) -> None:
    os.write(2, b"interrupted\n" if signum == signal.SIGINT else b"terminated\n")
    os._exit(128 + signum)


def _raise_terminated(_signum: int, _frame: object) -> None:
    raise Terminated()


def main() -> None:
    sigint_default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if sigint_default:  # an ignored SIGINT (a background job) stays ignored
        signal.signal(signal.SIGINT, _exit_now)
    signal.signal(signal.SIGTERM, _exit_now)
    from .cli import main as cli  # the imports: seconds on a cold cache

    if sigint_default:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated)
    cli()


if __name__ == "__main__":
    main()
