"""DeepSeek-V3 targets (`deepseek_v3`, and Kimi-K2.5's language model), as transformers 5.24
`models/deepseek_v3/modeling_deepseek_v3.py` computes them: models/target.py's decoder (RMSNorms, layer capture,
dense MLPs for the first first_k_dense_replace layers, then group-limited sigmoid-routed experts with shared experts:
models/moe.py) with multi-head latent attention (DeepseekV3Attention):
- q from a low-rank path (q_a_proj, q_a_layernorm, q_b_proj) or a plain q_proj, per head [nope | rope];
- kv_a_proj_with_mqa(x) = [latent (kv_lora_rank) | one shared key's rope part], the latent normed; the cache keeps
  exactly these two per position (the paged pool's K = latent, V = roped shared key), as transformers' cache does;
- kv_b_proj expands the latents into per-head [k_nope | v] every pass (not absorbed into q and o: the same math,
  written as transformers computes it); keys are [k_nope | shared rope key];
- RoPE on the rope parts only, over interleaved channel pairs (rope_interleave) or halves; YaRN's mscale in the
  softmax scale and its attention factor in cos / sin.
Tensor parallelism splits heads (q_b_proj / q_proj, kv_b_proj, o_proj); the latent path is replicated.
"""

from __future__ import annotations

import torch
from torch import nn

from ...cache.kv_cache import KVCache
from ...config.model import TargetConfig
from ...distributed.parallel import Parallel
from ...utils.errors import DFlashError
from ..attention import AttentionSpec, sdpa
from ..layers import RMSNorm, apply_rope
from ..target import TargetModel

NORM_EPS = 1e-6  # DeepseekV3RMSNorm's default: q_a_layernorm and kv_a_layernorm are built without rms_norm_eps


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[..., R] pairs (x0, x1), (x2, x3), ... -> [x0, x2, ... | x1, x3, ...]: apply_rope's halves then rotate each
    pair by its frequency (apply_rotary_pos_emb_interleave's output order)."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


class MlaAttention(nn.Module):
    """DeepseekV3Attention with its latent cache (see the module docstring). Checkpoint names are transformers'."""

    def __init__(self, cfg: TargetConfig, tp: Parallel, layer: int):
        super().__init__()
        m, h, bias = cfg.deepseek_v3, cfg.hidden_size, cfg.attention_bias
        if cfg.num_attention_heads % tp.world:
            raise DFlashError(f"tensor-parallel size {tp.world} does not divide num_attention_heads "
                              f"{cfg.num_attention_heads}")
        heads = cfg.num_attention_heads // tp.world
        if m.q_lora_rank is None:
            self.q_proj = nn.Linear(h, heads * m.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, m.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, NORM_EPS)
            self.q_b_proj = nn.Linear(m.q_lora_rank, heads * m.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, m.kv_lora_rank + m.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, NORM_EPS)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * m.v_head_dim, h, bias=bias)  # row-parallel; bias held by rank 0
        self.spec = AttentionSpec(heads, heads, m.qk_head_dim, scale=m.softmax_scale)
        self.m, self.tp = m, tp

    def query(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x) if self.m.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.unflatten(-1, (self.spec.num_heads, self.m.qk_head_dim))  # [B, T, H, nope + rope]

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rope(deinterleave(x) if self.m.rope_interleave else x, cos, sin)

    def forward(self, x: torch.Tensor, index: int, ctx) -> torch.Tensor:
        """x: [B, T, hidden]; index: this layer's cache index -> [B, T, hidden]."""
        m, s = self.m, self.spec
        q_nope, q_rot = self.query(x).split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)[:, :, None]  # [B, T, 1, C]
        q_rot, k_rot = self.rope(q_rot, *ctx.rope), self.rope(k_rot[:, :, None], *ctx.rope)  # [B, T, H | 1, R]
        cache = ctx.cache.layers[index]
        cache.write(ctx, latent, k_rot)
        if ctx.prefilling:
            latents, rot, kind, k_pos = latent.transpose(1, 2), k_rot.transpose(1, 2), "prefill", ctx.positions
        else:
            latents, rot = cache.view(ctx, slice(0, x.shape[0]) if ctx.rows is None else ctx.rows, ctx.kv_len)
            kind, k_pos = cache.kind, None
        mask = ctx.mask(s, kind, cache, k_pos, x.dtype)
        kv = self.kv_b_proj(latents[:, 0]).unflatten(-1, (s.num_heads, -1))  # [B, S, H, nope + v]
        k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
        keys = torch.cat((k_nope, rot[:, 0, :, None].expand(-1, -1, s.num_heads, -1)), dim=-1)
        q = torch.cat((q_nope, q_rot), dim=-1)
        out = sdpa(q.transpose(1, 2), keys.transpose(1, 2), v.transpose(1, 2), mask, s)  # [B, H, T, v]
        return self.tp.all_reduce(self.o_proj(out.transpose(1, 2).flatten(2)))


class DeepseekV3Target(TargetModel):
    """TargetModel with multi-head latent attention and its latent cache (weights under transformers' names:
    checkpoint.py)."""

    attention = MlaAttention

    def new_cache(self, num_slots: int, capacity: int, max_step_tokens: int = 1, table=None) -> KVCache:
        """One paged full layer per decoder layer, one "head": K = the normed latent [C], V = the roped shared key
        [R] (replicated on every rank)."""
        m, weight = self.config.deepseek_v3, self.lm_head.weight
        return KVCache(self.cache_specs(), num_slots, 1, capacity, m.kv_lora_rank, weight.dtype, weight.device,
                       max_step_tokens, table, v_head_dim=m.qk_rope_head_dim)
