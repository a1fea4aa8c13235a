"""Building blocks shared by the target and the drafter: RMSNorm, RoPE, SwiGLU, attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DecoderConfig, RopeConfig
from ..parallel import SINGLE, HeadSplit, Parallel, padded_vocab


class RMSNorm(nn.Module):
    """unit_offset: the weight is stored as an offset from 1 and applied in fp32 before the cast back
    (Qwen3-Next / Qwen3.5 `Qwen3NextRMSNorm`); otherwise cast back, then weight (Llama / Qwen3)."""

    def __init__(self, dim: int, eps: float, unit_offset: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.unit_offset = eps, unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (h * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * h.to(x.dtype)


class MLP(nn.Module):
    """SwiGLU; gate/up column-parallel, down row-parallel (summed over ranks)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool, tp: Parallel = SINGLE):
        super().__init__()
        local = intermediate // tp.world
        self.gate_proj = nn.Linear(hidden, local, bias=bias)
        self.up_proj = nn.Linear(hidden, local, bias=bias)
        self.down_proj = nn.Linear(local, hidden, bias=bias)  # bias held by rank 0 only
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))


class VocabEmbedding(nn.Module):
    """Token embedding whose rows (the padded vocabulary) are split over ranks."""

    def __init__(self, vocab: int, hidden: int, tp: Parallel = SINGLE):
        super().__init__()
        rows = vocab if tp.world == 1 else padded_vocab(vocab, tp.world) // tp.world
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.start, self.tp = tp.rank * rows, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * inside[..., None]
        return self.tp.all_reduce(out)


class LMHead(nn.Module):
    """Output projection whose rows (the padded vocabulary) are split over ranks."""

    def __init__(self, hidden: int, vocab: int, tp: Parallel = SINGLE):
        super().__init__()
        rows = vocab if tp.world == 1 else padded_vocab(vocab, tp.world) // tp.world
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.vocab, self.tp = vocab, tp

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # -> fp32 logits [..., vocab], gathered from every rank, padding dropped
        return self.tp.all_gather_last(F.linear(hidden, self.weight).float())[..., : self.vocab]


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], fp32, with Llama 3.1 / linear scaling applied."""
    inv_freq = 1.0 / rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type != "llama3":
        return inv_freq
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary:
    """cos/sin tables for arbitrary absolute positions; not a module, so meta-device init is safe.
    head_dim is the rotated width (smaller than the head for partial RoPE)."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        self.inv_freq = rope_inv_freq(rope, head_dim)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, T] -> cos, sin: [B, 1, T, D] (broadcast over heads)
        inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, T, D]; cos, sin: [..., R] with R <= D: partial RoPE turns the first R channels only
    if cos.shape[-1] < x.shape[-1]:
        r = cos.shape[-1]
        return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class AttentionProjections(nn.Module):
    """q/k/v/o projections and the optional per-head q/k RMSNorm, named as in the checkpoints.

    With an output gate (Qwen3-Next / Qwen3.5), q_proj yields per head [q (D) | gate (D)] and the
    attention output is multiplied by sigmoid(gate) before o_proj."""

    def __init__(self, cfg: DecoderConfig, tp: Parallel = SINGLE):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        split = HeadSplit(cfg.num_attention_heads, cfg.num_key_value_heads, tp.world)
        # head counts of this rank (all heads when tp.world == 1)
        self.num_heads, self.num_kv_heads, self.head_dim = split.local_heads, split.local_kv_heads, d
        self.output_gate = getattr(cfg, "attn_output_gate", False)
        self.q_proj = nn.Linear(h, self.num_heads * d * (2 if self.output_gate else 1), bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=cfg.attention_bias)  # row-parallel
        self.tp = tp
        if cfg.qk_norm:
            offset = getattr(cfg, "unit_offset_norms", False)
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps, offset)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps, offset)
        else:
            self.q_norm = self.k_norm = None

    def heads(self, x: torch.Tensor, proj: nn.Linear, norm: RMSNorm | None) -> torch.Tensor:
        # x: [B, T, hidden] -> [B, H, T, D]
        out = proj(x).view(*x.shape[:-1], -1, self.head_dim)
        if norm is not None:
            out = norm(out)
        return out.transpose(1, 2)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(x, self.q_proj, self.q_norm)

    def gated_query(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [B, T, hidden] -> q [B, H, T, D], gate [B, T, H * D]
        q, gate = self.q_proj(x).view(*x.shape[:-1], -1, 2 * self.head_dim).chunk(2, dim=-1)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return q.transpose(1, 2), gate.flatten(-2)

    def key(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(x, self.k_proj, self.k_norm)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(x, self.v_proj, None)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
               gate: torch.Tensor | None = None) -> torch.Tensor:
        # q: [B, H, T, D]; k, v: [B, H_kv, S, D]; mask: [B, 1, T, S] bool (True = visible); gate: [B, T, H * D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads)
        out = out.transpose(1, 2).reshape(*q.shape[:1], q.shape[2], -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.tp.all_reduce(self.o_proj(out))
