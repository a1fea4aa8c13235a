"""The pieces of a DeepSeek-V4 decoder layer (transformers 5.24 `models/deepseek_v4/modeling_deepseek_v4.py`):
its norms, interleaved RoPE on each head's trailing channels, hyper-connections (Sinkhorn-projected stream mixing),
the compressors of compressed-sparse (CSA) and heavily-compressed (HCA) attention with CSA's lightning indexer,
attention with one K=V head, learned sinks and a grouped low-rank output, and the hash / score routers.

Checkpoint names are transformers' (`self_attn.q_a_proj`, `self_attn.compressor.indexer.scorer.weights_proj`,
`attn_hc.fn`, `mlp.gate.tid2eid`, ...); experts as models/moe.py holds them (checkpoint_layout.py converts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...config.moe import MoeConfig
from ..attention import AttentionSpec, additive, eager_with_sinks
from ..layers import MLP, RMSNorm, Rotary
from .config import CSA, SLIDING, DeepseekV4Config


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 x / rms(x), as DeepseekV4RMSNorm computes it (rsqrt of the mean square)."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class DsRMSNorm(RMSNorm):
    """DeepseekV4RMSNorm: (weight in fp32 * normalized x in fp32), cast back."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps, weight_fp32=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(rms(x, self.eps), self.weight, x.dtype)


