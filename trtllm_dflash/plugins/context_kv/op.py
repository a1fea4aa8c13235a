"""`torch.ops.trtllm_dflash.context_kv`: the fused Triton kernel on CUDA, the reference elsewhere."""

from __future__ import annotations

import torch
from torch import Tensor

from .reference import context_kv_reference
from .spec import ContextKVWeights


def _weights(fc, hidden_norm, kv, k_norm, inv_freq, hidden_eps, k_eps) -> ContextKVWeights:
    return ContextKVWeights(fc, hidden_norm, kv, k_norm, inv_freq, hidden_eps, k_eps)


@torch.library.custom_op("trtllm_dflash::context_kv", mutates_args=("k_pool", "v_pool"))
def context_kv(features: Tensor, positions: Tensor, blocks: Tensor, offsets: Tensor, fc: Tensor, hidden_norm: Tensor,
               kv: Tensor, k_norm: Tensor, inv_freq: Tensor, k_pool: Tensor, v_pool: Tensor, hidden_eps: float,
               k_eps: float) -> None:
    """features [N, n_ids*H], positions, blocks, offsets [N] -> writes k_pool/v_pool [L, N_blocks, BLOCK, H_kv, D]."""
    w = _weights(fc, hidden_norm, kv, k_norm, inv_freq, hidden_eps, k_eps)
    context_kv_reference(features, positions, blocks, offsets, w, k_pool, v_pool)


@context_kv.register_kernel("cuda")
def _context_kv_cuda(features, positions, blocks, offsets, fc, hidden_norm, kv, k_norm, inv_freq, k_pool, v_pool,
                     hidden_eps, k_eps) -> None:
    from .triton_kernel import context_kv_triton, supported  # triton is imported only where CUDA runs

    w = _weights(fc, hidden_norm, kv, k_norm, inv_freq, hidden_eps, k_eps)
    run = context_kv_triton if supported(w) else context_kv_reference
    run(features, positions, blocks, offsets, w, k_pool, v_pool)


def write_context_kv(features: Tensor, positions: Tensor, blocks: Tensor, offsets: Tensor, w: ContextKVWeights,
                     k_pool: Tensor, v_pool: Tensor) -> None:
    """Project and store the context K/V of N ragged tokens for every draft layer in the paged pool (one op call):
    token n at positions[n] goes to pool block blocks[n], offset offsets[n] (`BlockTable.locate`)."""
    torch.ops.trtllm_dflash.context_kv(features, positions, blocks, offsets, w.fc, w.hidden_norm, w.kv, w.k_norm,
                                       w.inv_freq, k_pool, v_pool, w.hidden_eps, w.k_eps)
