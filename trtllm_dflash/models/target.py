"""The target model: a dense Qwen3 or Llama 3.x decoder with a slot KV cache and layer capture."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import TargetConfig
from ..kv_cache import KVCache
from ..parallel import SINGLE, Parallel
from .layers import MLP, AttentionProjections, LMHead, RMSNorm, Rotary, VocabEmbedding, apply_rope


@dataclass
class TargetStep:
    """Per-forward inputs: which slots run, which tokens at which absolute positions."""

    input_ids: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, T] absolute positions; cache index == position
    slots: torch.Tensor  # [B] cache slot of each row
    cache: KVCache
    capture_layer_ids: tuple[int, ...] = ()


def causal_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    # positions: [B, T] -> [B, 1, T, kv_len]; key j is visible to a query at position p iff j <= p.
    keys = torch.arange(kv_len, device=positions.device)
    return (keys[None, None, :] <= positions[:, :, None])[:, None]


class TargetLayer(nn.Module):
    def __init__(self, cfg: TargetConfig, tp: Parallel):
        super().__init__()
        self.self_attn = AttentionProjections(cfg, tp)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, layer: int, step: TargetStep, rope, mask, kv_len: int) -> torch.Tensor:
        attn = self.self_attn
        h = self.input_layernorm(x)
        cos, sin = rope
        q = apply_rope(attn.query(h), cos, sin)
        step.cache.write(layer, step.slots, step.positions, apply_rope(attn.key(h), cos, sin), attn.value(h))
        k, v = step.cache.read(layer, step.slots, kv_len)
        x = x + attn.attend(q, k, v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class TargetModel(nn.Module):
    """Weights are named as in the Hugging Face checkpoints (`model.layers.0...`, `lm_head`).

    With tp.world > 1 this is one rank's shard; every rank runs the same steps on the same inputs.
    """

    def __init__(self, cfg: TargetConfig, tp: Parallel = SINGLE):
        super().__init__()
        self.config, self.tp = cfg, tp
        self.model = nn.Module()
        self.model.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.model.layers = nn.ModuleList(TargetLayer(cfg, tp) for _ in range(cfg.num_hidden_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, tp)
        self.rotary = Rotary(cfg.rope, cfg.head_dim)

    @property
    def embed_tokens(self) -> VocabEmbedding:
        return self.model.embed_tokens

    def forward(self, step: TargetStep) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> final-normed hidden [B, T, hidden], and captured layer outputs [B, T, n * hidden].

        Capture id i is the output of decoder layer i, exactly Hugging Face `hidden_states[i + 1]`,
        which for the last layer is taken after the final norm (drafters are trained on that).
        """
        x = self.model.embed_tokens(step.input_ids)
        kv_len = int(step.positions.max()) + 1
        mask = causal_mask(step.positions, kv_len)
        rope = self.rotary(step.positions, x.dtype)
        wanted = set(step.capture_layer_ids)
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, i, step, rope, mask, kv_len)
            if i in wanted:
                captured[i] = x
        x = self.model.norm(x)
        if len(self.model.layers) - 1 in wanted:
            captured[len(self.model.layers) - 1] = x
        features = torch.cat([captured[i] for i in step.capture_layer_ids], dim=-1) if wanted else None
        return x, features

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """-> fp32 logits over the whole vocabulary (gathered across ranks)."""
        return self.lm_head(hidden)

    def new_cache(self, num_slots: int, capacity: int) -> KVCache:
        cfg, weight = self.config, self.lm_head.weight
        kv_heads = self.model.layers[0].self_attn.num_kv_heads  # this rank's
        return KVCache(cfg.num_hidden_layers, num_slots, kv_heads, capacity, cfg.head_dim, weight.dtype, weight.device)
