"""DeepSeek-V4 targets (`deepseek_v4`), as transformers 5.24 `models/deepseek_v4/modeling_deepseek_v4.py` computes
them (config.py has the fields, layers.py the pieces, checkpoint.py the weight names).

- The residual is `hc_mult` streams [B, T, N, H]: every block reads them collapsed and writes back through
  hyper-connections; the final HyperHead collapses them before the norm and the LM head.
- Every layer attends to a sliding window of one K=V head; CSA and HCA layers add compressed entries, one per
  closed window of `rate` tokens (CSA's windows overlap the previous one, and its lightning indexer keeps the
  index_topk best per query).
- Every MLP is routed experts (hash-routed by token in the `hash_moe` layers) plus one shared expert, all with
  limited SwiGLU.
The drafter's context features are the mean over the streams of decoder-layer outputs at target_layer_ids, the last
layer's too (vLLM's DeepseekV4 model appends `hidden_states.mean(dim=1)` per aux layer for its drafters).

Caches (`DeepseekV4Cache`): each layer's window ring of K=V (kv_cache.py), and for each CSA / HCA layer the
per-token kv / gate projections its entries pool, at index == position. An entry is a function of its window's
tokens only (and the previous window's, in CSA), so each pass pools every closed window of the row again from those:
rolling back a rejected block costs nothing, at O(context) work per pass (not the incremental pooling of a serving
stack; docs/models.md).
"""

from __future__ import annotations

import torch
from torch import nn

from ...cache.kv_cache import KVCache, LayerCacheSpec
from ...config.model import TargetConfig
from ...distributed.parallel import SINGLE, Parallel
from ..attention import ForwardContext
from ..layers import LMHead, VocabEmbedding
from ..moe import Experts
from .layers import (
    DsAttention,
    DsRMSNorm,
    DsRotary,
    HashRouter,
    HyperConnection,
    HyperHead,
    LimitedMLP,
    ScoreRouter,
    mix,
)


class DsMoE(nn.Module):
    """DeepseekV4SparseMoeBlock: routed experts (hash or score router) plus the shared expert."""

    def __init__(self, cfg: TargetConfig, layer: int, tp: Parallel):
        super().__init__()
        ds, moe, h = cfg.deepseek_v4, cfg.moe, cfg.hidden_size
        hashed = ds.mlp_types[layer] == "hash_moe"
        self.gate = HashRouter(ds, moe, h, cfg.vocab_size) if hashed else ScoreRouter(ds, moe, h)
        self.experts = Experts(moe, h, tp)
        self.shared_experts = LimitedMLP(h, moe.intermediate_size, ds.swiglu_limit, tp)
        self.tp = tp

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.gate(flat, input_ids.reshape(-1))
        routed = self.tp.all_reduce(self.experts(flat, weights, ids))
        return (routed + self.shared_experts(flat)).view_as(x)


class DsLayer(nn.Module):
    """DeepseekV4DecoderLayer: attention and MoE blocks, each between hyper-connections."""

    def __init__(self, cfg: TargetConfig, layer: int, tp: Parallel):
        super().__init__()
        ds, h, eps = cfg.deepseek_v4, cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = DsAttention(ds, ds.layer_types[layer], h, cfg.num_attention_heads, cfg.head_dim,
                                     cfg.sliding_window, eps)
        self.mlp = DsMoE(cfg, layer, tp)
        self.input_layernorm = DsRMSNorm(h, eps)
        self.post_attention_layernorm = DsRMSNorm(h, eps)
        self.attn_hc = HyperConnection(ds, h, eps)
        self.ffn_hc = HyperConnection(ds, h, eps)
        self.index = layer

    def forward(self, x: torch.Tensor, ctx, input_ids: torch.Tensor) -> torch.Tensor:
        """x: the streams [B, T, N, H] -> [B, T, N, H]."""
        post, comb, collapsed = self.attn_hc(x)
        x = mix(x, self.self_attn(self.input_layernorm(collapsed), self.index, ctx), post, comb)
        post, comb, collapsed = self.ffn_hc(x)
        return mix(x, self.mlp(self.post_attention_layernorm(collapsed), input_ids), post, comb)


