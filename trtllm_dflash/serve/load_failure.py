"""Why a model did not load, as dflash-serve's one-line error instead of Triton's exit code.

The torch model writes the cause of a failed `initialize` (a DFlashError's line, else the exception's type and
first line) to the file named by LOAD_ERROR_ENV, in the server's private folder, before Triton logs it with a
traceback. A failure before that code runs (the backend, config.pbtxt, importing model.py) and a trtllm engine's
are read from Triton's log instead: its `failed to load '<model>' version <n>: <cause>` line
(model_lifecycle.cc; Triton >= 24.01 quotes each message and escapes its newlines).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

LOAD_ERROR_ENV = "DFLASH_LOAD_ERROR_FILE"
FAILED_TO_LOAD = re.compile(r"failed to load '([^']+)' version \d+: (.*)")


def describe(exc: BaseException) -> str:
    from ..utils.errors import DFlashError

    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    return first if isinstance(exc, DFlashError) and first else f"{type(exc).__name__}: {first}".rstrip(": ")


def record_load_error(exc: BaseException) -> None:
    """In the model's process: leave the cause for dflash-serve (nothing when not started by it)."""
    path = os.environ.get(LOAD_ERROR_ENV)
    if path:
        try:
            Path(path).write_text(describe(exc) + "\n")
        except OSError:  # the cause still reaches Triton's log
            pass


def cause_in_log(text: str) -> str | None:
    """The first `failed to load` cause in Triton's log, one line, or None."""
    for line in text.splitlines():
        match = FAILED_TO_LOAD.search(line)
        if match:
            cause = match[2].split("\\n")[0].rstrip('"').strip()
            return f"'{match[1]}': {cause}"
    return None


def load_failure(note: Path, log: Path | None) -> str | None:
    """The cause of a failed start: the model's note, else Triton's log; None when neither says."""
    if note.is_file() and note.read_text().strip():
        return note.read_text().strip().splitlines()[0]
    if log is not None and log.is_file():
        return cause_in_log(log.read_text(errors="replace"))
    return None
