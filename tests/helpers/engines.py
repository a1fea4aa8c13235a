"""Engines built once per test session: one directory per distinct build, shared read-only by the tests that ask."""

from __future__ import annotations

from pathlib import Path

from trtllm_dflash.builder.builder import build_engine
from trtllm_dflash.builder.spec import BuildSpec


class EngineFactory:
    """`get(target, drafter, **spec)` -> the engine of that BuildSpec, built on first request. A test that writes
    into an engine (moves it, damages it, calibrates it) builds its own instead."""

    def __init__(self, root: Path):
        self.root, self.built = root, {}

    def get(self, target, drafter, **spec) -> Path:
        key = (str(target), str(drafter), tuple(sorted((k, repr(v)) for k, v in spec.items())))
        if key not in self.built:
            out = self.root / f"e{len(self.built)}" / "engine"
            self.built[key] = build_engine(BuildSpec(str(target), str(drafter), str(out), **spec), "test")
        return self.built[key]
