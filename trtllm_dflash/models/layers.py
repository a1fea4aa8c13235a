"""Building blocks shared by the target and the drafter: RMSNorm, packed projections, RoPE, SwiGLU,
the attention layer.

Packed projections: Q/K/V are one `qkv_proj` GEMM and gate/up one `gate_up_proj` GEMM per layer
(fused at load). State dicts keep the checkpoint names (`q_proj`, `k_proj`, ... ): loading
concatenates them, `state_dict()` returns copies split back, so checkpoints, engine shards (each
rank fuses its own slices), name checks and saved drafters all see the published layout.

Shapes inside a layer are sequence-major, [B, T, H, D], so that projections, norms and RoPE need no
transposes; attention (`models/attention.py`) takes them in that layout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config.model import DecoderConfig
from ..config.rope import RopeConfig
from ..distributed.parallel import SINGLE, HeadSplit, Parallel, padded_vocab
from .attention import AttentionSpec


class RMSNorm(nn.Module):
    """unit_offset: the weight is stored as an offset from 1 and applied in fp32 before the cast back
    (Qwen3-Next / Qwen3.5 `Qwen3NextRMSNorm`); weight_fp32: the weight applied in fp32 before the cast
    back (gpt-oss `GptOssRMSNorm`); otherwise cast back, then weight (Llama / Qwen3)."""

    def __init__(self, dim: int, eps: float, unit_offset: bool = False, weight_fp32: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.unit_offset, self.weight_fp32 = eps, unit_offset, weight_fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(F.rms_norm(x.float(), self.weight.shape, eps=self.eps), self.weight, x.dtype)

    def scale(self, normed: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """normed: fp32 normalised input; weight: this norm's weight (or several norms' stacked)."""
        if self.unit_offset:
            return (normed * (1.0 + weight.float())).to(dtype)
        if self.weight_fp32:
            return (weight.float() * normed).to(dtype)
        return weight * normed.to(dtype)


class PackedLinear(nn.Linear):
    """Several projections of one input in one GEMM: their rows concatenated, in `parts` order."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool):
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)  # checkpoint name -> output rows

    def split(self, t: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, ...]:
        return t.split(list(self.parts.values()), dim=dim)


def keep_checkpoint_names(module: nn.Module, packed: str) -> None:
    """State dicts of `module` name its `packed` PackedLinear's parts as the checkpoint does."""
    lin: PackedLinear = getattr(module, packed)

    def save(mod, state, prefix, local_metadata) -> None:
        for param in ("weight", "bias"):
            key = f"{prefix}{packed}.{param}"
            if key in state:
                for name, piece in zip(lin.parts, lin.split(state.pop(key))):
                    state[f"{prefix}{name}.{param}"] = piece.clone()  # copies: safetensors refuses shared storage

    def load(mod, state, prefix, *args) -> None:
        for param in ("weight", "bias"):
            keys = [f"{prefix}{name}.{param}" for name in lin.parts]
            if all(k in state for k in keys):
                state[f"{prefix}{packed}.{param}"] = torch.cat([state.pop(k) for k in keys])

    module.register_state_dict_post_hook(save)
    module.register_load_state_dict_pre_hook(load)


