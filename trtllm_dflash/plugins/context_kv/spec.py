"""The weights the context-KV op reads, stacked once at set-up from a drafter."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ContextKVWeights:
    fc: torch.Tensor  # [H, n_ids * H]
    hidden_norm: torch.Tensor  # [H]
    kv: torch.Tensor  # [L * 2 * H_kv * D, H]: per layer its K rows, then its V rows
    k_norm: torch.Tensor  # [L, D]
    inv_freq: torch.Tensor  # [D / 2] fp32, RoPE inverse frequencies (scaling already applied)
    hidden_eps: float
    k_eps: float

    @property
    def num_layers(self) -> int:
        return self.k_norm.shape[0]

    @property
    def head_dim(self) -> int:
        return self.k_norm.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.kv.shape[0] // (2 * self.num_layers * self.head_dim)


def context_kv_weights(drafter) -> ContextKVWeights:
    """Stack a `DFlashDrafter`'s weights for the fused op (one copy of the K/V projections)."""
    attn = [layer.self_attn for layer in drafter.layers]
    kv = torch.cat([a.kv_weight for a in attn])  # per layer its K rows then its V rows
    k_norm = torch.stack([a.k_norm.weight for a in attn])
    eps = drafter.layers[0].self_attn.k_norm.eps
    return ContextKVWeights(drafter.fc.weight, drafter.hidden_norm.weight, kv.contiguous(), k_norm.contiguous(),
                            drafter.rotary.inv_freq.to(kv.device), drafter.hidden_norm.eps, eps)
