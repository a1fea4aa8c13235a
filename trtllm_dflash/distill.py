"""Fit a DFlash drafter to a target's own greedy continuations (the paper's recipe, reduced).

One random anchor per sequence and step; the block is [anchor, MASK, ...]; its queries see
the context strictly before the anchor and every slot of their block; the loss is
cross-entropy on the B - 1 masked slots weighted w_k = exp(-(k - 1) / gamma). Used to make the
built-in pair and the test fixtures; the full trainer (`dflash-train`) builds on it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .generator import Generator
from .models.drafter import DFlashDrafter
from .models.target import TargetModel, TargetStep
from .request import Request
from .speculative import AutoregressiveProposer

GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


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
    _, features = target(TargetStep(sequences, positions, torch.arange(n), cache, layer_ids))
    return features


def fit_drafter(target: TargetModel, drafter: DFlashDrafter, sequences: torch.Tensor, min_anchor: int,
                steps: int = 300, batch: int = 16, anchors: int = 16, lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Train `drafter` in place on `sequences` [N, S]: per step `batch` sequences with `anchors`
    random blocks each, anchors drawn from [min_anchor, S - B]. -> per-step losses."""
    cfg = drafter.config
    block = cfg.block_size
    target.requires_grad_(False)  # shared embedding and LM head stay frozen
    features = capture_features(target, sequences, cfg.target_layer_ids)
    weights = torch.exp(-torch.arange(block - 1) / GAMMA.get(block, block / 2))
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


def block_sparse_mask(anchors: torch.Tensor, seq_len: int, block: int) -> torch.Tensor:
    """anchors [B, A] -> [B, 1, A*K, S + A*K]: a block's queries see the context strictly before
    its anchor and every slot of their own block, nothing of other blocks."""
    b, a = anchors.shape
    ctx = torch.arange(seq_len)[None, None, :] < anchors[:, :, None]  # [B, A, S]
    ctx = ctx.repeat_interleave(block, dim=1)  # [B, A*K, S]
    block_id = torch.arange(a).repeat_interleave(block)
    own = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)  # [B, A*K, A*K]
    return torch.cat([ctx, own], dim=2)[:, None]


def block_loss(drafter, target, seqs, feats, anchors, weights) -> torch.Tensor:
    """Weighted CE over packed blocks. seqs: [B, S]; feats: [B, S, F]; anchors: [B, A] positions."""
    cfg = drafter.config
    block, (b, a), s = cfg.block_size, anchors.shape, seqs.shape[1]
    idx = anchors[..., None] + torch.arange(block)  # [B, A, K] positions of each block slot
    tokens = seqs.gather(1, idx.view(b, -1)).view(b, a, block)
    labels = tokens[..., 1:]  # slot k predicts the token at slot k
    inputs = torch.full_like(tokens, cfg.mask_token_id)
    inputs[..., 0] = tokens[..., 0]
    ctx = drafter.context_kv(feats, torch.arange(s).expand(b, -1))
    embeds = target.embed_tokens(inputs.view(b, -1)) * cfg.input_embedding_scale
    hidden = drafter(embeds, idx.view(b, -1), ctx, None, block_sparse_mask(anchors, s, block))
    logits = drafter.logits(hidden.view(b, a, block, -1)[:, :, 1:], target.lm_head)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return (ce.view(labels.shape) * weights).sum() / (weights.sum() * b * a)
