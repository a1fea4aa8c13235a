"""What every console script shares: one-line errors instead of tracebacks, built-in model names."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import DFlashError

BUILTIN = "builtin"


def run_cli(prog: str, body: Callable[[], int | None]) -> int:
    try:
        return body() or 0
    except DFlashError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def model_path(name: str | None, role: str) -> str | Path | None:
    """`builtin` names the shipped built-in pair (trtllm_dflash/pairs/stdlib); anything else is a path or hub id."""
    if name != BUILTIN:
        return name
    from ..pairs import stdlib_pair

    target, drafter = stdlib_pair()
    return target if role == "target" else drafter
