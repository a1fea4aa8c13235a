"""Fused context-KV kernels: hidden_norm + the stacked K/V projection of every layer + k_norm + RoPE
(+ the cache write), in one launch over (token tile, layer x {K, V} x KV head).

The `fc` GEMM before it stays a cuBLAS matmul (`y = features @ fc.T`): it is a plain large GEMM.
Everything after it is fused here. hidden_norm needs the whole row of y, and the K loop of the
projection streams exactly that row, so its sum of squares is accumulated on the way and the
per-row scale applied once at the end:
    acc[n, :] = sum_k (y[n, k] * w_hn[k]) * W[c, k];   out = acc * rsqrt(mean_k y[n, k]^2 + eps)
One program owns BLOCK_N tokens x one head (D columns) of one layer's K or V, kept as two
halves so RoPE's rotate-half pairs (j, j + D/2) are in registers: lo' = lo cos - hi sin,
hi' = hi cos + lo sin. Accumulation is fp32 whatever the input dtype; fp32 inputs use IEEE fp32
products, not TF32.

Two entry kernels share that body: `_cache_kernel` scatters into the drafter's paged pool
[L, N_blocks, BLOCK, H_kv, D] at each token's (pool block, offset in block), from `BlockTable.locate`
(the runtime's op; the position only drives RoPE); `_dense_kernel` writes [N, L, H_kv, D] outputs with
its arguments ordered inputs, scalars, outputs (the TensorRT plugin).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .spec import ContextKVWeights

# The CPU interpreter (TRITON_INTERPRET=1, used by the tests) mis-computes tl.dot on bf16 inputs,
# so there operands are upcast first; on a GPU the dot runs natively on bf16/fp16 tensor cores.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _project_tile(y_ptr, hn_ptr, w_ptr, kn_ptr, freq_ptr, pos_ptr, N, H, HIDDEN_EPS: tl.constexpr,
                  K_EPS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """-> (lo, hi) [BLOCK_N, HALF] fp32 halves of this program's head, rows, row mask, positions."""
    col = tl.program_id(1)  # (layer, kind, head) flattened; kind 0 = K, 1 = V
    layer = col // (2 * NUM_KV_HEADS)
    kind = (col // NUM_KV_HEADS) % 2
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    j = tl.arange(0, HALF)
    w_lo = w_ptr + (col * 2 * HALF + j)[:, None] * H  # weight rows of this head's first half
    w_hi = w_lo + HALF * H
    acc_lo = tl.zeros((BLOCK_N, HALF), dtype=tl.float32)
    acc_hi = tl.zeros((BLOCK_N, HALF), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < H
        y = tl.load(y_ptr + rows[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        sumsq += tl.sum(y.to(tl.float32) * y.to(tl.float32), axis=1)
        x = (y.to(tl.float32) * tl.load(hn_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]).to(y.dtype)
        wl = tl.load(w_lo + ks[None, :], mask=k_ok[None, :], other=0.0)
        wh = tl.load(w_hi + ks[None, :], mask=k_ok[None, :], other=0.0)
        if UPCAST:
            x, wl, wh = x.to(tl.float32), wl.to(tl.float32), wh.to(tl.float32)
        acc_lo += tl.dot(x, tl.trans(wl), input_precision=PRECISION)
        acc_hi += tl.dot(x, tl.trans(wh), input_precision=PRECISION)
    scale = tl.rsqrt(sumsq / H + HIDDEN_EPS)[:, None]
    lo = acc_lo * scale
    hi = acc_hi * scale
    pos = tl.load(pos_ptr + rows, mask=row_ok, other=0)
    if kind == 0:  # K: k_norm over the whole head, then RoPE at the token's absolute position
        inv = tl.rsqrt((tl.sum(lo * lo, axis=1) + tl.sum(hi * hi, axis=1)) / (2 * HALF) + K_EPS)[:, None]
        lo = lo * inv * tl.load(kn_ptr + layer * 2 * HALF + j).to(tl.float32)[None, :]
        hi = hi * inv * tl.load(kn_ptr + layer * 2 * HALF + HALF + j).to(tl.float32)[None, :]
        angle = pos[:, None].to(tl.float32) * tl.load(freq_ptr + j)[None, :]
        cos, sin = tl.cos(angle), tl.sin(angle)
        lo, hi = lo * cos - hi * sin, hi * cos + lo * sin
    return lo, hi, rows, row_ok, pos


@triton.jit
def _cache_kernel(y_ptr, hn_ptr, w_ptr, kn_ptr, freq_ptr, pos_ptr, blk_ptr, off_ptr, kc_ptr, vc_ptr, N, H,
                  s_pl, s_pb, s_po, s_ph,  # pool strides: layer, block, offset in block, head (D is unit)
                  HIDDEN_EPS: tl.constexpr, K_EPS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    lo, hi, rows, row_ok, _ = _project_tile(y_ptr, hn_ptr, w_ptr, kn_ptr, freq_ptr, pos_ptr, N, H, HIDDEN_EPS,
                                            K_EPS, NUM_KV_HEADS, HALF, BLOCK_N, BLOCK_K, UPCAST, PRECISION)
    col = tl.program_id(1)
    layer, kind, head = col // (2 * NUM_KV_HEADS), (col // NUM_KV_HEADS) % 2, col % NUM_KV_HEADS
    block = tl.load(blk_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    offset = tl.load(off_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    out = tl.where(kind == 0, kc_ptr, vc_ptr)
    # int64 offsets: a whole pool (layers x blocks) can pass 2^31 elements while each stride fits in int32
    base = out + layer.to(tl.int64) * s_pl + block[:, None] * s_pb + offset[:, None] * s_po + head * s_ph
    j = tl.arange(0, HALF)[None, :]
    tl.store(base + j, lo.to(kc_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(base + HALF + j, hi.to(kc_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _dense_kernel(y_ptr, hn_ptr, w_ptr, kn_ptr, freq_ptr, pos_ptr, N, H, k_ptr, v_ptr,
                  HIDDEN_EPS: tl.constexpr, K_EPS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                  NUM_LAYERS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
                  PRECISION: tl.constexpr):
    lo, hi, rows, row_ok, pos = _project_tile(y_ptr, hn_ptr, w_ptr, kn_ptr, freq_ptr, pos_ptr, N, H, HIDDEN_EPS,
                                              K_EPS, NUM_KV_HEADS, HALF, BLOCK_N, BLOCK_K, UPCAST, PRECISION)
    col = tl.program_id(1)
    layer, kind, head = col // (2 * NUM_KV_HEADS), (col // NUM_KV_HEADS) % 2, col % NUM_KV_HEADS
    out = tl.where(kind == 0, k_ptr, v_ptr)  # outputs [N, L, H_kv, D], contiguous
    base = out + rows[:, None] * (NUM_LAYERS * NUM_KV_HEADS * 2 * HALF) + (layer * NUM_KV_HEADS + head) * 2 * HALF
    j = tl.arange(0, HALF)[None, :]
    tl.store(base + j, lo.to(k_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(base + HALF + j, hi.to(k_ptr.dtype.element_ty), mask=row_ok[:, None])


def supported(w: ContextKVWeights) -> bool:
    """Shapes the kernel handles: head_dim a power of two, halves >= 16 on a GPU (tl.dot's minimum)."""
    d = w.head_dim
    return d & (d - 1) == 0 and (INTERPRETED or d // 2 >= 16)


def kernel_constants(hidden_eps: float, k_eps: float, num_kv_heads: int, head_dim: int, hidden: int, fp32: bool,
                     interpreted: bool = INTERPRETED, block_n: int = 16, block_k: int = 64) -> dict:
    """The compile-time constants of one specialisation (shared by the launchers and TensorRT AOT)."""
    return dict(HIDDEN_EPS=hidden_eps, K_EPS=k_eps, NUM_KV_HEADS=num_kv_heads, HALF=head_dim // 2,
                BLOCK_N=block_n, BLOCK_K=min(block_k, triton.next_power_of_2(hidden)), UPCAST=interpreted,
                # fp32 models get full fp32 products (TF32's 10-bit mantissa could flip a greedy argmax)
                PRECISION="ieee" if interpreted or fp32 else "tf32")


def launch_constants(w: ContextKVWeights, dtype: torch.dtype, hidden: int) -> dict:
    return kernel_constants(w.hidden_eps, w.k_eps, w.num_kv_heads, w.head_dim, hidden, dtype == torch.float32)


def grid(n: int, w: ContextKVWeights, block_n: int = 16) -> tuple[int, int]:
    return triton.cdiv(n, block_n), w.num_layers * 2 * w.num_kv_heads


def context_kv_triton(features, positions, blocks, offsets, w: ContextKVWeights, k_pool, v_pool) -> None:
    """Same contract as `context_kv_reference`; k_pool/v_pool: [L, N_blocks, BLOCK, H_kv, D], D contiguous."""
    y = (features @ w.fc.T).contiguous()  # [N, H]: the fc GEMM (cuBLAS)
    n, hidden = y.shape
    if n == 0:
        return
    assert k_pool.dim() == 5 and k_pool.stride(-1) == 1 and k_pool.stride() == v_pool.stride()
    _cache_kernel[grid(n, w)](y, w.hidden_norm, w.kv, w.k_norm, w.inv_freq.float().contiguous(),
                              positions.contiguous(), blocks.contiguous(), offsets.contiguous(), k_pool, v_pool,
                              n, hidden, *k_pool.stride()[:4], **launch_constants(w, y.dtype, hidden))


def context_kv_dense_triton(y, positions, w: ContextKVWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """The TensorRT plugin's contract, runnable from PyTorch: y [N, H] (fc output) -> k, v [N, L, H_kv, D]."""
    n, hidden = y.shape
    k = torch.empty(n, w.num_layers, w.num_kv_heads, w.head_dim, dtype=y.dtype, device=y.device)
    v = torch.empty_like(k)
    if n:
        _dense_kernel[grid(n, w)](y.contiguous(), w.hidden_norm, w.kv, w.k_norm, w.inv_freq.float().contiguous(),
                                  positions.contiguous(), n, hidden, k, v, NUM_LAYERS=w.num_layers,
                                  **launch_constants(w, y.dtype, hidden))
    return k, v
