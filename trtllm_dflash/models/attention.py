"""Attention over per-slot caches, driven by one context object per forward.

Design note: the contract every model family builds on.

- A layer computes its roped q [B, T, H, D] and k, v [B, T, H_kv, D] and calls
  `ctx.attend(layer, spec, q, k, v, sinks)` -> [B, T, H, D]. It never touches a cache or a mask.
  `spec` (`AttentionSpec`) is static per layer: local head counts, causal or block-bidirectional,
  sliding window, softmax scale. `sinks` ([H] learned logits, gpt-oss) join the softmax denominator.
- The context (`ForwardContext`) carries everything per forward, passed whole: absolute positions
  [B, T], the cache and slots, the key span, and the RoPE tables and masks, each
  computed once and shared by every layer. Two modes:
    prefill (`prefilling`): queries attend to this forward's own K/V (prompts start at position
      0); K/V are written to the cache at any `slots`, `lengths` [B] giving each row's real tokens;
    cached (`rows is None`): batch row b is cache slot b; the new K/V are written in place, then
      keys 0..kv_len-1 of each slot are read straight from the cache (a view, never a gather); or
      `rows` [B] names the slots, whose keys are gathered (a copy).
- Visibility is derived from positions, never stored: causal: key <= query; block (DFlash
  drafting, `causal=False`): key < the row's block end; window W: query - key < W (and
  key - query < W when not causal). A slot's entries past its committed length are junk that no
  query can see, which is why rolling back a rejected block costs nothing.
- Kernel: torch SDPA with an additive mask built once per forward and mask kind (exact on CPU;
  with sinks an explicit softmax). On CUDA, cached-mode full-attention layers (no window, <= 16 queries a row) call
  `torch.ops.trtllm_dflash.paged_attention` (trtllm_dflash/plugins/paged_attention): a Triton kernel reading each row's
  keys in place from the paged pool through its block table, visibility derived from the positions:
  no gather, no mask tensor. The env var TRTLLM_DFLASH_PAGED_ATTENTION (auto / triton / off, read in
  trtllm_dflash/plugins/paged_attention/op.py) picks; the CPU keeps gather + SDPA unless it says triton (tests).
- Caches: `ctx.cache.layers[i]` is the cache of attention layer i (kv_cache.py: full or
  sliding-window ring) with write / view / key_positions. Recurrent (linear-attention) layers keep
  their state in `ctx.cache.state` (state_cache.py) and fold `ctx.commit` tokens into it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from ..plugins.paged_attention import op as paged


@dataclass(frozen=True)
class AttentionSpec:
    """What one attention layer computes (head counts are this rank's)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool = True  # False: a query sees every key before its block's end (DFlash drafting)
    window: int | None = None  # sliding window in positions
    scale: float | None = None  # softmax scale; None: head_dim ** -0.5

    @property
    def gqa(self) -> bool:
        return self.num_heads != self.num_kv_heads


def visible(q_pos: Tensor, k_pos: Tensor, spec: AttentionSpec) -> Tensor:
    """q_pos: [B, T]; k_pos: [B or 1, S] key positions (negative: empty) -> [B, 1, T, S] bool."""
    delta = q_pos[:, :, None] - k_pos[:, None, :]  # [B, T, S]
    if spec.causal:
        ok = delta >= 0
    else:  # the whole block is visible: keys before the row's last query position + 1
        ok = k_pos[:, None, :] <= q_pos[:, -1:, None]
    if spec.window is not None:
        ok = ok & (delta < spec.window)
        if not spec.causal:
            ok = ok & (-delta < spec.window)
    return (ok & (k_pos[:, None, :] >= 0))[:, None]


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """bool visibility -> 0 / -inf (SDPA converts a bool mask on every call; this is done once)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, spec: AttentionSpec, sinks: Tensor | None = None) -> Tensor:
    """q: [B, H, T, D]; k, v: [B, H_kv, S, D]; mask: [B, 1, T, S] (bool or additive) -> [B, H, T, D]."""
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=spec.scale, enable_gqa=spec.gqa)
    return eager_with_sinks(q, k, v, mask, spec, sinks)


def eager_with_sinks(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, spec: AttentionSpec, sinks: Tensor) -> Tensor:
    """Softmax over [scores, sink] with the sink's column dropped (gpt-oss): sinks [H] only add mass."""
    b, h, t, d = q.shape
    group = h // k.shape[1]  # query heads per KV head, grouped as transformers' repeat_kv orders them
    scale = spec.scale if spec.scale is not None else d ** -0.5
    scores = (q.reshape(b, k.shape[1], group * t, d) @ k.transpose(-1, -2)).view(b, h, t, -1) * scale
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    logits = torch.cat([scores, sinks.to(scores.dtype)[None, :, None, None].expand(b, h, t, 1)], dim=-1)
    probs = torch.softmax(logits - logits.amax(-1, keepdim=True), dim=-1)[..., :-1]
    return (probs.reshape(b, k.shape[1], group * t, -1).to(v.dtype) @ v).view(b, h, t, d)


@dataclass
class ForwardContext:
    """Everything one forward of one model needs besides its weights; see the module docstring."""

    positions: Tensor  # [B, T] long, absolute position of each query token, consecutive per row
    cache: object  # kv_cache.KVCache (or any cache whose .layers implement the layer-cache interface)
    slots: Tensor  # [B] long, the cache slot of each row
    prefilling: bool = False  # queries attend to this forward's own K/V; else to the cache (cached mode)
    # cached mode: None: rows 0..B-1 are slots 0..B-1, read in place (the row count is the queries' shape, so a
    # compiled pass needs no guard on it); or the slots named by a [B] long tensor (their cache rows gathered:
    # the drafter's pass over the drafting rows of a step with plain-only rows)
    rows: Tensor | None = None
    # cached mode: [kv_len] long, positions 0..kv_len-1: the keys each slot's full-attention layers read (a tensor,
    # not an int, so a compiled pass takes its length as a size, symbolic from the first graph on)
    keys: Tensor | None = None
    lengths: Tensor | None = None  # prefill: [B] real tokens per row (right padding beyond)
    # [B] tokens of each row that recurrent layers fold into their state in this pass (prefill: the
    # lengths; plain decoding: ones); None defers it to `TargetModel.commit` after acceptance (verify)
    commit: Tensor | None = None
    capture_layer_ids: tuple[int, ...] = ()  # target layers whose outputs the forward returns
    rope: tuple[Tensor, Tensor] | None = None  # set by the model: cos, sin [B, T, 1, D]
    masks: dict = field(default_factory=dict)  # built once per (mask kind, cache kind)
    shared: dict = field(default_factory=dict)  # `once`'s values: what every layer of the forward reads alike

    @classmethod
    def prefill(cls, positions: Tensor, cache, slots: Tensor, lengths: Tensor, **kw) -> ForwardContext:
        return cls(positions, cache, slots, True, None, None, lengths, lengths, **kw)

    @classmethod
    def cached(cls, positions: Tensor, cache, kv_len: int, slots: Tensor | None = None, **kw) -> ForwardContext:
        """Rows 0..B-1 are slots 0..B-1 (read in place), or the slots [B] given (gathered)."""
        keys = torch.arange(min(kv_len, cache.capacity), device=positions.device)
        if slots is None:
            slots = torch.arange(positions.shape[0], device=positions.device)
            return cls(positions, cache, slots, False, None, keys, **kw)
        return cls(positions, cache, slots, False, slots, keys, **kw)

    @property
    def kv_len(self) -> int:
        return self.keys.shape[0]

    def attend(self, layer: int, spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor,
               sinks: Tensor | None = None) -> Tensor:
        """q: [B, T, H, D]; k, v: [B, T, H_kv, D] this forward's -> [B, T, H, D] (and k, v stored)."""
        cache = self.cache.layers[layer]
        cache.write(self, k, v)
        if not self.prefilling and cache.kind == "full" and paged.use_op(q, spec.window is not None):
            # keys read in place through the block table; the rows' slots are self.slots in both cached forms
            scale = spec.scale if spec.scale is not None else q.shape[-1] ** -0.5
            return paged.paged_attention(q, cache.k, cache.v, cache.table.table, self.slots, self.positions,
                                         self.kv_len, spec.causal, scale, sinks)
        if self.prefilling:
            keys, values, kind, k_pos = k.transpose(1, 2), v.transpose(1, 2), "prefill", self.positions
        else:
            keys, values = cache.view(self, slice(0, q.shape[0]) if self.rows is None else self.rows, self.kv_len)
            kind, k_pos = cache.kind, None
        mask = self.mask(spec, kind, cache, k_pos, q.dtype)
        return sdpa(q.transpose(1, 2), keys, values, mask, spec, sinks).transpose(1, 2)

    def once(self, key, make):
        """make() computed at the first layer that asks, shared by the others (a paged cache's block indices: its
        table is read once per forward, not once per layer)."""
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]

    def mask(self, spec: AttentionSpec, kind: str, cache, k_pos: Tensor | None, dtype) -> Tensor:
        key = (spec.causal, spec.window, kind)
        if key not in self.masks:
            if k_pos is None:
                k_pos = cache.key_positions(self)
            self.masks[key] = additive(visible(self.positions, k_pos, spec), dtype)
        return self.masks[key]


@dataclass
class ExplicitContext:
    """Training: keys are given context K/V followed by the forward's own; visibility is an explicit
    mask (several packed blocks per row). context_kv: per layer (k, v) [B, N, H_kv, D]."""

    positions: Tensor  # [B, T]
    context_kv: list[tuple[Tensor, Tensor]]
    mask: Tensor  # [B, 1, T, N + T] bool
    rope: tuple[Tensor, Tensor] | None = None

    def attend(self, layer: int, spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor,
               sinks: Tensor | None = None) -> Tensor:
        ck, cv = self.context_kv[layer]
        keys, values = torch.cat([ck, k], dim=1).transpose(1, 2), torch.cat([cv, v], dim=1).transpose(1, 2)
        return sdpa(q.transpose(1, 2), keys, values, self.mask, spec, sinks).transpose(1, 2)
