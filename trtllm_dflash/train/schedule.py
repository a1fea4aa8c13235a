"""The learning-rate schedule of both training loops: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math


def warmup_cosine(step: int, warmup: int, total: int, floor: float = 0.0) -> float:
    """Multiplier of the peak learning rate at `step`: (step + 1) / warmup during warm-up, then a
    cosine from 1 down to `floor` at `total` (held there after)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
