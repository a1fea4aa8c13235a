"""`torch.ops.trtllm_dflash.paged_attention`: the Triton kernel on CUDA, the PyTorch reference elsewhere.

A custom op (opaque to torch.compile, which calls it with the shapes it traced: no host sync inside), so a
compiled or CUDA-graph step launches the kernel with the step's static tensors (pool, table, rows, positions).
kv_len is the step's key span, a size (symbolic under compile; fixed per CUDA graph, whose span is bucketed).

`MODE` (from the env var TRTLLM_DFLASH_PAGED_ATTENTION at import) is the runtime's choice, read by
models/attention.py for every cached full-attention layer:
- "auto": the op on CUDA when Triton is importable; the CPU keeps gather + mask + SDPA (faster there,
  benchmarks/results/paged_vs_slot.json);
- "triton": the op on any device, running the Triton kernel on a CPU too (needs TRITON_INTERPRET=1: tests);
- "off": gather + mask + SDPA everywhere.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import Tensor

from ...utils.errors import DFlashError
from .reference import paged_attention_reference

MODES = ("auto", "triton", "off")
# Passes with more queries per row (a chunk of a long prompt, a prompt resumed after a prefix hit) keep gather +
# SDPA: this kernel's query tiles are small (<= 64 rows), so a long span would re-read the keys once per tile.
MAX_QUERIES = 16  # a verify's or a drafting block's width
MODE = os.environ.get("TRTLLM_DFLASH_PAGED_ATTENTION", "auto")
TRITON = importlib.util.find_spec("triton") is not None


def supported(head_dim: int) -> bool:
    """Shapes the Triton kernel handles (head_dim a power of two, 16..256); the op falls back to the reference."""
    return 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0


def use_op(q: Tensor, windowed: bool) -> bool:
    """Whether a cached full-attention layer with queries q [B, T, H, D] calls the op (else gather + mask + SDPA)."""
    if MODE not in MODES:
        raise DFlashError(f"TRTLLM_DFLASH_PAGED_ATTENTION must be one of {', '.join(MODES)}, got {MODE!r}")
    if MODE == "off" or windowed or not (MODE == "triton" or q.is_cuda):  # the CPU: no guard on the shapes
        return False
    return TRITON and supported(q.shape[-1]) and q.shape[1] <= MAX_QUERIES


@torch.library.custom_op("trtllm_dflash::paged_attention", mutates_args=())
def paged_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, table: Tensor, rows: Tensor, positions: Tensor,
                    kv_len: int, causal: bool, scale: float, sinks: Tensor | None = None) -> Tensor:
    """q [B, T, H, D]; k_pool, v_pool [N + 1, BLOCK, H_kv, D]; table [S, M] int32; rows [B] long; positions
    [B, T] long -> [B, T, H, D]: row b's queries over its keys 0..L read through table[rows[b]] (see reference.py)."""
    if MODE == "triton" and TRITON and supported(q.shape[-1]):  # forced: Triton's CPU interpreter
        return _paged_attention_cuda(q, k_pool, v_pool, table, rows, positions, kv_len, causal, scale, sinks)
    return paged_attention_reference(q, k_pool, v_pool, table, rows, positions, kv_len, causal, scale, sinks)


@paged_attention.register_kernel("cuda")
def _paged_attention_cuda(q, k_pool, v_pool, table, rows, positions, kv_len, causal, scale, sinks=None) -> Tensor:
    if not (TRITON and supported(q.shape[-1])):
        return paged_attention_reference(q, k_pool, v_pool, table, rows, positions, kv_len, causal, scale, sinks)
    from .triton_kernel import paged_attention_triton  # triton is imported only where CUDA runs

    return paged_attention_triton(q, k_pool, v_pool, table, rows, positions, kv_len, causal, scale, sinks)


@paged_attention.register_fake
def _paged_attention_fake(q, k_pool, v_pool, table, rows, positions, kv_len, causal, scale, sinks=None) -> Tensor:
    return q.new_empty(q.shape)  # contiguous [B, T, H, D], as both implementations return
