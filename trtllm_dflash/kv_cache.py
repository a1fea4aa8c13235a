"""A preallocated, slot-indexed KV cache.

Each request owns one slot; a token's K/V live at index == its absolute position, so rolling
back to an accepted length is just a smaller length (stale entries past it are never visible:
every attention mask admits only positions below the query's own or below the valid length,
and those are rewritten before they are read).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, num_slots, num_kv_heads, capacity, head_dim)
        # k, v: [L, slots, H_kv, capacity, D], one tensor each so fused kernels can write every layer
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # slots: [B]; positions: [B, T]; k, v: [B, H_kv, T, D]
        index = (slots[:, None], slice(None), positions)
        self.k[layer][index] = k.transpose(1, 2)
        self.v[layer][index] = v.transpose(1, 2)

    def read(self, layer: int, slots: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        # -> k, v: [B, H_kv, length, D] (a gather: one copy of what attention reads anyway)
        return self.k[layer][slots, :, :length], self.v[layer][slots, :, :length]