def unweighted_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """DeepseekV4UnweightedRMSNorm: x * rsqrt(mean square in fp32 + eps) cast to x's dtype."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


class HalfRotary(Rotary):
    """cos, sin [B, T, R / 2] (one angle per interleaved channel pair; DeepseekV4RotaryEmbedding), in `dtype`."""

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.freqs_on(positions.device)
        return (freqs.cos() * self.scaling).to(dtype), (freqs.sin() * self.scaling).to(dtype)


class DsRotary:
    """The two RoPEs ("main": sliding-only layers; "compress": CSA / HCA layers, their entries and indexer). Not a
    module, like `Rotary` (step_mode.CompiledPass calls `freqs_on`)."""

    def __init__(self, ds: DeepseekV4Config):
        self.by_kind = {"main": HalfRotary(ds.main_rope, ds.rope_dim), "compress": HalfRotary(ds.compress_rope,
                                                                                             ds.rope_dim)}

    def freqs_on(self, device: torch.device) -> None:
        for rotary in self.by_kind.values():
            rotary.freqs_on(device)


def rope_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., D]: its last R channels turned in interleaved pairs by cos, sin [..., R / 2] (broadcast), in fp32
    (apply_rotary_pos_emb of transformers' DeepSeek-V4); the leading D - R pass."""
    cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    r = cos.shape[-1]
    nope, rope = x[..., :-r], x[..., -r:]
    turned = torch.stack((-rope[..., 1::2], rope[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat([nope, (rope.float() * cos + turned.float() * sin).to(x.dtype)], dim=-1)


class HyperConnection(nn.Module):
    """DeepseekV4HyperConnection: from the hc streams [B, T, N, H], the weights that collapse them into a block's
    input (pre), spread its output back (post) and mix the streams (comb, made doubly stochastic by Sinkhorn)."""

    def __init__(self, ds: DeepseekV4Config, hidden: int, eps: float):
        super().__init__()
        n = ds.hc_mult
        self.fn = nn.Parameter(torch.empty((2 + n) * n, n * hidden))
        self.base = nn.Parameter(torch.empty((2 + n) * n))
        self.scale = nn.Parameter(torch.empty(3))
        self.n, self.iters, self.hc_eps, self.eps = n, ds.hc_sinkhorn_iters, ds.hc_eps, eps

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [B, T, N, H] -> post [B, T, N], comb [B, T, N, N] (fp32), the collapsed input [B, T, H]."""
        n = self.n
        mixes = F.linear(unweighted_rms(streams.flatten(2).float(), self.eps), self.fn.float())
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.split([n, n, n * n])
        pre_s, post_s, comb_s = self.scale.unbind(0)
        pre = torch.sigmoid(pre_w * pre_s + pre_b) + self.hc_eps
        post = 2 * torch.sigmoid(post_w * post_s + post_b)
        comb = torch.softmax(comb_w.unflatten(-1, (n, n)) * comb_s + comb_b.view(n, n), dim=-1) + self.hc_eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.hc_eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.hc_eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.hc_eps)
        return post, comb, (pre.unsqueeze(-1) * streams).sum(dim=2).to(streams.dtype)


def mix(streams: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """The block's output spread over the streams plus the streams mixed: [B, T, N, H]."""
    dtype = streams.dtype
    return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), streams)


class HyperHead(nn.Module):
    """DeepseekV4HyperHead: the final collapse of the streams [B, T, N, H] -> [B, T, H]."""

    def __init__(self, ds: DeepseekV4Config, hidden: int, eps: float):
        super().__init__()
        self.hc_fn = nn.Parameter(torch.empty(ds.hc_mult, ds.hc_mult * hidden))
        self.hc_base = nn.Parameter(torch.empty(ds.hc_mult))
        self.hc_scale = nn.Parameter(torch.empty(1))
        self.hc_eps, self.eps = ds.hc_eps, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixes = F.linear(unweighted_rms(x.flatten(2).float(), self.eps), self.hc_fn.float())
        pre = torch.sigmoid(mixes * self.hc_scale.float() + self.hc_base.float()) + self.hc_eps
        return (pre.unsqueeze(-1) * x).sum(dim=2).to(x.dtype)


def pooled(kv: torch.Tensor, gate: torch.Tensor, rate: int, dim: int,
           overlap: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token projections kv, gate [B, L, (2 if overlap) * dim] (position bias added) -> the slots each of the
    L // rate windows pools, kv and gate [B, W, S, dim]. HCA: the window's own tokens (S = rate). CSA (overlap):
    the previous window's first halves (Ca; none before window 0: gate -inf) then its own second halves (Cb)."""
    b, w = kv.shape[0], kv.shape[1] // rate
    kv, gate = kv[:, : w * rate].unflatten(1, (w, rate)), gate[:, : w * rate].unflatten(1, (w, rate))
    if not overlap:
        return kv, gate
    slots_kv = kv.new_zeros((b, w, 2 * rate, dim))
    slots_gate = gate.new_full((b, w, 2 * rate, dim), float("-inf"))
    slots_kv[:, :, rate:], slots_gate[:, :, rate:] = kv[..., dim:], gate[..., dim:]
    slots_kv[:, 1:, :rate], slots_gate[:, 1:, :rate] = kv[:, :-1, :, :dim], gate[:, :-1, :, :dim]
    return slots_kv, slots_gate


class Pool(nn.Module):
    """One compressed series: per-token kv and gate projections, a per-slot position bias; each closed window of
    `rate` tokens pools to one entry (softmax of the gates over its slots, per channel), normalized and turned to
    the position of the window's first token (DeepseekV4HCACompressor / CSACompressor / Indexer)."""

    def __init__(self, hidden: int, dim: int, rate: int, overlap: bool, eps: float):
        super().__init__()
        width = 2 * dim if overlap else dim
        self.kv_proj = nn.Linear(hidden, width, bias=False)
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.position_bias = nn.Parameter(torch.empty(rate, width))
        self.kv_norm = DsRMSNorm(dim, eps)
        self.dim, self.rate, self.overlap, self.width = dim, rate, overlap, width

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] -> kv | gate [B, T, 2 * width]: what the cache keeps per token."""
        return torch.cat([self.kv_proj(x), self.gate_proj(x)], dim=-1)

    def entries(self, tokens: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """tokens [B, L, 2 * width]: `project` of positions 0..L-1 -> entries [B, L // rate, dim]; entry w pools
        positions up to (w + 1) * rate - 1 (later ones read junk past a row's tokens: no query sees them)."""
        kv, gate = tokens.split(self.width, dim=-1)
        w = kv.shape[1] // self.rate
        bias = self.position_bias.repeat(w, 1)  # [w * rate, width]: position within its window
        kv, gate = pooled(kv[:, : w * self.rate], gate[:, : w * self.rate] + bias, self.rate, self.dim, self.overlap)
        out = self.kv_norm((kv * gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)).sum(dim=2))
        cos, sin = rope
        return rope_tail(out, cos[:w], sin[:w])


class Indexer(Pool):
    """DeepseekV4Indexer: its own CSA-style entries at index_head_dim (the Pool), and a score for every entry and
    query, sum_h w_h relu(q_h . k) (fp32), keeping the index_topk best of those the query may see."""

    def __init__(self, ds: DeepseekV4Config, hidden: int, rate: int, eps: float):
        super().__init__(hidden, ds.index_head_dim, rate, True, eps)
        self.q_b_proj = nn.Linear(ds.q_lora_rank, ds.index_n_heads * ds.index_head_dim, bias=False)
        self.scorer = nn.Module()
        self.scorer.weights_proj = nn.Linear(hidden, ds.index_n_heads, bias=False)
        self.heads, self.topk = ds.index_n_heads, ds.index_topk

    def select(self, x: torch.Tensor, q_residual: torch.Tensor, keys: torch.Tensor, seen: torch.Tensor,
               rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [B, T, H]; q_residual [B, T, q_lora_rank]; keys [B, W, dim]; seen [B, T, W] -> chosen [B, T, W]."""
        cos, sin = rope
        q = rope_tail(self.q_b_proj(q_residual).unflatten(-1, (self.heads, self.dim)), cos[:, :, None],
                      sin[:, :, None])
        scores = F.relu(torch.matmul(q.float(), keys.transpose(-1, -2).float().unsqueeze(1))) * self.dim ** -0.5
        weights = self.scorer.weights_proj(x).float() * self.heads ** -0.5  # [B, T, heads]
        scores = (scores * weights.unsqueeze(-1)).sum(dim=2).masked_fill(~seen, float("-inf"))  # [B, T, W]
        top = scores.topk(min(self.topk, scores.shape[-1]), dim=-1).indices
        return torch.zeros_like(seen).scatter_(-1, top, True) & seen


class Compressor(Pool):
    """The compressed entries a CSA / HCA layer's queries attend to beside their window (self_attn.compressor)."""

    def __init__(self, ds: DeepseekV4Config, kind: str, hidden: int, head_dim: int, eps: float):
        rate = ds.compress_rates[kind]
        super().__init__(hidden, head_dim, rate, kind == CSA, eps)
        self.indexer = Indexer(ds, hidden, rate, eps) if kind == CSA else None

    @property
    def cached_width(self) -> int:
        """Values the cache keeps per token: kv and gate of the entries (and of the indexer's)."""
        return 2 * self.width + (2 * self.indexer.width if self.indexer is not None else 0)

    def forward(self, x: torch.Tensor, q_residual: torch.Tensor, ctx, store) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> entries [B, 1, W, D] and their additive mask [B, 1, T, W]: query t sees entry w once
        its window closed, w < (t + 1) // rate (and, in CSA, when the indexer keeps it)."""
        index = self.indexer
        tokens = torch.cat([self.project(x)] + ([index.project(x)] if index is not None else []), dim=-1)
        store.write(ctx, tokens)
        if not ctx.prefilling:  # every position of the rows so far, this pass's included
            tokens = store.view(slice(0, x.shape[0]) if ctx.rows is None else ctx.rows, ctx.kv_len)
        rope = ctx.rope[("entries", self.rate)]
        own = 2 * self.width
        entries = self.entries(tokens[..., :own], rope)
        w = entries.shape[1]
        seen = torch.arange(w, device=x.device) < ((ctx.positions + 1) // self.rate)[..., None]  # [B, T, W]
        if index is not None and w:
            seen = index.select(x, q_residual, index.entries(tokens[..., own:], rope), seen, ctx.rope["compress"])
        return entries.unsqueeze(1), additive(seen.unsqueeze(1), x.dtype)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, groups: int) -> torch.Tensor:
    """DeepseekV4GroupedLinear: x [B, T, G, I] -> [B, T, G, O], group g through its rows weight[g*O:(g+1)*O]."""
    w = weight.view(groups, -1, x.shape[-1]).transpose(1, 2)  # [G, I, O]
    y = torch.bmm(x.reshape(-1, groups, x.shape[-1]).transpose(0, 1), w).transpose(0, 1)
    return y.reshape(*x.shape[:-2], groups, -1)


class DsAttention(nn.Module):
    """DeepseekV4Attention: a low-rank query (q_a_proj, q_a_norm, q_b_proj, per-head unweighted norm), one K=V head
    (kv_proj, kv_norm), RoPE on the trailing rope_dim channels (the layer kind's RoPE), the sliding window plus a
    CSA / HCA layer's compressed entries, per-head sinks; the output's rope channels turned back by the query's
    angle, then the grouped low-rank output projection (o_a_proj per group, o_b_proj)."""

    def __init__(self, ds: DeepseekV4Config, kind: str, hidden: int, heads: int, head_dim: int, window: int,
                 eps: float):
        super().__init__()
        self.q_a_proj = nn.Linear(hidden, ds.q_lora_rank, bias=False)
        self.q_a_norm = DsRMSNorm(ds.q_lora_rank, eps)
        self.q_b_proj = nn.Linear(ds.q_lora_rank, heads * head_dim, bias=False)
        self.kv_proj = nn.Linear(hidden, head_dim, bias=False)
        self.kv_norm = DsRMSNorm(head_dim, eps)
        self.o_a_proj = nn.Module()
        self.o_a_proj.weight = nn.Parameter(torch.empty(ds.o_groups * ds.o_lora_rank, heads * head_dim // ds.o_groups))
        self.o_b_proj = nn.Linear(ds.o_groups * ds.o_lora_rank, hidden, bias=False)
        self.sinks = nn.Parameter(torch.empty(heads))
        self.compressor = None if kind == SLIDING else Compressor(ds, kind, hidden, head_dim, eps)
        self.spec = AttentionSpec(heads, 1, head_dim, window=window)
        self.rope_kind = "main" if kind == SLIDING else "compress"
        self.groups, self.eps = ds.o_groups, eps

    def forward(self, x: torch.Tensor, index: int, ctx) -> torch.Tensor:
        """x [B, T, H] -> [B, T, H]; index: this layer's caches in ctx.cache."""
        s = self.spec
        cos, sin = ctx.rope[self.rope_kind]  # [B, T, R / 2]
        q_residual = self.q_a_norm(self.q_a_proj(x))
        q = unweighted_rms(self.q_b_proj(q_residual).unflatten(-1, (s.num_heads, s.head_dim)), self.eps)
        q = rope_tail(q, cos[:, :, None], sin[:, :, None])
        kv = rope_tail(self.kv_norm(self.kv_proj(x)), cos, sin).unsqueeze(2)  # [B, T, 1, D]
        keys, mask = self.window(kv, index, ctx)
        if self.compressor is not None:
            entries, entry_mask = self.compressor(x, q_residual, ctx, ctx.cache.tokens[index])
            keys, mask = torch.cat([keys, entries], dim=2), torch.cat([mask, entry_mask], dim=-1)
        out = eager_with_sinks(q.transpose(1, 2), keys, keys, mask, s, self.sinks).transpose(1, 2)  # [B, T, H, D]
        out = rope_tail(out, cos[:, :, None], -sin[:, :, None])
        grouped = grouped_linear(out.flatten(2).unflatten(-1, (self.groups, -1)), self.o_a_proj.weight, self.groups)
        return self.o_b_proj(grouped.flatten(2))

    def window(self, kv: torch.Tensor, index: int, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """kv [B, T, 1, D] written to the layer's window ring -> keys [B, 1, S, D], additive mask [B, 1, T, S]."""
        cache = ctx.cache.layers[index]
        cache.write(ctx, kv, kv)
        if ctx.prefilling:
            keys, kind, k_pos = kv.transpose(1, 2), "prefill", ctx.positions
        else:
            keys, _ = cache.view(ctx, slice(0, kv.shape[0]) if ctx.rows is None else ctx.rows, ctx.kv_len)
            kind, k_pos = cache.kind, None
        return keys, ctx.mask(self.spec, kind, cache, k_pos, kv.dtype)


class ScoreRouter(nn.Module):
    """DeepseekV4TopKRouter: scores = scoring_func(logits); the top k of scores + e_score_correction_bias, their
    scores renormalised and times routed_scaling_factor."""

    def __init__(self, ds: DeepseekV4Config, moe: MoeConfig, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden))
        self.register_buffer("e_score_correction_bias", torch.zeros(moe.num_experts))
        self.top_k, self.scoring, self.scaling = moe.top_k, ds.scoring_func, ds.routed_scaling_factor

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        return F.softplus(logits).sqrt() if self.scoring == "sqrtsoftplus" else torch.sigmoid(logits)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H]; ids [N] tokens -> weights [N, k], experts [N, k]."""
        scores = self.scores(x)
        experts = torch.topk(scores + self.e_score_correction_bias, self.top_k, dim=-1, sorted=False).indices
        return self.weigh(scores, experts), experts

    def weigh(self, scores: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        weights = scores.gather(1, experts)
        return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * self.scaling


class HashRouter(ScoreRouter):
    """DeepseekV4HashRouter: the experts of a token are fixed, tid2eid[token]; the scores weigh them as above."""

    def __init__(self, ds: DeepseekV4Config, moe: MoeConfig, hidden: int, vocab: int):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden))
        self.register_buffer("tid2eid", torch.zeros(vocab, moe.top_k, dtype=torch.long))
        self.top_k, self.scoring, self.scaling = moe.top_k, ds.scoring_func, ds.routed_scaling_factor

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        experts = self.tid2eid[ids].long()
        return self.weigh(self.scores(x), experts), experts


class LimitedMLP(MLP):
    """DeepseekV4MLP (the shared expert): silu(gate clamped above at the limit) * up clamped to [-limit, limit]."""

    def __init__(self, hidden: int, intermediate: int, limit: float, tp):
        super().__init__(hidden, intermediate, False, tp)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        act = F.silu(gate.clamp(max=self.limit)) * up.clamp(-self.limit, self.limit)
        return self.tp.all_reduce(self.down_proj(act))