class MLP(nn.Module):
    """SwiGLU; gate/up packed and column-parallel, down row-parallel (summed over ranks)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool, tp: Parallel = SINGLE):
        super().__init__()
        local = intermediate // tp.world
        self.gate_up_proj = PackedLinear(hidden, {"gate_proj": local, "up_proj": local}, bias=bias)
        self.down_proj = nn.Linear(local, hidden, bias=bias)  # bias held by rank 0 only
        self.tp = tp
        keep_checkpoint_names(self, "gate_up_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.tp.all_reduce(self.down_proj(F.silu(gate) * up))


class VocabEmbedding(nn.Module):
    """Token embedding whose rows (the padded vocabulary) are split over ranks."""

    def __init__(self, vocab: int, hidden: int, tp: Parallel = SINGLE):
        super().__init__()
        rows = vocab if tp.world == 1 else padded_vocab(vocab, tp.world) // tp.world
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.start, self.tp = tp.rank * rows, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * inside[..., None]
        return self.tp.all_reduce(out)


class LMHead(nn.Module):
    """Output projection whose rows (the padded vocabulary) are split over ranks."""

    def __init__(self, hidden: int, vocab: int, tp: Parallel = SINGLE):
        super().__init__()
        rows = vocab if tp.world == 1 else padded_vocab(vocab, tp.world) // tp.world
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.vocab, self.tp = vocab, tp

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # -> fp32 logits [..., vocab], gathered from every rank, padding dropped
        logits = F.linear(hidden, self.weight).float()
        if self.tp.world == 1:
            return logits
        return self.tp.all_gather_last(logits)[..., : self.vocab]


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], fp32, with linear / Llama 3.1 / YaRN scaling applied."""
    inv_freq = 1.0 / rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "yarn":
        return yarn_inv_freq(rope, head_dim)
    if rope.rope_type != "llama3":
        return inv_freq
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """YaRN (arXiv 2309.00071): dimensions rotating more than beta_fast times over the original
    context keep their frequency, those under beta_slow are interpolated by `factor`, a linear ramp
    between (transformers 5.23 modeling_rope_utils._compute_yarn_parameters)."""
    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times over the original context
        return head_dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / max(high - low, 0.001)).clamp(0, 1)
    extrapolation = 1 - ramp  # the share of each dimension that keeps its original frequency
    pos_freqs = rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim)  # 1 / unscaled inv_freq
    return 1.0 / (rope.factor * pos_freqs) * (1 - extrapolation) + 1.0 / pos_freqs * extrapolation


def rope_attention_scaling(rope: RopeConfig) -> float:
    """The factor YaRN multiplies cos and sin by (1 for every other rope type)."""
    if rope.rope_type != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return rope.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    return mscale(rope.factor)


