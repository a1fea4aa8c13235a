"""The target model: a Qwen3 / Llama 3.x decoder, or a hybrid Qwen3.5 one (Gated DeltaNet layers beside
gated full attention), with a slot cache and layer capture."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import TargetConfig
from ..kv_cache import KVCache
from ..parallel import SINGLE, Parallel
from ..state_cache import RecurrentState
from .gated_delta_net import GatedDeltaNet
from .layers import MLP, AttentionProjections, LMHead, RMSNorm, Rotary, VocabEmbedding, apply_rope


@dataclass
class TargetStep:
    """Per-forward inputs: which slots run, which tokens at which absolute positions."""

    input_ids: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, T] absolute positions; cache index == position
    slots: torch.Tensor  # [B] cache slot of each row
    cache: KVCache | HybridCache
    capture_layer_ids: tuple[int, ...] = ()
    # [B] tokens of each row that recurrent layers fold into their state in this pass (prefill: the
    # prompt lengths; plain decoding: ones); None defers it to `TargetModel.commit` (verify)
    commit: torch.Tensor | None = None


class HybridCache:
    """A KV cache for the full-attention layers and recurrent state for the linear-attention layers,
    each indexed by the layer's position among layers of its kind."""

    def __init__(self, kv: KVCache, state: RecurrentState):
        self.kv, self.state = kv, state
        self.write, self.read = kv.write, kv.read


def causal_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    # positions: [B, T] -> [B, 1, T, kv_len]; key j is visible to a query at position p iff j <= p.
    keys = torch.arange(kv_len, device=positions.device)
    return (keys[None, None, :] <= positions[:, :, None])[:, None]


class TargetLayer(nn.Module):
    """cache_index: this layer's index among the layers of its kind (full / linear attention)."""

    def __init__(self, cfg: TargetConfig, tp: Parallel, kind: str = "full_attention", cache_index: int = 0):
        super().__init__()
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, tp)
        else:
            self.self_attn = AttentionProjections(cfg, tp)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.unit_offset_norms)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.unit_offset_norms)
        self.kind, self.cache_index = kind, cache_index

    def forward(self, x, step: TargetStep, rope, mask, kv_len: int) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.kind == "linear_attention":
            x = x + self.linear_attn(h, self.cache_index, step.cache.state, step.slots, step.commit)
        else:
            x = x + self.attention(h, step, rope, mask, kv_len)
        return x + self.mlp(self.post_attention_layernorm(x))

    def attention(self, h, step: TargetStep, rope, mask, kv_len: int) -> torch.Tensor:
        attn, (cos, sin), layer = self.self_attn, rope, self.cache_index
        q, gate = attn.gated_query(h) if attn.output_gate else (attn.query(h), None)
        step.cache.write(layer, step.slots, step.positions, apply_rope(attn.key(h), cos, sin), attn.value(h))
        k, v = step.cache.read(layer, step.slots, kv_len)
        return attn.attend(apply_rope(q, cos, sin), k, v, mask, gate)


class TargetModel(nn.Module):
    """Weights are named as in the Hugging Face checkpoints (`model.layers.0...`, `lm_head`).

    With tp.world > 1 this is one rank's shard; every rank runs the same steps on the same inputs.
    """

    def __init__(self, cfg: TargetConfig, tp: Parallel = SINGLE):
        super().__init__()
        self.config, self.tp = cfg, tp
        self.model = nn.Module()
        self.model.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        kinds = [cfg.layer_kind(i) for i in range(cfg.num_hidden_layers)]
        self.model.layers = nn.ModuleList(TargetLayer(cfg, tp, kind, kinds[:i].count(kind))
                                          for i, kind in enumerate(kinds))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.unit_offset_norms)
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, tp)
        self.rotary = Rotary(cfg.rope, cfg.rotary_dim)

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
            x = layer(x, step, rope, mask, kv_len)
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

    def new_cache(self, num_slots: int, capacity: int, block: int = 1) -> KVCache | HybridCache:
        """block: the longest pass whose recurrent-state commit is deferred (the verify block)."""
        cfg, weight = self.config, self.lm_head.weight
        attention = [layer for layer in self.model.layers if layer.kind == "full_attention"]
        kv_heads = attention[0].self_attn.num_kv_heads if attention else 1  # this rank's
        kv = KVCache(len(attention), num_slots, kv_heads, capacity, cfg.head_dim, weight.dtype, weight.device)
        if not cfg.is_hybrid:
            return kv
        linear = len(self.model.layers) - len(attention)
        state = RecurrentState(linear, num_slots, block, cfg.linear_attention, self.tp.world, weight.dtype,
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
