"""Laguna's DFlash drafter: models/drafter.py's drafter with the changes config/laguna_drafter.py lists.

As TensorRT-LLM computes them (NVIDIA/TensorRT-LLM@009d8fa4, `tensorrt_llm/_torch/models/modeling_dflash.py`):
- `project_target_hidden`: each captured target layer's hidden state through its own RMSNorm
  (`aux_hidden_norms.<i>`, in `target_layer_ids` order), then `fc` and `hidden_norm` as DFlash;
- `_build_fused_kv_buffers` / `precompute_context_kv`: the context features through each drafter layer's
  `input_layernorm` before that layer's K/V projection (the query path's norm, so context and block K/V match);
- `_post_attention_gate`: the attention output [B, T, H, D] times softplus(g_proj(x)) [B, T, H], x the layer's
  normed input (the attention's input), before `o_proj`.
The context K/V take the PyTorch path (speculative/dflash.py): the fused op computes DFlash's projection only.
Under tensor parallelism g_proj's rows split with the heads (checkpoint/sharding.py COLUMN); the aux norms are
replicated like `fc`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config.family import SLIDING
from ..config.model import DrafterConfig
from ..distributed.parallel import SINGLE, Parallel
from .drafter import ContextKV, DFlashDrafter
from .layers import Attention, RMSNorm


class GatedDrafterAttention(Attention):
    """A drafter layer's attention with Laguna's per-head softplus output gate (`self_attn.g_proj` [H, hidden])."""

    def __init__(self, cfg: DrafterConfig, tp: Parallel, causal: bool, window: int | None):
        super().__init__(cfg, tp, causal=causal, window=window)
        self.g_proj = nn.Linear(cfg.hidden_size, self.spec.num_heads, bias=False)

    def forward(self, x: torch.Tensor, layer: int, ctx) -> torch.Tensor:
        """x: [B, T, hidden] the normed layer input -> [B, T, hidden]."""
        q, k, v, _ = self.project(x, ctx.rope)
        out = ctx.attend(layer, self.spec, q, k, v)  # [B, T, H, D]
        gate = F.softplus(self.g_proj(x).float()).to(out.dtype)  # [B, T, H]
        return self.tp.all_reduce(self.o_proj((out * gate[..., None]).flatten(2)))


class LagunaDrafter(DFlashDrafter):
    """DFlashDrafter with gated attention, per-capture aux norms and the context through `input_layernorm`.
    Sliding layers are causal within their window, full layers see the whole block (config/laguna_drafter.py)."""

    def __init__(self, cfg: DrafterConfig, tp: Parallel = SINGLE):
        super().__init__(cfg, tp)
        for i, layer in enumerate(self.layers):  # the base class's ungated attention is replaced
            sliding = cfg.layer_types[i] == SLIDING
            window = cfg.sliding_window if sliding else None
            layer.self_attn = GatedDrafterAttention(cfg, tp, causal=sliding, window=window)
        self.aux_hidden_norms = nn.ModuleList(RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) for _ in cfg.target_layer_ids)

    def fused_features(self, features: torch.Tensor) -> torch.Tensor:
        """features: [B, N, n_layers * hidden] -> hidden_norm(fc(cat of each capture's aux norm)) [B, N, hidden]."""
        chunks = features.chunk(len(self.aux_hidden_norms), dim=-1)
        normed = torch.cat([norm(chunk) for norm, chunk in zip(self.aux_hidden_norms, chunks)], dim=-1)
        return self.hidden_norm(self.fc(normed))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> ContextKV:
        fused = self.fused_features(features)
        rope = self.rotary(positions, fused.dtype)
        return [layer.self_attn.key_value(layer.input_layernorm(fused), rope) for layer in self.layers]
