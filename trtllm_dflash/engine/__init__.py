"""The runtime: requests in, tokens out. `load_engine` opens an engine directory; `Generator` steps the batch.

Both are imported on first use, so that importing a record (`engine.request`) does not load the runtime.
"""

from __future__ import annotations

from typing import Any

PUBLIC = {"load_engine": "loader", "generate_with_engine": "loader", "Generator": "generator",
          "Request": "request", "Result": "request"}


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{PUBLIC[name]}"), name)
