"""Gemma 4 targets, dense and MoE (`gemma4_text`, and the language model of the multimodal `gemma4`), as
transformers 5.24 `models/gemma4/modeling_gemma4.py` computes them.

What sets the family apart (config.py has the fields, layers.py the pieces):
- embeddings scaled by sqrt(hidden) (rounded to the weights' dtype, as Gemma4TextScaledWordEmbedding does);
  the drafter embeds its block with the raw rows (`embed_tokens`), as vLLM's DFlash does for this family (its
  proposer hands the drafter the target's `model.embed_tokens` module, vllm/v1/spec_decode/llm_base_proposer.py
  `_maybe_share_embeddings`; its Gemma 4 scales only in `embed_input_ids`, models/gemma4.py);
- per-layer input embeddings: a second table gives every layer its own [P] input, mixed with a projection of
  the embedding and fed in after the MLP through a GELU gate;
- sandwich norms (after attention and after the MLP too), a per-layer scalar on the layer's output;
- sliding and full-attention layers with their own head_dim, KV heads and RoPE; the last `num_kv_shared_layers`
  layers reuse the K/V of the last earlier layer of their type, and keep no cache of their own;
- MoE layers add routed experts beside the dense MLP, each branch with its own norms;
- tied LM head, optional final logit soft-cap (the target's logits only: the drafter's use the bare head).
The drafter's context features are decoder-layer outputs at target_layer_ids, the last one after the final
norm (transformers' hidden_states[i + 1]), as for every family (models/target.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...cache.kv_cache import BlockTable, KVCache, LayerCacheSpec
from ...config.family import FULL, SLIDING
from ...config.model import TargetConfig
from ...distributed.parallel import SINGLE, HeadSplit, Parallel
from ..attention import ForwardContext
from ..layers import LMHead, VocabEmbedding
from ..moe import Experts
from .layers import GeluMLP, Gemma4Router, Gemma4SelfAttention, GemmaRMSNorm, LayerTypeRotary


def fp32(value: float) -> float:
    """value rounded to fp32 (transformers keeps Gemma 4's embedding scales in fp32 buffers)."""
    return float(torch.tensor(value, dtype=torch.float32, device="cpu"))


def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x times `scale` rounded to x's dtype first (Gemma4TextScaledWordEmbedding: embed_scale.to(weight.dtype))."""
    return x * x.new_full((), scale)


class Gemma4Layer(nn.Module):
    """Gemma4TextDecoderLayer. cache_index: the cache layer of the K/V it attends to (a shared layer's source's)."""

    def __init__(self, cfg: TargetConfig, layer: int, cache_index: int, tp: Parallel = SINGLE):
        super().__init__()
        g, h, eps = cfg.gemma4, cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Gemma4SelfAttention(cfg, layer, tp)
        wide = 2 if g.double_wide_mlp and g.shares_kv(layer, cfg.num_hidden_layers) else 1
        self.mlp = GeluMLP(h, cfg.intermediate_size * wide, False, tp)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, GemmaRMSNorm(h, eps))
        self.register_buffer("layer_scalar", torch.ones(1))
        self.per_layer = g.per_layer_input > 0
        if self.per_layer:
            self.per_layer_input_gate = nn.Linear(h, g.per_layer_input, bias=False)
            self.per_layer_projection = nn.Linear(g.per_layer_input, h, bias=False)
            self.post_per_layer_input_norm = GemmaRMSNorm(h, eps)
        self.moe = cfg.moe is not None
        if self.moe:
            self.router = Gemma4Router(cfg.moe, h, eps)
            self.experts = Experts(cfg.moe, h, tp)
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                setattr(self, name, GemmaRMSNorm(h, eps))
        self.cache_index, self.tp = cache_index, tp

    def forward(self, x: torch.Tensor, ctx, per_layer_input: torch.Tensor | None, shared: dict) -> torch.Tensor:
        """x: [B, T, hidden]; per_layer_input: [B, T, P] (None without per-layer embeddings)."""
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), self.cache_index, ctx, shared))
        h = self.mlp(self.pre_feedforward_layernorm(x))
        if self.moe:  # the experts see the residual stream, not the dense MLP's input
            h = self.post_feedforward_layernorm_1(h) + self.post_feedforward_layernorm_2(self.routed(x))
        x = x + self.post_feedforward_layernorm(h)
        if self.per_layer:
            gate = F.gelu(self.per_layer_input_gate(x), approximate="tanh")
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gate * per_layer_input))
        return x * self.layer_scalar

    def routed(self, x: torch.Tensor) -> torch.Tensor:
        """The expert branch: x [B, T, H] -> [B, T, H], all-reduced over ranks."""
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.router(flat)
        out = self.experts(self.pre_feedforward_layernorm_2(flat), weights, ids)
        return self.tp.all_reduce(out.to(x.dtype)).view_as(x)


