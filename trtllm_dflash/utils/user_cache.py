"""Where this tool keeps what it makes for a user (the built-in pair, step-cost models of read-only engines)."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "TRTLLM_DFLASH_HOME"  # everything this tool caches for the user
CACHE_DIR_ENV = "TRTLLM_DFLASH_CACHE_DIR"  # engines' step-cost models, instead of beside each engine


def user_cache_home() -> Path:
    """$TRTLLM_DFLASH_HOME, else $XDG_CACHE_HOME/trtllm-dflash, else ~/.cache/trtllm-dflash."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtllm-dflash"
