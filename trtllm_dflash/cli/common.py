"""What every console script shares: one-line errors instead of tracebacks, built-in model names."""

from __future__ import annotations

from pathlib import Path

BUILTIN = "builtin"
BUILTIN_DRAFTERS = {BUILTIN: "dflash", "builtin-dflash2": "dflash2"}  # a drafter's built-in name -> its method


def model_path(name: str | None, role: str) -> str | Path | None:
    """`builtin` names the shipped built-in pair (trtllm_dflash/pairs/stdlib), and `builtin-dflash2` its DFlash2
    drafter; anything else is a path or hub id."""
    method = BUILTIN_DRAFTERS.get(name) if role == "drafter" else "dflash" if name == BUILTIN else None
    if method is None:
        return name
    from ..pairs import stdlib_pair

    target, drafter = stdlib_pair(method)
    return target if role == "target" else drafter
