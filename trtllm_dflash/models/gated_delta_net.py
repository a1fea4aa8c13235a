"""A Gated DeltaNet layer (the linear-attention token mixer of Qwen3.5 / Qwen3-Next), with its state.

Math as transformers 5.23 `Qwen3_5GatedDeltaNet` (models/qwen3_5/modular_qwen3_5.py): project to
mixed q|k|v, z (output gate), b (write strength) and a (decay step); short causal depthwise
convolution + SiLU over q|k|v; beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias);
the gated delta rule (gated_delta_rule.py) with L2-normalised q and k, each key head serving
H_v / H_k consecutive value heads; a per-head RMSNorm gated by SiLU(z); out_proj.

Tensor parallel: key and value heads split over ranks (q|k|v rows, conv channels, z, b, a,
A_log, dt_bias per head), out_proj row-parallel; the state of a rank's heads stays on that rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..cache.state_cache import RecurrentState
from ..config.model import TargetConfig
from ..distributed.parallel import SINGLE, Parallel
from .gated_delta_rule import gated_delta_rule


class GatedRMSNorm(nn.Module):
    """RMSNorm over each head's channels, then times SiLU(gate) (norm before gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (h * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """Weights named as in the checkpoints (`linear_attn.in_proj_qkv`, `conv1d`, `A_log`, ...)."""

    def __init__(self, cfg: TargetConfig, tp: Parallel = SINGLE):
        super().__init__()
        lin, hidden = cfg.linear_attention, cfg.hidden_size
        self.k_heads, self.v_heads = lin.num_k_heads // tp.world, lin.num_v_heads // tp.world  # this rank's
        self.dk, self.dv = lin.head_k_dim, lin.head_v_dim
        channels = 2 * self.k_heads * self.dk + self.v_heads * self.dv
        self.in_proj_qkv = nn.Linear(hidden, channels, bias=False)
        self.in_proj_z = nn.Linear(hidden, self.v_heads * self.dv, bias=False)
        self.in_proj_b = nn.Linear(hidden, self.v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, self.v_heads, bias=False)
        self.conv1d = nn.Conv1d(channels, channels, lin.conv_kernel, groups=channels, bias=False)
        self.A_log = nn.Parameter(torch.empty(self.v_heads))
        self.dt_bias = nn.Parameter(torch.empty(self.v_heads))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.v_heads * self.dv, hidden, bias=False)  # row-parallel
        self.tp = tp

    def forward(self, x: torch.Tensor, layer: int, state: RecurrentState, slots: torch.Tensor,
                commit: torch.Tensor | None) -> torch.Tensor:
        """x: [B, T, hidden] -> [B, T, hidden]. commit: [B] tokens to fold into the state now, or None to
        leave the state as it is and stash this pass for `commit` (verify)."""
        mixed = self.in_proj_qkv(x)  # [B, T, C]
        g, beta = self.gates(x)
        conv_state, ssm = state.read(layer, slots)
        window, (q, k, v) = self.convolve(conv_state, mixed)
        out, final = gated_delta_rule(q, k, v, g, beta, ssm, keep=commit)
        if commit is None:
            state.stash(layer, slots, mixed, g, beta)
        else:
            state.store(layer, slots, window, final, commit)
        z = self.in_proj_z(x).unflatten(-1, (self.v_heads, self.dv))
        out = self.norm(out.to(x.dtype), z).flatten(-2)
        return self.tp.all_reduce(self.out_proj(out))

    def commit(self, layer: int, state: RecurrentState, slots: torch.Tensor, lengths: torch.Tensor, t: int) -> None:
        """Fold the first `lengths[b]` tokens of the stashed T-token pass into each row's state."""
        mixed, g, beta = state.stashed(layer, slots, t)
        conv_state, ssm = state.read(layer, slots)
        window, (_, k, v) = self.convolve(conv_state, mixed)
        _, final = gated_delta_rule(None, k, v, g, beta, ssm, keep=lengths)
        state.store(layer, slots, window, final, lengths)

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # -> g (log decay, <= 0), beta (write strength): [B, T, H_v] fp32
        a = self.in_proj_a(x).float() + self.dt_bias
        g = -self.A_log.float().exp() * F.softplus(a)
        return g, self.in_proj_b(x).sigmoid().float()

    def convolve(self, conv_state: torch.Tensor, mixed: torch.Tensor):
        """conv_state: [B, C, W-1]; mixed: [B, T, C] -> window [B, C, W-1+T], and q, k: [B, T, H_v, D_k],
        v: [B, T, H_v, D_v] after the causal depthwise convolution + SiLU (key heads repeated per value head)."""
        window = torch.cat([conv_state, mixed.transpose(1, 2)], dim=2)
        width = self.conv1d.weight.shape[-1]
        # depthwise: out[b, c, t] = sum_j w[c, j] * window[b, c, t + j] (cheaper than grouped conv1d on CPUs)
        qkv = F.silu((window.unfold(2, width, 1) * self.conv1d.weight[:, None, 0, :]).sum(-1)).transpose(1, 2)
        q, k, v = qkv.split([self.k_heads * self.dk, self.k_heads * self.dk, self.v_heads * self.dv], dim=-1)
        group = self.v_heads // self.k_heads
        q, k = (t.unflatten(-1, (self.k_heads, self.dk)).repeat_interleave(group, dim=2) for t in (q, k))
        return window, (q, k, v.unflatten(-1, (self.v_heads, self.dv)))