class Rotary:
    """cos / signed-sin tables for arbitrary absolute positions, computed once per forward.

    Not a module: meta-device construction and `model.to(dtype)` leave the fp32 `inv_freq` alone; it is
    copied to a device once, on first use there. YaRN scales cos/sin by its attention factor.
    """

    def __init__(self, rope: RopeConfig, head_dim: int):
        self.inv_freq = rope_inv_freq(rope, head_dim)
        self.scaling = rope_attention_scaling(rope)
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def freqs_on(self, device: torch.device) -> torch.Tensor:
        if device not in self._on_device:
            self._on_device[device] = self.inv_freq.to(device)
        return self._on_device[device]

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, T] -> cos, sin: [B, T, 1, D] (broadcast over heads); sin carries rotate_half's
        # sign, [-sin, sin], so that rotate_half(x) * sin == roll(x, D/2) * signed_sin exactly.
        freqs = positions[..., None].float() * self.freqs_on(positions.device)  # fp32 angles, as transformers
        cos, sin = freqs.cos(), freqs.sin()
        if self.scaling != 1.0:
            cos, sin = cos * self.scaling, sin * self.scaling
        cos = torch.cat((cos, cos), dim=-1).to(dtype)
        sin = torch.cat((-sin, sin), dim=-1).to(dtype)
        return cos[:, :, None], sin[:, :, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos, sin: [B, T, 1, R] from `Rotary` (R < D: partial rotary, the rest passes)."""
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
    return x * cos + torch.roll(x, rot // 2, dims=-1) * sin


class Attention(nn.Module):
    """Packed QKV projection, optional per-head q/k RMSNorm, RoPE, attention, optional output gate,
    O projection.

    Parameter names follow the checkpoints (`self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm`). How
    keys are stored and read is the per-forward context's business (`models/attention.py`): the
    layer hands it this step's roped q, k and v and gets the attention output back. With an output
    gate (Qwen3-Next / Qwen3.5), q_proj yields per head [q (D) | gate (D)] and the attention output
    is multiplied by sigmoid(gate) before o_proj.
    """

    def __init__(self, cfg: DecoderConfig, tp: Parallel = SINGLE, causal: bool = True, window: int | None = None):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        split = HeadSplit(cfg.num_attention_heads, cfg.num_key_value_heads, tp.world)
        self.spec = AttentionSpec(split.local_heads, split.local_kv_heads, d, causal=causal, window=window)
        self.output_gate = getattr(cfg, "attn_output_gate", False)
        nq, nkv = self.spec.num_heads * d, self.spec.num_kv_heads * d
        self.q_rows = nq * (2 if self.output_gate else 1)
        self.qkv_proj = PackedLinear(h, {"q_proj": self.q_rows, "k_proj": nkv, "v_proj": nkv}, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(nq, h, bias=cfg.attention_bias)  # row-parallel
        self.tp = tp
        # gpt-oss: [H] learned sink logits of this rank's heads, one more column in every softmax
        self.sinks = nn.Parameter(torch.empty(self.spec.num_heads)) if getattr(cfg, "attention_sinks", False) else None
        if cfg.qk_norm:
            offset = getattr(cfg, "unit_offset_norms", False)
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps, offset)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps, offset)
        else:
            self.q_norm = self.k_norm = None
        keep_checkpoint_names(self, "qkv_proj")

    @property
    def kv_weight(self) -> torch.Tensor:
        """[2 * H_kv * D, hidden]: the K rows then the V rows (a view of the packed weight)."""
        return self.qkv_proj.weight[self.q_rows:]

    def project(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x: [B, T, hidden] -> q [B, T, H, D], k [B, T, H_kv, D] (normed, roped), v [B, T, H_kv, D],
        and the output gate [B, T, H * D] (None without one)."""
        s = self.spec
        nq = self.q_rows // s.head_dim  # query heads, doubled by the gate's
        qkv = self.qkv_proj(x).view(*x.shape[:-1], nq + 2 * s.num_kv_heads, s.head_dim)
        qk, v = qkv[..., : nq + s.num_kv_heads, :], qkv[..., nq + s.num_kv_heads:, :]
        gate = None
        if self.output_gate:  # per head [q | gate]: q and k heads side by side, the gates apart
            q_gate = qk[..., :nq, :].unflatten(-2, (s.num_heads, 2))
            qk, gate = torch.cat((q_gate[..., 0, :], qk[..., nq:, :]), dim=-2), q_gate[..., 1, :].flatten(-2)
        if self.q_norm is not None:  # one normalisation for q and k heads, then each its own weight
            normed = F.rms_norm(qk.float(), (s.head_dim,), eps=self.q_norm.eps)
            weight = torch.cat((self.q_norm.weight.expand(s.num_heads, -1), self.k_norm.weight.expand(s.num_kv_heads, -1)))
            qk = self.q_norm.scale(normed, weight, qk.dtype)
        qk = apply_rope(qk, *rope)
        return qk[..., : s.num_heads, :], qk[..., s.num_heads:, :], v, gate

    def key_value(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, roped) and V of inputs that are never queries (DFlash context features):
        x [B, N, hidden] -> k, v [B, N, H_kv, D], one GEMM over the packed K/V rows."""
        s = self.spec
        bias = None if self.qkv_proj.bias is None else self.qkv_proj.bias[self.q_rows:]
        k, v = F.linear(x, self.kv_weight, bias).view(*x.shape[:-1], 2 * s.num_kv_heads, s.head_dim).chunk(2, dim=-2)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, *rope), v

    def forward(self, x: torch.Tensor, layer: int, ctx) -> torch.Tensor:
        """x: [B, T, hidden]; layer: this layer's cache index; ctx: the forward's context (cache,
        positions, rope) -> [B, T, hidden]."""
        q, k, v, gate = self.project(x, ctx.rope)
        out = ctx.attend(layer, self.spec, q, k, v, self.sinks).flatten(2)  # [B, T, H * D]
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.tp.all_reduce(self.o_proj(out))
