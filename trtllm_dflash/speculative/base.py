"""The interface every speculative method implements; the generator knows nothing else of them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..compilation.step_mode import StepMode, StepShapes
from ..sample.sampling import SamplingBatch


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
    # the run's block (anchor + its most drafts): a proposer that drafts a block at once may draft it whole and
    # keep the first k (0: the k asked)
    block: int = 0

    def key_span(self, tokens: int) -> int:
        """Keys a cached pass of `tokens` per row reads: every row's context and the tokens (a host int), rounded
        up to a bucket when steps are padded (keys past a row's queries are never visible)."""
        span = self.max_start + tokens
        return span if self.shapes is None else self.shapes.span(span)


@dataclass
class ContextTokens:
    """Captured target states of tokens the target just ran, for a proposer's context: `keep` marks the tokens the
    target kept (not rejected drafts, prompt padding or a plain-only row's). The host lists mirror the device
    tensors, so selecting the kept tokens needs no device sync and no tensor built from host data."""

    slots: torch.Tensor  # [B] long: each row's cache slot
    keep: torch.Tensor  # [B, T] bool
    features: torch.Tensor  # [B, T, F]
    positions: torch.Tensor  # [B, T] long
    slot_ids: list[int]  # [B] host: slots
    counts: list[int]  # [B] host: keep's row sums
    prompt: bool = False  # a prefill's tokens (else a step's)

    def kept(self):
        """-> the kept tokens' slots [N], features [N, F], positions [N] (row-major)."""
        b, t = self.positions.shape
        n = sum(self.counts)
        slots = self.slots[:, None].expand(b, t).reshape(-1)
        features, positions = self.features.reshape(b * t, -1), self.positions.reshape(-1)
        if n == b * t:
            return slots, features, positions
        index = torch.nonzero_static(self.keep.reshape(-1), size=n)[:, 0]  # [N], sized on the host: no sync
        return slots[index], features[index], positions[index]


class Proposer(ABC):
    #: target decoder layers whose outputs the method needs (id i = output of layer i)
    capture_layer_ids: tuple[int, ...] = ()
    #: the largest block (anchor + drafts) one verify pass may carry
    max_block_size: int = 1
    #: the block table its paged caches share with the target's (set by the generator before `allocate`)
    table = None

    @abstractmethod
    def allocate(self, num_slots: int, capacity: int) -> None:
        """Set up per-slot state for `num_slots` sequences of at most `capacity` positions. Paged caches are paged by
        `self.table` (kv_cache.BlockTable, set by the generator: the target's; None: caches of their own)."""

    @abstractmethod
    def commit(self, tokens: ContextTokens) -> None:
        """Take the captured target states of tokens the target kept, now (after any deferred ones)."""

    def defer(self, tokens: ContextTokens) -> None:
        """`commit`, which the method may put off until a `propose` reads the context (or `flush`): a request that
        ends or stops drafting first (`release`) never pays for it. `tokens.features` must stay valid until
        then (a fresh tensor, not graph memory)."""
        self.commit(tokens)

    def flush(self, prompts_only: bool = False) -> None:
        """Write the deferred tokens now: every one, or only the prompts' (`ContextTokens.prompt`)."""

    def release(self, slot: int) -> None:
        """The request in `slot` ended or stopped drafting: its deferred tokens are never read, and the slot's next
        owner writes its own."""

    def set_step_mode(self, mode: StepMode) -> None:
        """How the method's own passes run (step_mode.py); methods without a model ignore it."""

    def tensors(self) -> list[tuple[torch.Tensor, tuple[int, ...]]]:
        """Per-slot state its passes read and write in place, with the dims an allocation sizes (`KVCache.tensors`)."""
        return []

    @abstractmethod
    def move(self, src: int, dst: int, length: int) -> None:
        """The request in slot src moves to slot dst (free); its state covers positions 0..length-1."""

    def discard(self) -> None:
        """Drop every deferred token: no running request will draft again (their context is never read)."""

    @abstractmethod
    def propose(self, batch: StepBatch, num_drafts: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> drafts [B, num_drafts] and their proposal probabilities [B, num_drafts, V].

        Probabilities may be None when every row is greedy or nothing is proposed.
        """
