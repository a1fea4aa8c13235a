"""What every console script shares: one-line errors instead of tracebacks."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from .errors import DFlashError
from .interrupts import Terminated


class Parser(argparse.ArgumentParser):
    """Usage errors as the one-line `PROG: error: ...` of run_cli (argparse's own prints the usage too)."""

    def error(self, message: str):
        raise DFlashError(message)


def run_cli(prog: str, body: Callable[[], int | None]) -> int:
    try:
        code = body() or 0
        sys.stdout.flush()  # inside the try: a closed pipe (`| head`) surfaces here, not at exit
        return code
    except BrokenPipeError:  # the reader went away: stop quietly, as `cat` does (128 + SIGPIPE)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 141
    except DFlashError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"{prog}: stopped by {exc}", file=sys.stderr)
        return 128 + exc.signum
