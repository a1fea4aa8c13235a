"""The DFlash training objective: random anchors, the block-sparse mask, decayed cross-entropy.

Each training block is [anchor token, MASK x (B - 1)] placed at positions anchor .. anchor + B - 1.
Its queries see the target's context features strictly before the anchor and every slot of their
own block (bidirectional), nothing of other blocks; slot k (1 <= k < B) is scored against the
token at anchor + k with weight w_k = exp(-(k - 1) / gamma).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.attention import ExplicitContext
from .dflash2 import SELECTOR_LOSS_ALPHA, selector_ce

GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}  # the paper's decay per block size


def decay_weights(block: int) -> torch.Tensor:
    """[B - 1] loss weights of slots 1 .. B - 1; gamma = B / 2 for block sizes the paper does not list."""
    return torch.exp(-torch.arange(block - 1) / GAMMA.get(block, block / 2))


def block_sparse_mask(anchors: torch.Tensor, seq_len: int, block: int) -> torch.Tensor:
    """anchors [N, A] -> [N, 1, A*B, S + A*B] bool: a block's queries see the context strictly
    before its anchor and every slot of their own block, nothing of other blocks."""
    n, a = anchors.shape
    ctx = torch.arange(seq_len, device=anchors.device)[None, None, :] < anchors[:, :, None]  # [N, A, S]
    ctx = ctx.repeat_interleave(block, dim=1)  # [N, A*B, S]
    block_id = torch.arange(a, device=anchors.device).repeat_interleave(block)
    own = (block_id[:, None] == block_id[None, :]).expand(n, -1, -1)  # [N, A*B, A*B]
    return torch.cat([ctx, own], dim=2)[:, None]


def block_loss(drafter, target, seqs: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
               weights: torch.Tensor) -> torch.Tensor:
    """Weighted CE over packed blocks. seqs: [N, S] ids; feats: [N, S, F] target features;
    anchors: [N, A] positions (anchor + B <= S). -> scalar: mean weighted CE per block (plus the selector's)."""
    cfg = drafter.config
    block, (n, a), s = cfg.block_size, anchors.shape, seqs.shape[1]
    idx = anchors[..., None] + torch.arange(block, device=seqs.device)  # [N, A, B] positions of each slot
    tokens = seqs.gather(1, idx.view(n, -1)).view(n, a, block)
    labels = tokens[..., 1:]  # slot k predicts the token at anchor + k
    inputs = torch.full_like(tokens, cfg.mask_token_id)
    inputs[..., 0] = tokens[..., 0]
    ctx_kv = drafter.context_kv(feats, torch.arange(s, device=seqs.device).expand(n, -1))
    embeds = target.embed_tokens(inputs.view(n, -1)) * cfg.input_embedding_scale
    hidden = drafter(embeds, ExplicitContext(idx.view(n, -1), ctx_kv, block_sparse_mask(anchors, s, block)))
    hidden = hidden.view(n, a, block, -1)[:, :, 1:]
    logits = drafter.logits(hidden, target.lm_head)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="none")
    loss = weighted_mean(ce.view(labels.shape), weights)
    if drafter.candidate_selector is not None:
        loss = loss + SELECTOR_LOSS_ALPHA * weighted_mean(selector_ce(drafter.candidate_selector, logits, hidden,
                                                                      tokens), weights)
    return loss


def weighted_mean(ce: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """ce: [N, A, B-1]; weights: [B-1] -> scalar: the weighted mean per block."""
    return (ce * weights).sum() / (weights.sum() * ce.shape[0] * ce.shape[1])