class DeepseekV4Target(nn.Module):
    """The interface of models/target.py's TargetModel (forward, logits, embed_tokens, caches), DeepSeek-V4's math.

    Weights are named as transformers' DeepseekV4ForCausalLM holds them (checkpoint_layout.py maps experts and
    dequantizes FP8 blocks). With tp.world > 1 this would be one rank's shard: only the embedding, the LM head and
    the experts split (attention is replicated, as transformers' tp plan has it)."""

    def __init__(self, cfg: TargetConfig, tp: Parallel = SINGLE):
        super().__init__()
        ds = cfg.deepseek_v4
        self.config, self.tp = cfg, tp
        self.model = nn.Module()
        self.model.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.model.layers = nn.ModuleList(DsLayer(cfg, i, tp) for i in range(cfg.num_hidden_layers))
        self.model.norm = DsRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.model.hc_head = HyperHead(ds, cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, tp)
        self.rotary = DsRotary(ds)
        self.rates = sorted({r for r in (ds.compress_rate(i) for i in range(cfg.num_hidden_layers)) if r})

    @property
    def embed_tokens(self) -> VocabEmbedding:
        return self.model.embed_tokens

    def forward(self, input_ids: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids: [B, T] at ctx.positions -> final-normed hidden [B, T, hidden], and the stream means of
        ctx.capture_layer_ids' outputs [B, T, n * hidden] (None when none are asked for)."""
        x = self.model.embed_tokens(input_ids)
        ctx.rope = self.ropes(ctx, x.dtype)
        x = x.unsqueeze(2).expand(-1, -1, self.config.deepseek_v4.hc_mult, -1).contiguous()
        wanted, captured = ctx.capture_layer_ids, {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, ctx, input_ids)
            if i in wanted:
                captured[i] = x.mean(dim=2)
        hidden = self.model.norm(self.model.hc_head(x))
        return hidden, torch.cat([captured[i] for i in wanted], dim=-1) if wanted else None

    def ropes(self, ctx: ForwardContext, dtype: torch.dtype) -> dict:
        """cos, sin of the queries ("main", "compress": [B, T, R / 2]) and of the entries of each compression rate
        (("entries", rate): [W, R / 2] at positions 0, rate, 2 rate, ... of the longest row's closed windows)."""
        ropes = {kind: rotary(ctx.positions, dtype) for kind, rotary in self.rotary.by_kind.items()}
        span = ctx.positions.shape[1] if ctx.prefilling else ctx.kv_len
        for rate in self.rates:
            starts = torch.arange(span // rate, device=ctx.positions.device) * rate
            ropes[("entries", rate)] = self.rotary.by_kind["compress"](starts, dtype)
        return ropes

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def new_cache(self, num_slots: int, capacity: int, max_step_tokens: int = 1, table=None) -> DeepseekV4Cache:
        """table: the generator's block table. Every layer here is a window ring and the compressor stores are per
        row, so nothing is paged by it: the table only accounts for positions (prefix reuse is refused, as for any
        target with window rings: `CacheManager.reusable`)."""
        cfg, weight = self.config, self.lm_head.weight
        widths = {i: layer.self_attn.compressor.cached_width for i, layer in enumerate(self.model.layers)
                  if layer.self_attn.compressor is not None}
        return DeepseekV4Cache(cfg.num_hidden_layers, cfg.sliding_window, cfg.head_dim, widths, num_slots, capacity,
                               weight.dtype, weight.device, max_step_tokens, table)

    def reset(self, cache, slots: torch.Tensor) -> None:
        """Nothing to reset: entries past a slot's length are never read."""

    def commit(self, cache, slots: torch.Tensor, lengths: torch.Tensor, t: int) -> None:
        """Nothing to commit: no recurrent state (compressed entries are pooled again from the tokens each pass)."""


class TokenStore:
    """Per-token values of one layer at index == position: x [S, C + 1, W] (like kv_cache.FullKV)."""

    def __init__(self, x: torch.Tensor):
        self.x = x

    def write(self, ctx, values: torch.Tensor) -> None:
        # values: [B, T, W] at ctx.positions of slots ctx.slots
        self.x[ctx.slots[:, None], ctx.positions] = values.detach()

    def view(self, rows: slice | torch.Tensor, kv_len: int) -> torch.Tensor:
        return self.x[rows, :kv_len]  # [B, kv_len, W]


class DeepseekV4Cache:
    """Every layer's window ring of K=V (`layers`, as KVCache's: K and V rings alike), and the CSA / HCA layers'
    per-token compressor projections (`tokens`: layer -> TokenStore)."""

    def __init__(self, num_layers: int, window: int, head_dim: int, widths: dict[int, int], num_slots: int,
                 capacity: int, dtype: torch.dtype, device, max_step_tokens: int = 1, table=None):
        self.kv = KVCache([LayerCacheSpec("window", window)] * num_layers, num_slots, 1, capacity, head_dim, dtype,
                          device, max_step_tokens, table)
        self.layers, self.capacity, self.table = self.kv.layers, capacity, self.kv.table
        self.tokens = {i: TokenStore(torch.zeros(num_slots, capacity + 1, w, dtype=dtype, device=device))
                       for i, w in widths.items()}

    def tensors(self) -> list[tuple[torch.Tensor, tuple[int, ...]]]:
        return self.kv.tensors() + [(store.x, (0, 1)) for store in self.tokens.values()]

    def move(self, src: int, dst: int, length: int) -> None:
        self.kv.move(src, dst, length)
        for store in self.tokens.values():
            store.x[dst, :length] = store.x[src, :length]
