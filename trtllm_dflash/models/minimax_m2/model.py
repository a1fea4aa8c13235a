"""MiniMax-M2 targets (`minimax_m2`), as transformers 5.24 `models/minimax_m2/modeling_minimax_m2.py` computes them:
models/target.py's decoder (RMSNorms, paged KV, layer capture, sigmoid-routed experts in every layer: models/moe.py)
with MiniMaxM2Attention, whose q and k RMSNorms span the whole projection (all heads at once) before the head view,
and partial RoPE (rotate_half on each head's first rotary_dim channels).

Tensor parallelism splits heads as for every family; the norms' weights follow their heads
(checkpoint/sharding.py), and the mean square over the full width is the all-reduced sum of the ranks' squares
(a KV head held by several ranks counted once).
"""

from __future__ import annotations

import torch
from torch import nn

from ...config.model import TargetConfig
from ...distributed.parallel import HeadSplit, Parallel
from ..layers import Attention, apply_rope
from ..target import TargetModel


class FullWidthNorm(nn.Module):
    """MiniMaxM2RMSNorm over `width` channels of which this rank holds `local` (its heads'): weight [local];
    `copies`: how many ranks hold each of its channels."""

    def __init__(self, width: int, local: int, eps: float, tp: Parallel, copies: int = 1):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(local))
        self.width, self.eps, self.tp, self.copies = width, eps, tp, copies

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., local] -> [..., local]."""
        h = x.float()
        if self.tp.world == 1:
            variance = h.pow(2).mean(-1, keepdim=True)
        else:
            squares = self.tp.all_reduce(h.pow(2).sum(-1, keepdim=True))
            variance = squares / (self.width * self.copies)
        return self.weight * (h * torch.rsqrt(variance + self.eps)).to(x.dtype)


class MiniMaxM2Attention(Attention):
    """MiniMaxM2Attention: q_norm [H * D] and k_norm [H_kv * D] over the flat projections, then heads and RoPE."""

    def __init__(self, cfg: TargetConfig, tp: Parallel, layer: int):
        super().__init__(cfg, tp)
        s, d = self.spec, cfg.head_dim
        split = HeadSplit(cfg.num_attention_heads, cfg.num_key_value_heads, tp.world)
        copies = max(1, tp.world // cfg.num_key_value_heads)  # ranks sharing one KV head
        self.q_norm = FullWidthNorm(cfg.num_attention_heads * d, s.num_heads * d, cfg.rms_norm_eps, tp)
        self.k_norm = FullWidthNorm(cfg.num_key_value_heads * d, split.local_kv_heads * d, cfg.rms_norm_eps, tp,
                                    copies)

    def project(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        """x: [B, T, hidden] -> q [B, T, H, D], k [B, T, H_kv, D] (normed, roped), v [B, T, H_kv, D], no gate."""
        s = self.spec
        q, k, v = self.qkv_proj.split(self.qkv_proj(x), dim=-1)
        q = self.q_norm(q).unflatten(-1, (s.num_heads, s.head_dim))
        k = self.k_norm(k).unflatten(-1, (s.num_kv_heads, s.head_dim))
        return apply_rope(q, *rope), apply_rope(k, *rope), v.unflatten(-1, (s.num_kv_heads, s.head_dim)), None


class MiniMaxM2Target(TargetModel):
    """TargetModel with MiniMax-M2's attention (weights under transformers' names: checkpoint.py)."""

    attention = MiniMaxM2Attention
