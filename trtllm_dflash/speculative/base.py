"""The interface every speculative method implements; the generator knows nothing else of them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..sampling import SamplingBatch
from ..step_mode import StepMode, StepShapes


@dataclass
class StepBatch:
    """One decode step's rows, passed whole: row b is cache slot b of the target and the proposer, or
    slot slots[b] when the step runs only some slots."""

    anchors: torch.Tensor  # [B] long: the last committed token of each row, at position starts[b]
    starts: torch.Tensor  # [B] long: committed length; the context is positions 0..starts[b]-1
    max_start: int  # host int, >= every row's start: sizes the key span without a device sync
    sampling: SamplingBatch
    slots: torch.Tensor | None = None  # [B] long cache slot of each row; None: rows 0..B-1 are slots 0..B-1
    shapes: StepShapes | None = None  # the step mode's padding buckets (key spans rounded up to them)

    def key_span(self, tokens: int) -> int:
        """Keys a cached pass of `tokens` per row reads: every row's context and the tokens (a host int), rounded
        up to a bucket when steps are padded (keys past a row's queries are never visible)."""
        span = self.max_start + tokens
        return span if self.shapes is None else self.shapes.span(span)


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

    def defer(self, slots: torch.Tensor, features: torch.Tensor | None, positions: torch.Tensor) -> None:
        """`commit` for a plain step's tokens (T = 1), which the method may write later, batched: before
        its next `propose` or `commit`, so every write still lands in the order the tokens ran."""
        self.commit(slots, features, positions)

    def set_step_mode(self, mode: StepMode) -> None:
        """How the method's own passes run (step_mode.py); methods without a model ignore it."""

    def tensors(self) -> list[tuple[torch.Tensor, tuple[int, ...]]]:
        """Per-slot state its passes read and write in place, with the dims an allocation sizes (`KVCache.tensors`)."""
        return []

    @abstractmethod
    def move(self, src: int, dst: int, length: int) -> None:
        """The request in slot src moves to slot dst (free); its state covers positions 0..length-1."""

    def discard(self) -> None:
        """Drop deferred `defer` writes: no running request will draft again (their context is never read)."""

    @abstractmethod
    def propose(self, batch: StepBatch, num_drafts: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> drafts [B, num_drafts] and their proposal probabilities [B, num_drafts, V].

        Probabilities may be None when every row is greedy or nothing is proposed.
        """
