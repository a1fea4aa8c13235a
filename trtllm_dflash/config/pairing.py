"""Checks that a drafter was made for a target, before anything runs or is written."""

from __future__ import annotations

from ..utils.errors import DFlashError
from .model import DrafterConfig, TargetConfig


def validate_pair(target: TargetConfig, drafter: DrafterConfig) -> None:
    """Raise a one-line DFlashError naming both sides' values on the first mismatch."""
    if drafter.hidden_size != target.hidden_size:
        raise DFlashError(f"drafter hidden_size {drafter.hidden_size} != target hidden_size {target.hidden_size}")
    if drafter.vocab_size != target.vocab_size:
        raise DFlashError(f"drafter vocab_size {drafter.vocab_size} != target vocab_size {target.vocab_size}")
    depth = target.num_hidden_layers
    if drafter.num_target_layers is not None and drafter.num_target_layers != depth:
        raise DFlashError(f"drafter was trained for num_target_layers {drafter.num_target_layers}, "
                          f"target has num_hidden_layers {depth}")
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < depth]
    if bad:
        raise DFlashError(f"drafter target_layer_ids {list(drafter.target_layer_ids)} out of range for a target "
                          f"with {depth} layers (valid 0..{depth - 1})")
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        raise DFlashError(f"drafter mask_token_id {drafter.mask_token_id} outside the target vocabulary "
                          f"(vocab_size {target.vocab_size})")


def check_block_size(requested: int, trained: int) -> int:
    if requested < 1:
        raise DFlashError(f"block size must be at least 1, got {requested}")
    if requested > trained:
        raise DFlashError(f"block size {requested} exceeds the drafter's trained block_size {trained}")
    return requested
