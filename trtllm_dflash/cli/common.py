"""What every console script shares: one-line errors instead of tracebacks, built-in model names."""

from __future__ import annotations

from pathlib import Path

BUILTIN = "builtin"


def model_path(name: str | None, role: str) -> str | Path | None:
    """`builtin` names the shipped built-in pair (trtllm_dflash/pairs/stdlib); anything else is a path or hub id."""
    if name != BUILTIN:
        return name
    from ..pairs import stdlib_pair

    target, drafter = stdlib_pair()
    return target if role == "target" else drafter
