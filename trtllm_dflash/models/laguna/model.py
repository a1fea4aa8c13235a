"""Laguna targets (`laguna`), as transformers 5.24 `models/laguna/modeling_laguna.py` computes them:
models/target.py's decoder (RMSNorms, paged KV and window rings, layer capture; a dense MLP on `dense` layers,
sigmoid-routed experts plus a shared expert on `sparse` ones: models/moe.py) with LagunaAttention:
- each layer its own number of query heads (K/V heads are global, so the cache is every layer's alike);
- per-head q/k RMSNorm, then the RoPE of the layer's type (partial on full-attention layers by default);
- a sliding window on the layers listed sliding_attention;
- the attention output times softplus(g_proj(x)) (x: the attention's input), one gate per head (or per channel)
  before o_proj.
Tensor parallelism splits each layer's heads, their gates (g_proj rows) with them.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ...config.model import TargetConfig
from ...distributed.parallel import SINGLE, Parallel
from ...utils.errors import DFlashError
from ..layers import Attention, Rotary
from ..target import TargetModel


class LagunaAttention(Attention):
    """Attention with this layer's query heads, its layer type's RoPE and the softplus output gate."""

    def __init__(self, cfg: TargetConfig, tp: Parallel, layer: int):
        heads = cfg.laguna.heads[layer]
        if heads % tp.world:
            raise DFlashError(f"tensor-parallel size {tp.world} does not divide layer {layer}'s {heads} query heads")
        super().__init__(dataclasses.replace(cfg, num_attention_heads=heads), tp, window=cfg.window(layer))
        self.kind, self.per_head = cfg.layer_types[layer], cfg.laguna.gating == "per-head"
        s = self.spec
        self.g_proj = nn.Linear(cfg.hidden_size, s.num_heads * (1 if self.per_head else s.head_dim), bias=False)

    def forward(self, x: torch.Tensor, layer: int, ctx) -> torch.Tensor:
        """x: [B, T, hidden]; layer: this layer's cache index -> [B, T, hidden]."""
        q, k, v, _ = self.project(x, ctx.rope[self.kind])
        out = ctx.attend(layer, self.spec, q, k, v)  # [B, T, H, D]
        gate = F.softplus(self.g_proj(x).float()).to(out.dtype)
        out = (out * gate[..., None]).flatten(2) if self.per_head else out.flatten(2) * gate
        return self.tp.all_reduce(self.o_proj(out))


class TypeRotary:
    """One `Rotary` per layer type (theta and rotated share differ): a call maps each type to its cos, sin
    [B, T, 1, R]. Not a module, like `Rotary` (step_mode.CompiledPass calls `freqs_on`)."""

    def __init__(self, cfg: TargetConfig):
        ropes = cfg.laguna.ropes.items()
        self.by_kind = {kind: Rotary(rope, int(cfg.head_dim * share)) for kind, (rope, share) in ropes}

    def freqs_on(self, device: torch.device) -> None:
        for rotary in self.by_kind.values():
            rotary.freqs_on(device)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {kind: rotary(positions, dtype) for kind, rotary in self.by_kind.items()}


class LagunaTarget(TargetModel):
    """TargetModel with Laguna's attention and RoPE per layer type (weights under transformers' names:
    checkpoint.py)."""

    attention = LagunaAttention

    def __init__(self, cfg: TargetConfig, tp: Parallel = SINGLE):
        super().__init__(cfg, tp)
        self.rotary = TypeRotary(cfg)
