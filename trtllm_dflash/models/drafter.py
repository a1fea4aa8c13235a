"""The DFlash drafter: Qwen3-style layers whose attention also sees injected context K/V.

The fused context feature `hidden_norm(fc(concat(target layers)))` is projected by each layer's
own K/V rows (K: `k_norm` then RoPE at the token's true position; V: neither) and placed before
the block's K/V. Block queries attend to all of it at once (non-causal), so one pass proposes a
whole block. The drafter has no embedding or LM head: it uses the target's. Weights are named
exactly as the published checkpoints (`fc.weight`, `layers.0...`).

Inference keeps context K/V in a paged cache (see kv_cache.py); a drafting pass writes the block's
own K/V right after the context, at positions start..start+B-1, and reads the row's blocks. Those block entries are scratch: the next commit overwrites them with real context.
Training passes the context K/V explicitly (`ExplicitContext`) with a block-sparse mask.

A DFlash2 drafter (`cfg.dflash2`) wraps each sublayer in two convolutions along the block and adds a candidate
selector (models/dflash2.py); the context K/V are not convolved (speculators 0.9.0
`speculators/models/dflash2/model_definitions.py:203-240`: the injected context enters the attention as is).
"""

from __future__ import annotations

import torch
from torch import nn

from ..cache.kv_cache import KVCache, LayerCacheSpec
from ..config.model import DrafterConfig
from ..distributed.parallel import SINGLE, Parallel
from .attention import ExplicitContext, ForwardContext
from .dflash2 import BlockConv, CandidateSelector
from .layers import MLP, Attention, RMSNorm, Rotary

ContextKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v): [B, N, H_kv, D]


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, layer: int, tp: Parallel):
        super().__init__()
        sliding = cfg.layer_types[layer] == "sliding_attention"
        # The reference makes sliding-window layers causal unless `is_causal` says otherwise.
        causal = sliding if cfg.is_causal is None else cfg.is_causal
        self.self_attn = Attention(cfg, tp, causal=causal, window=cfg.sliding_window if sliding else None)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.dflash2 is not None:  # replicated under TP: they act on the full hidden state
            self.attention_conv = BlockConv(cfg.hidden_size, cfg.dflash2)
            self.mlp_conv = BlockConv(cfg.hidden_size, cfg.dflash2)
        else:
            self.attention_conv = self.mlp_conv = None

    def forward(self, x: torch.Tensor, layer: int, ctx) -> torch.Tensor:
        if self.attention_conv is None:
            x = x + self.self_attn(self.input_layernorm(x), layer, ctx)
            return x + self.mlp(self.post_attention_layernorm(x))
        h, delta = self.attention_conv.prepare(self.input_layernorm(x))
        x = x + self.attention_conv.finish(self.self_attn(h, layer, ctx), delta)
        h, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(h), delta)


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
        # DFlash2: replicated, full vocabulary (the logits it rescores are gathered over ranks)
        self.candidate_selector = (CandidateSelector(cfg.hidden_size, cfg.vocab_size, cfg.dflash2)
                                   if cfg.dflash2 is not None else None)

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> ContextKV:
        """Context K/V of every layer for committed tokens.

        features: [B, N, n_layers * hidden] captured target states; positions: [B, N].
        """
        fused = self.hidden_norm(self.fc(features))
        rope = self.rotary(positions, fused.dtype)
        return [layer.self_attn.key_value(fused, rope) for layer in self.layers]

    def forward(self, block_embeds: torch.Tensor, ctx: ForwardContext | ExplicitContext) -> torch.Tensor:
        """One drafting pass -> final-normed hidden [B, K, hidden].

        block_embeds: [B, K, hidden] target embeddings of [anchor, MASK, ...] at ctx.positions [B, K].
        ctx: cached (the draft cache holds context K/V at index == position; the block's K/V are
        written after it) or explicit (training: context K/V and a mask given).
        """
        ctx.rope = self.rotary(ctx.positions, block_embeds.dtype)
        x = block_embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, i, ctx)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """The target's LM head (fp32 logits) with the drafter's optional multiplier and softcap."""
        cfg = self.config
        logits = lm_head(hidden).float()
        if cfg.output_multiplier != 1.0:
            logits = logits * cfg.output_multiplier
        if cfg.final_logit_softcapping:
            logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
        return logits

    def new_cache(self, num_slots: int, capacity: int, table=None) -> KVCache:
        """Context K/V of every layer, paged like the target's full layers (sliding layers too: the drafter is
        small); table: the target's block table (kv_cache.BlockTable), so a request's blocks hold both."""
        spec, weight = self.layers[0].self_attn.spec, self.fc.weight
        return KVCache([LayerCacheSpec("full")] * len(self.layers), num_slots, spec.num_kv_heads, capacity,
                       spec.head_dim, weight.dtype, weight.device, table=table)
