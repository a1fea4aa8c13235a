"""Scripted step costs and simulated acceptance for the draft-length policy's tests (no model, no clock)."""

import random

import numpy as np

from trtllm_dflash.draft_length.acceptance import AcceptanceModel
from trtllm_dflash.draft_length.cost import CostModel
from trtllm_dflash.draft_length.policy import (
    BatchView,
    CostBasedDraftLen,
    ProbeSettings,
)

K = 15


def linear_cost(plain: float, per_draft: float, draft_overhead: float = 0.0, batches=(1, 16),
                contexts=(128, 1024), per_batch: float = 0.0) -> CostModel:
    """Scripted cost: plain + per_batch * (B - 1) + [k > 0] * draft_overhead + per_draft * k, any context."""
    lens = tuple(range(K + 1))
    seconds = [[[plain + per_batch * (b - 1) + (draft_overhead if k else 0.0) + per_draft * k for k in lens]
                for b in batches] for _ in contexts]
    return CostModel(batches, lens, contexts, seconds)


def geometric_tokens(alpha: float, k: int) -> float:
    return (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1.0


def feed(model: AcceptanceModel, slots, alpha, steps: int, draft_len: int = K, seed: int = 0) -> None:
    """Simulated verify steps: each draft accepted with probability alpha (per slot), until the first miss."""
    rng = random.Random(seed)
    alphas = alpha if isinstance(alpha, list) else [alpha] * len(slots)
    for _ in range(steps):
        accepted = []
        for a in alphas:
            n = 0
            while n < draft_len and rng.random() < a:
                n += 1
            accepted.append(n)
        model.observe(slots, draft_len, accepted)


def view(slots, context=100, remaining=None, max_draft_len=K) -> BatchView:
    return BatchView(list(slots), context, remaining or [1000] * len(slots), max_draft_len)


def prepared(cost: CostModel, slots: int = 16, probe=ProbeSettings()) -> CostBasedDraftLen:
    policy = CostBasedDraftLen(cost, probe=probe)
    policy.prepare(type("G", (), {"slots": type("S", (), {"usable": slots}), "block": K + 1})())
    return policy

def position_tokens(alphas: list[float], k: int) -> float:
    """E[tokens | k] for conditional rates alphas[j] at draft position j + 1 (closed form)."""
    return 1.0 + sum(float(np.prod(alphas[: j + 1])) for j in range(k))
