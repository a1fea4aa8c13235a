"""Plain decoding as a method that proposes nothing: one target token per step, for baselines."""

from __future__ import annotations

from .base import Proposer, StepBatch


class AutoregressiveProposer(Proposer):
    capture_layer_ids = ()
    max_block_size = 1

    def allocate(self, num_slots: int, capacity: int) -> None:
        pass

    def commit(self, tokens) -> None:
        pass

    def move(self, src: int, dst: int, length: int) -> None:
        pass

    def propose(self, batch: StepBatch, num_drafts: int):
        return batch.anchors.new_zeros((len(batch.anchors), 0)), None
