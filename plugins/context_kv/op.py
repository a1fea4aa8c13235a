"""`torch.ops.trtllm_dflash.context_kv`: the fused Triton kernel on CUDA, the reference elsewhere."""

from __future__ import annotations

import torch
from torch import Tensor

from .reference import context_kv_reference
from .spec import ContextKVWeights


def _weights(fc, hidden_norm, kv, k_norm, inv_freq, hidden_eps, k_eps) -> ContextKVWeights:
    return ContextKVWeights(fc, hidden_norm, kv, k_norm, inv_freq, hidden_eps, k_eps)


@torch.library.custom_op("trtllm_dflash::context_kv", mutates_args=("k_cache", "v_cache"))
def context_kv(features: Tensor, positions: Tensor, slots: Tensor, fc: Tensor, hidden_norm: Tensor, kv: Tensor,
               k_norm: Tensor, inv_freq: Tensor, k_cache: Tensor, v_cache: Tensor, hidden_eps: float,
               k_eps: float) -> None:
    """features [N, n_ids*H], positions [N], slots [N] -> writes k_cache/v_cache [L, S, H_kv, C, D]."""
    w = _weights(fc, hidden_norm, kv, k_norm, inv_freq, hidden_eps, k_eps)
    context_kv_reference(features, positions, slots, w, k_cache, v_cache)


@context_kv.register_kernel("cuda")
def _context_kv_cuda(features, positions, slots, fc, hidden_norm, kv, k_norm, inv_freq, k_cache, v_cache,
                     hidden_eps, k_eps) -> None:
    from .triton_kernel import context_kv_triton, supported  # triton is imported only where CUDA runs

    w = _weights(fc, hidden_norm, kv, k_norm, inv_freq, hidden_eps, k_eps)
    run = context_kv_triton if supported(w) else context_kv_reference
    run(features, positions, slots, w, k_cache, v_cache)


def write_context_kv(features: Tensor, positions: Tensor, slots: Tensor, w: ContextKVWeights,
                     k_cache: Tensor, v_cache: Tensor) -> None:
    """Project and store the context K/V of N ragged tokens for every draft layer (one op call)."""
    torch.ops.trtllm_dflash.context_kv(features, positions, slots, w.fc, w.hidden_norm, w.kv, w.k_norm,
                                       w.inv_freq, k_cache, v_cache, w.hidden_eps, w.k_eps)
