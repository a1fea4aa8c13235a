"""Fit a DFlash drafter to a target's own greedy continuations (the paper's recipe, reduced).

One random anchor per sequence and step; the block is [anchor, MASK, ...]; its queries see
the context strictly before the anchor and every slot of their block; the loss is
cross-entropy on the B - 1 masked slots weighted w_k = exp(-(k - 1) / gamma). Used to make the
built-in pair and the test fixtures; the full trainer is `dflash-train` (trtllm_dflash/train/).
"""

from __future__ import annotations

import math

import torch

from ..engine.generator import Generator
from ..engine.request import Request
from ..models.attention import ForwardContext
from ..models.drafter import DFlashDrafter
from ..models.target import TargetModel
from ..speculative import AutoregressiveProposer
from .objective import block_loss, decay_weights


def target_continuations(target: TargetModel, prompts: list[list[int]], new_tokens: int) -> torch.Tensor:
    """Prompt + greedy continuation per prompt, all of one length -> [N, prompt + new_tokens]."""
    results = Generator(target, AutoregressiveProposer()).generate(
        [Request(tuple(p), new_tokens, ignore_eos=True) for p in prompts])
    return torch.tensor([p + r.output_ids for p, r in zip(prompts, results)])


@torch.no_grad()
def capture_features(target: TargetModel, sequences: torch.Tensor, layer_ids: tuple[int, ...]) -> torch.Tensor:
    """[N, S] token ids -> [N, S, len(layer_ids) * hidden] target layer outputs."""
    n, s = sequences.shape
    cache = target.new_cache(n, s)
    positions = torch.arange(s).expand(n, -1)
    ctx = ForwardContext.prefill(positions, cache, torch.arange(n), torch.full((n,), s), capture_layer_ids=layer_ids)
    _, features = target(sequences, ctx)
    return features


def fit_drafter(target: TargetModel, drafter: DFlashDrafter, sequences: torch.Tensor, min_anchor: int,
                steps: int = 300, batch: int = 16, anchors: int = 16, lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Train `drafter` in place on `sequences` [N, S]: per step `batch` sequences with `anchors`
    random blocks each, anchors drawn from [min_anchor, S - B]. -> per-step losses."""
    cfg = drafter.config
    block = cfg.block_size
    target.requires_grad_(False)  # shared embedding and LM head stay frozen
    features = capture_features(target, sequences, cfg.target_layer_ids)
    weights = decay_weights(block)
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 25)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps)))
    g = torch.Generator().manual_seed(seed)
    losses = []
    drafter.train()
    for _ in range(steps):
        rows = torch.randint(len(sequences), (batch,), generator=g)
        starts = torch.randint(min_anchor, sequences.shape[1] - block + 1, (batch, anchors), generator=g)
        loss = block_loss(drafter, target, sequences[rows], features[rows], starts, weights)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    drafter.eval()
    return losses
