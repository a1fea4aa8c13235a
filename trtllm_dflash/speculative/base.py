"""The interface every speculative method implements; the generator knows nothing else of them."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..sampling import SamplingBatch


class Proposer(ABC):
    #: target decoder layers whose outputs the method needs (id i = output of layer i)
    capture_layer_ids: tuple[int, ...] = ()
    #: the largest block (anchor + drafts) one verify pass may carry
    max_block_size: int = 1

    @abstractmethod
    def allocate(self, num_slots: int, capacity: int) -> None:
        """Set up per-slot state for `num_slots` sequences of at most `capacity` positions."""

    @abstractmethod
    def commit(self, slots: torch.Tensor, features: torch.Tensor | None, positions: torch.Tensor) -> None:
        """Take the captured target states of tokens the target just ran.

        features: [B, T, F] or None; positions: [B, T]. Rows past a sequence's committed length
        may be included; they lie beyond its context and are overwritten before they are used.
        """

    @abstractmethod
    def propose(self, slots: torch.Tensor, anchors: torch.Tensor, starts: torch.Tensor, block_size: int,
                sampling: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> drafts [B, block_size - 1] and their proposal probabilities [B, block_size - 1, V].

        anchors: [B] last committed token, at position starts[b]; the context is positions
        0..starts[b]-1. Probabilities may be None when every row is greedy or nothing is proposed.
        """
