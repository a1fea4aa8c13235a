"""Load a target (and optionally its DFlash drafter) into a ready Generator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import DFlashError
from .generator import Generator
from .loading import LoadedDrafter, LoadedTarget, load_drafter, load_target
from .pairing import validate_pair
from .speculative import AutoregressiveProposer, DFlashProposer


@dataclass
class Pipeline:
    generator: Generator
    target: LoadedTarget
    drafter: LoadedDrafter | None

    @property
    def tokenizer(self):
        return self.target.tokenizer


def load_pipeline(target: str | Path, drafter: str | Path | None = None, dtype: torch.dtype = torch.float32,
                  device: str = "cpu") -> Pipeline:
    check_device(device)
    loaded_target = load_target(target, dtype, device)
    loaded_drafter = None
    proposer = AutoregressiveProposer()
    if drafter is not None:
        loaded_drafter = load_drafter(drafter, dtype, device)
        validate_pair(loaded_target.config, loaded_drafter.config)
        proposer = DFlashProposer(loaded_drafter.model, loaded_target.model)
    generator = Generator(loaded_target.model, proposer, loaded_target.stop_ids)
    return Pipeline(generator, loaded_target, loaded_drafter)


def check_device(device: str) -> None:
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise DFlashError(f"unknown device {device!r} (cpu, cuda or cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DFlashError(f"device {device!r} requested but no CUDA GPU is available to torch")
