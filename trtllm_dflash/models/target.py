"""The target model: a Qwen3 / Llama 3.x decoder, a hybrid Qwen3.5 one (Gated DeltaNet layers beside
gated full attention), or a mixture-of-experts one (Qwen3-MoE; gpt-oss with attention sinks and
sliding-window layers), with a paged cache and layer capture."""

from __future__ import annotations

import torch
from torch import nn

from ..cache.kv_cache import KVCache, LayerCacheSpec
from ..cache.state_cache import RecurrentState
from ..config.model import TargetConfig
from ..distributed.parallel import SINGLE, Parallel
from .attention import ForwardContext
from .gated_delta_net import GatedDeltaNet
from .layers import MLP, Attention, LMHead, RMSNorm, Rotary, VocabEmbedding
from .moe import MoE
from .registry import family_of


class HybridCache:
    """A KV cache for the full-attention layers and recurrent state for the linear-attention layers,
    each indexed by the layer's position among layers of its kind. Attention reads `layers` and
    `capacity` as it reads a KVCache's."""

    def __init__(self, kv: KVCache, state: RecurrentState):
        self.kv, self.state = kv, state
        self.layers, self.capacity, self.table = kv.layers, kv.capacity, kv.table

    def tensors(self) -> list[tuple[torch.Tensor, tuple[int, ...]]]:
        return self.kv.tensors() + self.state.tensors()

    def block_bytes(self) -> int:
        return self.kv.block_bytes()

    def move(self, src: int, dst: int, length: int) -> None:
        self.kv.move(src, dst, length)
        self.state.move(src, dst)


class TargetLayer(nn.Module):
    """cache_index: this layer's index among the attention layers (full and sliding-window), or among
    the linear-attention ones."""

    def __init__(self, cfg: TargetConfig, tp: Parallel, layer: int, kind: str = "full_attention", cache_index: int = 0,
                 attention=None):
        super().__init__()
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, tp)
        elif attention is not None:  # a family's own attention layer (TargetModel.attention)
            self.self_attn = attention(cfg, tp, layer)
        else:
            self.self_attn = Attention(cfg, tp, window=cfg.window(layer) if cfg.layer_types else None)
        if cfg.is_moe_layer(layer):
            self.mlp = MoE(cfg.moe, cfg.hidden_size, tp)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, tp)
        self.input_layernorm = target_norm(cfg)
        self.post_attention_layernorm = target_norm(cfg)
        self.kind, self.cache_index = kind, cache_index

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.kind == "linear_attention":
            x = x + self.linear_attn(h, self.cache_index, ctx.cache.state, ctx.slots, ctx.commit)
        else:
            x = x + self.self_attn(h, self.cache_index, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


def target_norm(cfg: TargetConfig) -> RMSNorm:
    return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.unit_offset_norms, cfg.norm_weight_fp32)


class TargetModel(nn.Module):
    """Weights are named as in the Hugging Face checkpoints (`model.layers.0...`, `lm_head`).

    With tp.world > 1 this is one rank's shard; every rank runs the same steps on the same inputs.
    A family folder's subclass may set `attention`, its attention layer's class, built as `(cfg, tp, layer)`.
    """

    attention = None

    def __init__(self, cfg: TargetConfig, tp: Parallel = SINGLE):
        super().__init__()
        self.config, self.tp = cfg, tp
        self.model = nn.Module()
        self.model.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        kinds = [cfg.layer_kind(i) for i in range(cfg.num_hidden_layers)]
        linear = [kind == "linear_attention" for kind in kinds]  # cache index: among layers of the same cache
        self.model.layers = nn.ModuleList(TargetLayer(cfg, tp, i, kind, linear[:i].count(linear[i]), self.attention)
                                          for i, kind in enumerate(kinds))
        self.model.norm = target_norm(cfg)
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, tp)
        self.rotary = Rotary(cfg.rope, cfg.rotary_dim)

    @property
    def embed_tokens(self) -> VocabEmbedding:
        return self.model.embed_tokens

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids: [B, T] at ctx.positions -> final-normed hidden [B, T, hidden], and the outputs of
        ctx.capture_layer_ids [B, T, n * hidden] (None when none are asked for).

        Capture id i is the output of decoder layer i, exactly Hugging Face `hidden_states[i + 1]`,
        which for the last layer is taken after the final norm (drafters are trained on that).
        """
        x = self.model.embed_tokens(input_ids)
        ctx.rope = self.rotary(ctx.positions, x.dtype)
        wanted = ctx.capture_layer_ids
        last = len(self.model.layers) - 1
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, ctx)
            if i in wanted and i != last:
                captured[i] = x
        x = self.model.norm(x)
        if last in wanted:
            captured[last] = x
        features = torch.cat([captured[i] for i in wanted], dim=-1) if wanted else None
        return x, features

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """-> fp32 logits over the whole vocabulary (gathered across ranks)."""
        return self.lm_head(hidden)

    def attention_layers(self) -> list[TargetLayer]:
        return [layer for layer in self.model.layers if layer.kind != "linear_attention"]

    def cache_specs(self) -> list[LayerCacheSpec]:
        """One per attention layer: sliding-window layers keep a ring of their window (kv_cache.py)."""
        windows = [layer.self_attn.spec.window for layer in self.attention_layers()]
        return [LayerCacheSpec("full") if w is None else LayerCacheSpec("window", w) for w in windows]

    def new_cache(self, num_slots: int, capacity: int, max_step_tokens: int = 1, table=None) -> KVCache | HybridCache:
        """max_step_tokens: the longest cached pass (the verify block, a prefill chunk): it sizes window rings and
        the recurrent layers' rollback stash; table: the block table its full layers are paged by (None: one of
        its own, every slot holding `capacity` positions)."""
        cfg, weight = self.config, self.lm_head.weight
        attention = self.attention_layers()
        kv_heads = attention[0].self_attn.spec.num_kv_heads if attention else 1  # this rank's
        kv = KVCache(self.cache_specs(), num_slots, kv_heads, capacity, cfg.head_dim, weight.dtype, weight.device,
                     max_step_tokens, table)
        if not cfg.is_hybrid:
            return kv
        linear = len(self.model.layers) - len(attention)
        state = RecurrentState(linear, num_slots, max_step_tokens, cfg.linear_attention, self.tp.world, weight.dtype,
                               weight.device)
        return HybridCache(kv, state)

    def reset(self, cache: KVCache | HybridCache, slots: torch.Tensor) -> None:
        """New sequences enter these slots: recurrent layers start from zero state (KV needs nothing)."""
        if isinstance(cache, HybridCache):
            cache.state.reset(slots)

    def commit(self, cache: KVCache | HybridCache, slots: torch.Tensor, lengths: torch.Tensor, t: int) -> None:
        """After a deferred (verify) pass of t tokens: keep each row's first lengths[b] tokens in the
        recurrent state, as if only they had been fed. KV entries past a row's length are never read."""
        if not isinstance(cache, HybridCache):
            return
        for layer in self.model.layers:
            if layer.kind == "linear_attention":
                layer.linear_attn.commit(layer.cache_index, cache.state, slots, lengths, t)


def build_target(cfg: TargetConfig, tp: Parallel = SINGLE) -> nn.Module:
    """The target model of cfg's family: its registry entry's model (a family folder's), or TargetModel."""
    family = family_of(cfg.model_type)
    build = family.model if family is not None and family.model is not None else TargetModel
    return build(cfg, tp)
