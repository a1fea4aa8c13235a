"""Speculative methods, one module each behind the `Proposer` interface."""

from .autoregressive import AutoregressiveProposer
from .base import Proposer
from .dflash import DFlashProposer
from .dflash2 import DFlash2Proposer

__all__ = ["AutoregressiveProposer", "DFlash2Proposer", "DFlashProposer", "Proposer", "drafter_proposer"]


def drafter_proposer(drafter, target, context_kv: str = "op") -> DFlashProposer:
    """The proposer of a block drafter's method (`DrafterConfig.method`, read from its config.json): the one place
    a method is chosen."""
    cls = DFlash2Proposer if drafter.config.method == "dflash2" else DFlashProposer
    return cls(drafter, target, context_kv=context_kv)
