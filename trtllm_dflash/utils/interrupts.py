"""SIGTERM and SIGHUP as an exception, so that cleanup written for Ctrl-C (KeyboardInterrupt) runs for them too."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(BaseException):
    """The process was asked to stop by `signum`; like KeyboardInterrupt, not an error of the input."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def signals_raise(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Inside the block these signals raise Terminated (only the main thread can take signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(signum)

    old = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, previous in old.items():
            signal.signal(s, previous)