class Gemma4Target(nn.Module):
    """The interface of models/target.py's TargetModel (forward, logits, embed_tokens, caches), Gemma 4's math.

    Weights are named as in the text-only checkpoints (`model.layers.0...`; checkpoint_layout.py maps the
    multimodal one's `model.language_model.*`). With tp.world > 1 this is one rank's shard: attention heads, MLPs
    and experts split, the per-layer-embedding weights and the router replicated.
    """

    def __init__(self, cfg: TargetConfig, tp: Parallel = SINGLE):
        super().__init__()
        g = cfg.gemma4
        self.config, self.tp = cfg, tp
        self.model = nn.Module()
        self.model.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        if g.per_layer_input:
            width = cfg.num_hidden_layers * g.per_layer_input
            self.model.embed_tokens_per_layer = VocabEmbedding(g.per_layer_vocab, width)
            self.model.per_layer_model_projection = nn.Linear(cfg.hidden_size, width, bias=False)
            self.model.per_layer_projection_norm = GemmaRMSNorm(g.per_layer_input, cfg.rms_norm_eps)
        own = [i for i in range(cfg.num_hidden_layers) if not g.shares_kv(i, cfg.num_hidden_layers)]
        self.cache_kinds = [cfg.layer_types[i] for i in own]  # the cache's layers: those computing K/V, in order
        self.model.layers = nn.ModuleList(
            Gemma4Layer(cfg, i, own.index(g.kv_source(i, cfg.layer_types)), tp) for i in range(cfg.num_hidden_layers))
        self.model.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, tp)
        self.rotary = LayerTypeRotary(g, set(cfg.layer_types))
        # as transformers computes them: fp32 values (rounded to the weights' dtype where they multiply an embedding)
        self.embed_scale = fp32(cfg.hidden_size ** 0.5)
        self.per_layer_embed_scale = fp32(g.per_layer_input ** 0.5)

    @property
    def embed_tokens(self) -> VocabEmbedding:
        """The raw embedding rows: what the drafter embeds its block with (vLLM shares this module with it)."""
        return self.model.embed_tokens

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids: [B, T] at ctx.positions -> final-normed hidden [B, T, hidden], and the outputs of
        ctx.capture_layer_ids [B, T, n * hidden] (None when none are asked for; the last layer's after the norm)."""
        x = scaled(self.model.embed_tokens(input_ids), self.embed_scale)
        per_layer = self.per_layer_inputs(input_ids, x)
        ctx.rope = self.rotary(ctx.positions, x.dtype)
        wanted, last = ctx.capture_layer_ids, len(self.model.layers) - 1
        captured, shared = {}, {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, ctx, None if per_layer is None else per_layer[:, :, i], shared)
            if i in wanted and i != last:
                captured[i] = x
        x = self.model.norm(x)
        if last in wanted:
            captured[last] = x
        return x, torch.cat([captured[i] for i in wanted], dim=-1) if wanted else None

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor | None:
        """-> [B, T, L, P]: (norm(projection of the scaled embedding) + the token's per-layer rows) / sqrt(2)
        (Gemma4TextModel.get_per_layer_inputs, project_per_layer_inputs); None without per-layer embeddings."""
        g, m = self.config.gemma4, self.model
        if not g.per_layer_input:
            return None
        shape = (self.config.num_hidden_layers, g.per_layer_input)
        if g.per_layer_vocab < self.config.vocab_size:  # ids past the table read row 0 (vLLM's Gemma4 guard)
            input_ids = torch.where(input_ids < g.per_layer_vocab, input_ids, 0)
        own = scaled(m.embed_tokens_per_layer(input_ids), self.per_layer_embed_scale).unflatten(-1, shape)
        projected = m.per_layer_model_projection(embeds) * self.config.hidden_size ** -0.5
        return (m.per_layer_projection_norm(projected.unflatten(-1, shape)) + own) * 2.0 ** -0.5

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """-> fp32 logits over the whole vocabulary, soft-capped in the weights' dtype as transformers does."""
        cap = self.config.gemma4.final_logit_softcapping
        if cap is None:
            return self.lm_head(hidden)
        logits = self.lm_head(hidden).to(hidden.dtype)  # exact: the head's products in that dtype, made fp32
        return (torch.tanh(logits / cap) * cap).float()

    def new_cache(self, num_slots: int, capacity: int, max_step_tokens: int = 1, table=None) -> Gemma4Cache:
        cfg, weight = self.config, self.lm_head.weight
        shapes = {}
        for kind in set(self.cache_kinds):
            att = cfg.gemma4.attention(kind)
            split = HeadSplit(cfg.num_attention_heads, att.num_kv_heads, self.tp.world)
            shapes[kind] = split.local_kv_heads, att.head_dim
        return Gemma4Cache(self.cache_kinds, shapes, cfg.sliding_window, num_slots, capacity, weight.dtype,
                           weight.device, max_step_tokens, table)

    def reset(self, cache, slots: torch.Tensor) -> None:
        """Nothing to reset: attention caches only (entries past a slot's length are never read)."""

    def commit(self, cache, slots: torch.Tensor, lengths: torch.Tensor, t: int) -> None:
        """Nothing to commit: no recurrent state."""


class Gemma4Cache:
    """K/V of the layers that compute their own, as `KVCache` layers in layer order (ctx.cache.layers[i] is the
    i-th such layer): sliding layers' window rings in one KVCache, full layers' in another, since their head_dim
    and KV heads differ. Layers sharing K/V read their source's."""

    def __init__(self, kinds: list[str], shapes: dict[str, tuple[int, int]], window: int | None, num_slots: int,
                 capacity: int, dtype: torch.dtype, device, max_step_tokens: int = 1, table=None):
        """kinds: the type of each layer with a cache, in order; shapes: type -> (this rank's KV heads, head_dim);
        table: the block table the full layers' pool is paged by (sliding layers keep rings per slot)."""
        self.table = table if table is not None else BlockTable.contiguous(num_slots, capacity, device)
        self.groups = {}
        for kind in (SLIDING, FULL):
            if kind in kinds:
                spec = LayerCacheSpec("window", window) if kind == SLIDING else LayerCacheSpec("full")
                kv_heads, head_dim = shapes[kind]
                self.groups[kind] = KVCache([spec] * kinds.count(kind), num_slots, kv_heads, capacity, head_dim, dtype,
                                            device, max_step_tokens, self.table)
        rest = {kind: iter(group.layers) for kind, group in self.groups.items()}
        self.layers = [next(rest[kind]) for kind in kinds]
        self.capacity = capacity

    def tensors(self) -> list[tuple[torch.Tensor, tuple[int, ...]]]:
        return [t for group in self.groups.values() for t in group.tensors()]

    def block_bytes(self) -> int:
        return sum(group.block_bytes() for group in self.groups.values())

    def move(self, src: int, dst: int, length: int) -> None:
        for group in self.groups.values():
            group.move(src, dst, length)
