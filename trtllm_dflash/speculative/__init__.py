"""Speculative methods, one module each behind the `Proposer` interface."""

from .autoregressive import AutoregressiveProposer
from .base import Proposer
from .dflash import DFlashProposer

__all__ = ["AutoregressiveProposer", "DFlashProposer", "Proposer"]
