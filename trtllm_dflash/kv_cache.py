"""Preallocated per-slot caches that attention reads in place.

Each request owns one slot for its life. Layers declare a `LayerCacheSpec`:
- "full": index == absolute position, `capacity` entries per slot (and one spare, never read: a pass reads at
  most `capacity` keys, so a compiled pass never meets a key span equal to the tensor's size, which would
  specialise it into another graph). Rolling back to an accepted
  length is just a smaller length: entries past it are never visible (see models/attention.py) and
  are rewritten before they are read.
- "window": a ring of R = window + max_step_tokens - 1 entries, index = position % R, so memory is
  bounded by the window, not the context. R keeps every key a later query can see even when a whole
  verified block is rejected (a rejected entry can only shadow a position at least window + 1 behind
  every later query). Prefill writes only each row's last R real positions; the others go to a spare
  entry R that is never read.
All "full" layers share one tensor per K and V, [L_full, S, H_kv, C + 1, D] (head-major: SDPA reads it
directly, flash-attn through a transposed view, the fused context-KV op writes every layer in one
launch). Recurrent (linear-attention) layers keep their state apart, in state_cache.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

KINDS = ("full", "window")


@dataclass(frozen=True)
class LayerCacheSpec:
    kind: str = "full"
    window: int | None = None  # "window" layers: the attention window in positions

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"cache kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "window" and not (self.window and self.window > 0):
            raise ValueError(f"a window cache needs a positive window, got {self.window!r}")


class FullKV:
    """K/V of one layer at index == position: k, v [S, H_kv, C + 1, D] (views of the shared tensors)."""

    kind = "full"

    def __init__(self, k: Tensor, v: Tensor):
        self.k, self.v = k, v

    def write(self, ctx, k: Tensor, v: Tensor) -> None:
        # k, v: [B, T, H_kv, D] at ctx.positions [B, T] of slots ctx.slots [B]; a cache is state,
        # never differentiated through (training passes context K/V explicitly)
        index = (ctx.slots[:, None], slice(None), ctx.positions)
        self.k[index] = k.detach()
        self.v[index] = v.detach()

    def view(self, rows: slice | Tensor, kv_len: int) -> tuple[Tensor, Tensor]:
        # -> k, v [B, H_kv, kv_len, D]: views of a slice of slots (no copy), or the slots [B] a tensor names (a copy)
        return self.k[rows, :, :kv_len], self.v[rows, :, :kv_len]

    def key_positions(self, ctx) -> Tensor:
        return ctx.keys[None]  # [1, kv_len]


class WindowKV(FullKV):
    """K/V of one sliding-window layer in a ring: k, v [S, H_kv, R + 1, D]; entry R is a spare."""

    kind = "window"

    def __init__(self, k: Tensor, v: Tensor):
        super().__init__(k, v)
        self.ring = k.shape[2] - 1

    def write(self, ctx, k: Tensor, v: Tensor) -> None:
        index = ctx.positions % self.ring
        if ctx.lengths is not None:  # prefill: keep each row's last `ring` real positions only
            length = ctx.lengths[:, None]
            keep = (ctx.positions < length) & (ctx.positions >= length - self.ring)
            index = torch.where(keep, index, self.ring)
        self.k[ctx.slots[:, None], :, index] = k.detach()
        self.v[ctx.slots[:, None], :, index] = v.detach()

    def view(self, rows: slice | Tensor, kv_len: int) -> tuple[Tensor, Tensor]:
        return self.k[rows, :, : self.ring], self.v[rows, :, : self.ring]

    def key_positions(self, ctx) -> Tensor:
        # entry i holds the latest position <= the row's last query position that is i mod R: [B, R]
        last = ctx.positions[:, -1:]
        return last - (last - torch.arange(self.ring, device=last.device)) % self.ring


class KVCache:
    """The caches of every layer of one model, for `num_slots` sequences."""

    def __init__(self, specs: list[LayerCacheSpec], num_slots: int, num_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, max_step_tokens: int = 1):
        full = [i for i, s in enumerate(specs) if s.kind == "full"]
        shape = (len(full), num_slots, num_kv_heads, capacity + 1, head_dim)
        # k, v: [L_full, S, H_kv, C + 1, D]
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.layers: list[FullKV] = []
        for spec in specs:
            if spec.kind == "full":
                index = len([s for s in self.layers if s.kind == "full"])
                self.layers.append(FullKV(self.k[index], self.v[index]))
            else:
                ring = min(spec.window + max_step_tokens - 1, capacity)
                ring_shape = (num_slots, num_kv_heads, ring + 1, head_dim)
                self.layers.append(WindowKV(torch.zeros(ring_shape, dtype=dtype, device=device),
                                            torch.zeros(ring_shape, dtype=dtype, device=device)))

    def tensors(self) -> list[tuple[Tensor, tuple[int, ...]]]:
        """What a pass reads and writes: every layer's k and v [S, H_kv, C or R + 1, D], and the full layers' shared
        k and v [L_full, S, H_kv, C + 1, D] their views come from (a compiled pass guards on a view's base too),
        each with the dims an allocation sizes (slots, capacity; `step_mode.StepMode.caches`)."""
        layers = [(t, (0, 2)) for layer in self.layers for t in (layer.k, layer.v)]
        return layers + [(self.k, (1, 3)), (self.v, (1, 3))]

    def move(self, src: int, dst: int, length: int) -> None:
        """A sequence changes slot: its entries at positions 0..length-1 of full layers (later ones are junk no
        query sees) and its whole ring of window layers go from slot src to slot dst. Device copies only."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]
        for layer in self.layers:
            if layer.kind == "window":
                layer.k[dst] = layer.k[src]
                layer.v[dst] = layer.v[src]
