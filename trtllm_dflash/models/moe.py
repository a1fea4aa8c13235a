"""A mixture-of-experts MLP block: router, routed experts, optional shared expert.

Expert compute is grouped, never a Python loop over tokens: the N * k (token, expert) pairs are
sorted by expert, and each projection runs as one grouped GEMM over the sorted rows
(`torch.nn.functional.grouped_mm`, CUDA and CPU kernels in torch >= 2.10; a loop over the experts
that received rows where it is unavailable). A verify pass of B x 16 tokens routes once.

Weights (one rank's shard under tensor parallelism; `checkpoint_layout` converts published layouts):
  router.weight [E, H] (+ router.bias [E]; + router.e_score_correction_bias [E] with sigmoid_topk routing)
  experts.w13 [E, H, 2I]: gate in [..., :I], up in [..., I:]   (+ experts.w13_bias [E, 2I])
  experts.w2 [E, I, H]                                         (+ experts.w2_bias [E, H])
  shared_expert.{gate,up,down}_proj, shared_expert_gate.weight [1, H]   (when configured)
Tensor parallelism splits every expert's intermediate dimension I (like the dense MLP), so each
rank does the same share of every routed token's work and one all-reduce ends the block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config.moe import MoeConfig
from ..distributed.parallel import SINGLE, Parallel
from .layers import MLP

GROUPED_MM = getattr(F, "grouped_mm", None)


class Router(nn.Module):
    def __init__(self, cfg: MoeConfig, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, hidden))
        self.bias = nn.Parameter(torch.empty(cfg.num_experts)) if cfg.router_bias else None
        if cfg.routing == "sigmoid_topk":  # added to the scores for the choice only
            self.register_buffer("e_score_correction_bias", torch.empty(cfg.num_experts))
        self.cfg = cfg

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, H] -> routing weights [N, k] (x's dtype) and expert ids [N, k] (long)."""
        logits = F.linear(x, self.weight, self.bias)  # [N, E]
        cfg = self.cfg
        if cfg.routing == "sigmoid_topk":
            return self.sigmoid_topk(logits.float(), x.dtype)
        if cfg.routing == "topk_softmax":
            top, ids = logits.topk(cfg.top_k, dim=-1)
            return top.softmax(dim=-1), ids
        probs, ids = logits.softmax(dim=-1, dtype=torch.float32).topk(cfg.top_k, dim=-1)
        if cfg.norm_topk_prob:
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return probs.to(x.dtype), ids

    def sigmoid_topk(self, logits: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """logits: fp32 [N, E] -> weights [N, k] (dtype), ids [N, k]."""
        cfg = self.cfg
        if cfg.router_softcap:
            logits = torch.tanh(logits / cfg.router_softcap) * cfg.router_softcap
        scores = torch.sigmoid(logits)
        choice = scores + self.e_score_correction_bias.float()
        if cfg.n_group > 1:  # experts outside the topk_group best groups are never chosen
            groups = choice.unflatten(-1, (cfg.n_group, -1))  # [N, G, E / G]
            best = groups.topk(2, dim=-1).values.sum(-1).topk(cfg.topk_group, dim=-1).indices  # [N, topk_group]
            keep = torch.zeros_like(groups[..., 0], dtype=torch.bool).scatter_(1, best, True)
            choice = groups.masked_fill(~keep[..., None], float("-inf")).flatten(1)
        ids = choice.topk(cfg.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if cfg.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights * cfg.routed_scaling_factor).to(dtype), ids


class Experts(nn.Module):
    """E SwiGLU experts stored stacked, computed over expert-sorted rows."""

    def __init__(self, cfg: MoeConfig, hidden: int, tp: Parallel = SINGLE):
        super().__init__()
        local = cfg.intermediate_size // tp.world
        e = cfg.num_experts
        self.w13 = nn.Parameter(torch.empty(e, hidden, 2 * local))  # gate | up
        self.w2 = nn.Parameter(torch.empty(e, local, hidden))
        bias = cfg.expert_bias
        self.w13_bias = nn.Parameter(torch.empty(e, 2 * local)) if bias else None
        self.w2_bias = nn.Parameter(torch.empty(e, hidden)) if bias else None  # rank 0's; zeros elsewhere
        self.cfg = cfg

    def probe_kernels(self) -> None:
        """Whether a grouped GEMM runs for these weights, tried now: a compiled pass reads the answer
        (`grouped_mm_ok`) but cannot run the probe while it traces (step_mode.CompiledPass calls this)."""
        grouped_mm_kernel(self.w13.device.type, self.w13.dtype)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x: [N, H]; weights, ids: [N, k] -> sum over k of weight * expert(x): [N, H]."""
        n, k = ids.shape
        flat = ids.reshape(-1)
        order = flat.argsort(stable=True)  # (token, slot) pairs grouped by expert
        expert = flat[order]
        rows = x[order // k]  # [N*k, H]
        counts = torch.zeros(self.cfg.num_experts, dtype=torch.long, device=x.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))  # rows per expert, no host sync (unlike bincount)
        h = self.project(rows, self.w13, self.w13_bias, expert, counts)
        h = self.project(self.activate(h), self.w2, self.w2_bias, expert, counts)
        h = h * weights.reshape(-1)[order, None]
        out = torch.empty_like(h)
        out[order] = h  # back to (token, slot) order; summing over k keeps the result deterministic
        return out.view(n, k, -1).sum(dim=1)

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        # h: [rows, 2I] -> [rows, I]
        gate, up = h.chunk(2, dim=-1)
        cfg = self.cfg
        if cfg.activation == "silu":
            return F.silu(gate) * up
        if cfg.activation == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        if cfg.activation == "limited_silu":
            return F.silu(gate.clamp(max=cfg.swiglu_limit)) * up.clamp(-cfg.swiglu_limit, cfg.swiglu_limit)
        gate = gate.clamp(max=cfg.swiglu_limit)
        up = up.clamp(-cfg.swiglu_limit, cfg.swiglu_limit)
        return (up + 1) * gate * torch.sigmoid(gate * cfg.swiglu_alpha)

    @staticmethod
    def project(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, expert: torch.Tensor,
                counts: torch.Tensor) -> torch.Tensor:
        """rows: [R, K] sorted by expert; weight: [E, K, M] -> rows @ weight[expert of row] (+ bias): [R, M]."""
        if grouped_mm_ok(rows, weight):
            out = GROUPED_MM(rows, weight, offs=counts.cumsum(0).to(torch.int32))
        else:
            out = grouped_loop(rows, weight, counts)
        return out if bias is None else out + bias[expert]


def grouped_mm_ok(rows: torch.Tensor, weight: torch.Tensor) -> bool:
    """torch's grouped GEMM needs a kernel for this device and dtype, and 16-byte aligned base
    pointers and strides (aten/src/ATen/native/GroupedMMUtils.h, torch 2.10+). A compiled pass
    (step_mode.py) checks the strides only: its buffers come from its own aligned allocations, and the
    kernel probe, run eagerly before compiling (`Experts.probe_kernels`), is read, not run."""
    if rows.dtype != weight.dtype or not rows.is_contiguous() or weight.stride(-1) != 1:
        return False
    item = rows.element_size()
    compiling = torch.compiler.is_compiling()
    aligned = all((compiling or t.data_ptr() % 16 == 0) and all(s * item % 16 == 0 for s in t.stride()[:-1])
                  for t in (rows, weight))
    key = (weight.device.type, rows.dtype)
    if compiling:
        return aligned and GROUPED_MM_KERNELS.get(key, False)
    return aligned and grouped_mm_kernel(*key)


GROUPED_MM_KERNELS: dict[tuple[str, torch.dtype], bool] = {}  # (device type, dtype) -> a kernel runs


def grouped_mm_kernel(device_type: str, dtype: torch.dtype) -> bool:
    """Whether this torch has a grouped GEMM for the device and dtype (tried once on a tiny case:
    CUDA kernels exist for some architectures and dtypes only)."""
    key = (device_type, dtype)
    if key not in GROUPED_MM_KERNELS:
        GROUPED_MM_KERNELS[key] = GROUPED_MM is not None and grouped_mm_runs(device_type, dtype)
    return GROUPED_MM_KERNELS[key]


def grouped_mm_runs(device_type: str, dtype: torch.dtype) -> bool:
    try:
        a = torch.ones(4, 8, dtype=dtype, device=device_type)
        b = torch.ones(2, 8, 8, dtype=dtype, device=device_type)
        out = GROUPED_MM(a, b, offs=torch.tensor([1, 4], dtype=torch.int32, device=device_type))
        return bool((out == 8).all())
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def grouped_loop(rows: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The grouped GEMM as one matmul per expert that received rows (reads `counts`: a host sync)."""
    out = rows.new_empty(rows.shape[0], weight.shape[-1])
    start = 0
    for e, n in enumerate(counts.tolist()):
        if n:
            out[start:start + n] = rows[start:start + n] @ weight[e]
            start += n
    return out


class MoE(nn.Module):
    """The MLP of an MoE decoder layer: x [B, T, H] -> [B, T, H], all-reduced over ranks."""

    def __init__(self, cfg: MoeConfig, hidden: int, tp: Parallel = SINGLE):
        super().__init__()
        self.router = Router(cfg, hidden)
        self.experts = Experts(cfg, hidden, tp)
        if cfg.shared_expert_intermediate_size:
            self.shared_expert = MLP(hidden, cfg.shared_expert_intermediate_size, bias=False, tp=tp)
            self.shared_expert_gate = nn.Linear(hidden, 1, bias=False) if cfg.shared_expert_gate else None
        else:
            self.shared_expert = self.shared_expert_gate = None
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.router(flat)
        out = self.tp.all_reduce(self.experts(flat, weights, ids))
        if self.shared_expert is not None:
            shared = self.shared_expert(flat)  # all-reduced inside
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(flat)) * shared
            out = out + shared
        return out.view_as(x)
