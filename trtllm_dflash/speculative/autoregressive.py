"""Plain decoding as a method that proposes nothing: one target token per step, for baselines."""

from __future__ import annotations

import torch

from .base import Proposer


class AutoregressiveProposer(Proposer):
    capture_layer_ids = ()
    max_block_size = 1

    def allocate(self, num_slots: int, capacity: int) -> None:
        pass

    def commit(self, slots, features, positions) -> None:
        pass

    def propose(self, slots, anchors, starts, block_size, sampling):
        return anchors.new_zeros((len(anchors), 0)), None
