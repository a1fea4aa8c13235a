"""The DFlash drafter: Qwen3-style layers whose attention also sees injected context K/V.

The fused context feature `hidden_norm(fc(concat(target layers)))` is projected by each layer's
own `k_proj`/`v_proj` (K: `k_norm` then RoPE at the token's true position; V: neither) and
placed before the block's K/V. Block queries attend to all of it at once (non-causal), so one
pass proposes a whole block. The drafter has no embedding or LM head: it uses the target's.
Weights are named exactly as the published checkpoints (`fc.weight`, `layers.0...`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import DrafterConfig
from ..parallel import SINGLE, Parallel
from .layers import MLP, AttentionProjections, RMSNorm, Rotary, apply_rope

ContextKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v): [B, H_kv, S, D]


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, layer: int, tp: Parallel):
        super().__init__()
        self.self_attn = AttentionProjections(cfg, tp)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        sliding = cfg.layer_types[layer] == "sliding_attention"
        # The reference makes sliding-window layers causal unless `is_causal` says otherwise.
        self.is_causal = sliding if cfg.is_causal is None else cfg.is_causal
        self.window = cfg.sliding_window if sliding else None

    def context_kv(self, fused: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        # fused: [B, N, hidden] -> k, v: [B, H_kv, N, D]
        return apply_rope(self.self_attn.key(fused), *rope), self.self_attn.value(fused)

    def mask(self, ctx_len: torch.Tensor, ctx_capacity: int, q_pos: torch.Tensor) -> torch.Tensor:
        # ctx_len: [B]; q_pos: [B, K] block positions -> [B, 1, K, ctx_capacity + K] bool
        ctx_pos = torch.arange(ctx_capacity, device=q_pos.device).expand(len(q_pos), -1)
        k_pos = torch.cat([ctx_pos, q_pos], dim=1)[:, None, :]  # [B, 1, S]
        is_ctx = torch.arange(k_pos.shape[-1], device=q_pos.device) < ctx_capacity
        visible = ~is_ctx | (k_pos < ctx_len[:, None, None])
        delta = q_pos[:, :, None] - k_pos  # [B, K, S] query position minus key position
        if self.is_causal:
            visible = visible & (delta >= 0)
        if self.window is not None:
            visible = visible & (delta < self.window) & (-delta < self.window)
        return visible[:, None]

    def forward(self, x, ctx: tuple[torch.Tensor, torch.Tensor], rope, mask) -> torch.Tensor:
        attn = self.self_attn
        h = self.input_layernorm(x)
        q = apply_rope(attn.query(h), *rope)
        k = torch.cat([ctx[0], apply_rope(attn.key(h), *rope)], dim=2)
        v = torch.cat([ctx[1], attn.value(h)], dim=2)
        x = x + attn.attend(q, k, v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """With tp.world > 1, one rank's shard: attention heads and MLP split, `fc` and norms replicated."""

    def __init__(self, cfg: DrafterConfig, tp: Parallel = SINGLE):
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList(DrafterLayer(cfg, i, tp) for i in range(cfg.num_hidden_layers))
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rope, cfg.head_dim)

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> ContextKV:
        """Context K/V of every layer for newly committed tokens.

        features: [B, N, n_layers * hidden] captured target states; positions: [B, N].
        """
        fused = self.hidden_norm(self.fc(features))
        rope = self.rotary(positions, fused.dtype)
        return [layer.context_kv(fused, rope) for layer in self.layers]

    def forward(self, block_embeds: torch.Tensor, positions: torch.Tensor, ctx: ContextKV,
                ctx_len: torch.Tensor | None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One drafting pass -> final-normed hidden [B, K, hidden].

        block_embeds: [B, K, hidden] target embeddings of [anchor, MASK, ...]; positions: [B, K];
        ctx: per-layer context K/V whose index j holds position j; ctx_len: [B] valid entries.
        `mask` [B, 1, K, S + K] replaces the per-layer masks (training packs many blocks per row).
        """
        rope = self.rotary(positions, block_embeds.dtype)
        capacity = ctx[0][0].shape[2]
        masks: dict[tuple, torch.Tensor] = {}
        x = block_embeds
        for layer, layer_ctx in zip(self.layers, ctx):
            if mask is None:
                key = (layer.is_causal, layer.window)
                if key not in masks:
                    masks[key] = layer.mask(ctx_len, capacity, positions)
            x = layer(x, layer_ctx, rope, masks[key] if mask is None else mask)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """The target's LM head (fp32 logits) with the drafter's optional multiplier and softcap."""
        cfg = self.config
        logits = lm_head(hidden).float() * cfg.output_multiplier
        if cfg.final_logit_softcapping:
            logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
        return logits
