"""The backends of dflash-build behind one interface: what a backend checks, writes and re-checks.

`BuildSpec.backend` picks one for a build, an engine's `manifest.backend` for `inspect` and `verify`. The
registry names modules, imported on first use: a torch build loads no trtllm module, and nothing here imports a
backend, so the spec (which asks its backend to check it) stays below them.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..utils.errors import DFlashError

if TYPE_CHECKING:
    from ..config.manifest import Manifest
    from ..config.model import DrafterConfig
    from .plan import BuildPlan
    from .spec import BuildSpec

# name -> the module (relative to this package) whose BACKEND implements Backend
BACKENDS = {"torch": ".torch", "trtllm": ".trtllm.backend"}


class Backend(ABC):
    """One engine format. Every check raises DFlashError naming the setting or file."""

    @abstractmethod
    def check_spec(self, spec: BuildSpec) -> None:
        """The settings this backend reads, and those it refuses; run as the spec is made, before any file is read."""

    @abstractmethod
    def read_target(self, data: dict, source: str) -> Any:
        """The target's config.json as this backend models it; raises for a target it cannot run."""

    @abstractmethod
    def default_max_seq_len(self, target: Any, drafter: DrafterConfig) -> int:
        """max_seq_len when the spec leaves it out."""

    @abstractmethod
    def check_plan(self, plan: BuildPlan) -> None:
        """Whether the target splits over the spec's tensor-parallel ranks; before anything is written."""

    @abstractmethod
    def write(self, plan: BuildPlan, tmp: Path) -> dict:
        """Write the engine into `tmp` (the output's temporary sibling) -> the manifest's backend_details."""

    @abstractmethod
    def verify(self, engine_dir: Path, manifest: Manifest) -> tuple[list[str], list[str]]:
        """`dflash-build verify` beyond the checksums -> (report lines, problems)."""

    @abstractmethod
    def inspect_lines(self, engine_dir: Path) -> list[str]:
        """`dflash-build inspect` beyond the manifest (none: an empty list)."""


def backend_for(name: str) -> Backend:
    if name not in BACKENDS:
        raise DFlashError(f"unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
    return importlib.import_module(BACKENDS[name], __package__).BACKEND
