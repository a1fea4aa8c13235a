"""The op's definition in plain PyTorch: the CPU path, and the oracle for the Triton kernel."""

from __future__ import annotations

import torch

from .spec import ContextKVWeights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def project_context_kv(features: torch.Tensor, positions: torch.Tensor, w: ContextKVWeights):
    """features: [N, n_ids * H]; positions: [N] -> k, v: [N, L, H_kv, D] (k normed and rotated)."""
    n, layers, heads, d = features.shape[0], w.num_layers, w.num_kv_heads, w.head_dim
    fused = rms_norm(features @ w.fc.T, w.hidden_norm, w.hidden_eps)
    kv = (fused @ w.kv.T).view(n, layers, 2, heads, d)  # one stacked projection for all layers
    k = rms_norm(kv[:, :, 0], w.k_norm[None, :, None, :], w.k_eps)
    # Angles are fp32 products, as the models define RoPE (transformers builds its tables in fp32);
    # a float64 reference keeps those angles and evaluates everything after them in float64.
    freqs = positions[:, None].float() * w.inv_freq.float().to(positions.device)  # [N, D/2]
    freqs = freqs.to(torch.float64 if k.dtype == torch.float64 else torch.float32)
    cos = freqs.cos().to(k.dtype)[:, None, None, :]
    sin = freqs.sin().to(k.dtype)[:, None, None, :]
    lo, hi = k[..., : d // 2], k[..., d // 2:]
    k = torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1)
    return k, kv[:, :, 1]


def context_kv_reference(features, positions, blocks, offsets, w: ContextKVWeights, k_pool, v_pool) -> None:
    """Write the new tokens' context K/V of every layer into the paged pool: pool[l, blocks[n], offsets[n]].

    k_pool, v_pool: [L, N_blocks, BLOCK, H_kv, D] (kv_cache.KVCache.k/.v); blocks, offsets [N] from
    `BlockTable.locate` for each token's (row, position); positions [N] give RoPE. Tokens are ragged: any rows,
    any positions.
    """
    k, v = project_context_kv(features, positions, w)
    k_pool[:, blocks, offsets] = k.transpose(0, 1).to(k_pool.dtype)  # index result: [L, N, H_kv, D]
    v_pool[:, blocks, offsets] = v.transpose(0, 1).to(v_pool.dtype)
