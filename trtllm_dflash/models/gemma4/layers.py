"""The pieces of a Gemma 4 decoder layer that differ from the other families' (transformers 5.24
`models/gemma4/modeling_gemma4.py`): its RMSNorm, the per-layer-type rotary embedding, attention with per-head
q/k/v norms and K/V that later layers share, the GELU-tanh MLP and the expert router.

Checkpoint names are transformers' (`self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm`, `mlp.{gate,up,down}_proj`,
`router.{proj,scale,per_expert_scale}`), Q/K/V packed as in models/layers.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...config.family import FULL, SLIDING
from ...config.model import TargetConfig
from ...config.moe import MoeConfig
from ...config.rope import RopeConfig
from ...distributed.parallel import SINGLE, HeadSplit, Parallel
from ..attention import AttentionSpec
from ..layers import MLP, PackedLinear, RMSNorm, Rotary, apply_rope, keep_checkpoint_names
from .config import Gemma4Attention as AttentionShape
from .config import Gemma4Config


def normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> fp32 x / rms(x): Gemma4RMSNorm._norm, with torch.pow(mean + eps, -0.5) as transformers has it
    (not rsqrt: the two may differ in the last bit)."""
    x = x.float()
    return x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)


class GemmaRMSNorm(RMSNorm):
    """Gemma4RMSNorm with its scale: (normalized x in fp32) * weight in fp32, cast back (no 1 + weight offset)."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps, weight_fp32=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(normalize(x, self.eps), self.weight, x.dtype)


class LayerTypeRotary:
    """One `Rotary` per layer type present (their head_dim and frequencies differ): a call maps each type to its
    cos, sin [B, T, 1, D]. Not a module, like `Rotary` (step_mode.CompiledPass calls `freqs_on`)."""

    def __init__(self, g: Gemma4Config, kinds: set[str]):
        self.by_kind = {kind: layer_rotary(g.attention(kind)) for kind in (SLIDING, FULL) if kind in kinds}

    def freqs_on(self, device: torch.device) -> None:
        for rotary in self.by_kind.values():
            rotary.freqs_on(device)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {kind: rotary(positions, dtype) for kind, rotary in self.by_kind.items()}


def layer_rotary(shape: AttentionShape) -> Rotary:
    """default: every frequency over head_dim (Gemma4TextRotaryEmbedding.compute_default_rope_parameters, which
    ignores partial_rotary_factor); proportional: see `proportional_inv_freq`."""
    rope = shape.rope
    rotary = Rotary(RopeConfig(theta=rope.theta), shape.head_dim)
    if rope.rope_type == "proportional":
        rotary.inv_freq = proportional_inv_freq(rope.theta, shape.head_dim, rope.partial_rotary_factor, rope.factor)
    return rotary


def proportional_inv_freq(theta: float, head_dim: int, fraction: float, factor: float) -> torch.Tensor:
    """[head_dim / 2] fp32: the first int(fraction * head_dim // 2) frequencies theta^(-2i / head_dim), exponents over
    the whole head_dim, then zeros (cos 1, sin 0: those channel pairs pass unrotated), all divided by factor
    (transformers 5.24 modeling_rope_utils._compute_proportional_rope_parameters)."""
    angles = int(fraction * head_dim // 2)
    exponents = torch.arange(0, 2 * angles, 2, dtype=torch.int64, device="cpu").float() / head_dim
    rotated = 1.0 / theta ** exponents
    return torch.cat((rotated, torch.zeros(head_dim // 2 - angles, device="cpu"))) / factor


class Gemma4SelfAttention(nn.Module):
    """Gemma4TextAttention: q_norm, k_norm (weighted) and v_norm (not) per head, the RoPE of the layer's type,
    softmax scale 1. A full-attention layer with attention_k_eq_v has no v_proj (V is the K projection before
    k_norm); a layer that shares K/V has no K/V weights and attends to `shared[its type]`, the K/V of the last
    layer of its type that computed them (this forward's, also in that layer's cache)."""

    def __init__(self, cfg: TargetConfig, layer: int, tp: Parallel = SINGLE):
        super().__init__()
        g, layers = cfg.gemma4, cfg.num_hidden_layers
        self.kind = cfg.layer_types[layer]
        shape = g.attention(self.kind)
        split = HeadSplit(cfg.num_attention_heads, shape.num_kv_heads, tp.world)
        self.spec = AttentionSpec(split.local_heads, split.local_kv_heads, shape.head_dim, window=cfg.window(layer),
                                  scale=1.0)
        self.shared = g.shares_kv(layer, layers)
        self.k_eq_v = g.k_eq_v and self.kind == FULL
        nq, nkv = self.spec.num_heads * shape.head_dim, self.spec.num_kv_heads * shape.head_dim
        parts = {"q_proj": nq, **({} if self.shared else {"k_proj": nkv}),
                 **({} if self.shared or self.k_eq_v else {"v_proj": nkv})}
        self.qkv_proj = PackedLinear(cfg.hidden_size, parts, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(nq, cfg.hidden_size, bias=cfg.attention_bias)  # row-parallel
        self.q_norm = GemmaRMSNorm(shape.head_dim, cfg.rms_norm_eps)
        self.k_norm = None if self.shared else GemmaRMSNorm(shape.head_dim, cfg.rms_norm_eps)
        self.eps, self.tp = cfg.rms_norm_eps, tp
        keep_checkpoint_names(self, "qkv_proj")

    def forward(self, x: torch.Tensor, cache_index: int, ctx, shared: dict) -> torch.Tensor:
        """x: [B, T, hidden]; cache_index: the cache layer of the K/V this layer reads (a shared layer's: its
        source's); shared: type -> this forward's K/V of the last layer of that type that computed them."""
        s = self.spec
        parts = self.qkv_proj.split(self.qkv_proj(x), dim=-1)
        cos, sin = ctx.rope[self.kind]
        q = apply_rope(self.q_norm(parts[0].unflatten(-1, (s.num_heads, s.head_dim))), cos, sin)
        if self.shared:
            k, v = shared[self.kind]  # attend() writes them again at the same cache entries: the same values
        else:
            k = parts[1].unflatten(-1, (s.num_kv_heads, s.head_dim))
            v = k if self.k_eq_v else parts[2].unflatten(-1, (s.num_kv_heads, s.head_dim))
            k, v = apply_rope(self.k_norm(k), cos, sin), normalize(v, self.eps).to(v.dtype)
            shared[self.kind] = k, v
        out = ctx.attend(cache_index, s, q, k, v).flatten(2)  # [B, T, H * D]
        return self.tp.all_reduce(self.o_proj(out))


class GeluMLP(MLP):
    """Gemma4TextMLP: gelu_pytorch_tanh(gate) * up (the MLP's packing and tensor parallelism)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.tp.all_reduce(self.down_proj(F.gelu(gate, approximate="tanh") * up))


class Gemma4Router(nn.Module):
    """Gemma4TextRouter: the input normalized (no weight), times `scale` and hidden ** -0.5, projected to expert
    logits; softmax over every expert in fp32, the top k renormalised, each times its expert's per_expert_scale."""

    def __init__(self, moe: MoeConfig, hidden: int, eps: float):
        super().__init__()
        self.proj = nn.Linear(hidden, moe.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(moe.num_experts))
        self.top_k, self.eps, self.root = moe.top_k, eps, hidden ** -0.5

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, H] -> routing weights [N, k] (fp32, as transformers keeps them) and expert ids [N, k]."""
        h = normalize(x, self.eps).to(x.dtype) * self.scale * self.root
        probs, ids = self.proj(h).softmax(dim=-1, dtype=torch.float32).topk(self.top_k, dim=-1)
        probs = probs / probs.sum(dim=-1, keepdim=True)
        return probs * self.per_expert_scale[ids], ids
