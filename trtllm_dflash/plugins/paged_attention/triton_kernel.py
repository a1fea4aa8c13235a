"""Paged decode attention in Triton: FlashAttention's online softmax over a row's key blocks, read in place.

One program per (batch row, KV head, tile of TQ queries) holds those queries for every query head of that KV head's
group, TQ x group rows padded to M (<= 64 live: a plain step's 1 query, or a whole verify or drafting block of 16 at
GQA 4, in one tile). It walks the row's blocks 0..nb-1 through its table row: block i of row r is pool block
table[r, i], holding positions i * BLOCK .. i * BLOCK + BLOCK - 1 as [BLOCK, H_kv, D] (position-major: the layout
and int32 table of `flash_attn_with_kvcache` with `block_table`, Dao-AILab/flash-attention
flash_attn/flash_attn_interface.py at 0053002 (2.x): k_cache (num_blocks, page_block_size, nheads_k, headdim),
block_table (batch_size, max_num_blocks_per_seq); vLLM's NHD cache, `FlashAttentionBackend.get_kv_cache_shape` in
vllm/v1/attention/backends/flash_attn.py at 0084b78: (2, num_blocks, block_size, num_kv_heads, head_size)). nb
covers the tile's last visible key only (bounded by the table's width), so a short row reads few blocks whatever the
batch's longest. Scores and the running max / sum / output are fp32; P is cast to V's dtype for its product (as
FlashAttention does); fp32 inputs use IEEE products, not TF32. Keys a query does not see are masked out of the
scores, and V rows no query of the tile sees are zeroed before the product, so whatever the pool holds there (the
null block, another request's stale keys, NaN) never reaches the output. When rows x KV heads x tiles make fewer
than about two programs per multiprocessor (a batch-1 plain step has H_kv), the blocks are split along the keys as
flash-decoding does: each split writes its unnormalised output, running max and sum (fp32) and `combine` merges
them.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

# The CPU interpreter (TRITON_INTERPRET=1, used by the tests) mis-computes tl.dot on bf16 inputs (see
# context_kv/triton_kernel.py), so there operands are upcast first.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _paged_attention_kernel(q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, pos_ptr, sinks_ptr, out_ptr,
                            acc_ptr, max_ptr, sum_ptr,  # SPLIT: partial results [S, B, T, H, (D)] fp32
                            kv_len, table_width, scale, n_splits, split_blocks, n_rows, n_heads,
                            s_qb, s_qt, s_qh,  # q and out strides: row, query, head (D is unit)
                            s_ob, s_ot, s_oh,
                            s_kn, s_kp, s_kh,  # pool strides: block, position in block, KV head (D is unit)
                            s_tr, s_pb,  # table row, positions row
                            T, TQ: tl.constexpr, GROUP: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
                            BLOCK: tl.constexpr, CAUSAL: tl.constexpr, HAS_SINKS: tl.constexpr,
                            UPCAST: tl.constexpr, PRECISION: tl.constexpr, SPLIT: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2) % n_splits  # this program's blocks: split * split_blocks ... (+ split_blocks)
    m = tl.arange(0, M)  # query t of this tile's m // GROUP, head kvh * GROUP + m % GROUP
    t = (tl.program_id(2) // n_splits) * TQ + m // GROUP
    live = (m < TQ * GROUP) & (t < T)
    head = kvh * GROUP + m % GROUP
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * s_qb + t[:, None] * s_qt + head[:, None] * s_qh + d[None, :], mask=live[:, None],
                other=0.0)
    if CAUSAL:
        limit = tl.load(pos_ptr + b * s_pb + t, mask=live, other=-1)
    else:  # block: every query sees up to the row's last query position
        limit = tl.where(live, tl.load(pos_ptr + b * s_pb + T - 1), -1)
    limit = tl.minimum(limit, kv_len - 1)
    top = tl.max(limit, axis=0)  # the last key any query of the tile sees
    nb = tl.where(top >= 0, tl.minimum(top // BLOCK + 1, table_width), 0)
    row = tl.load(rows_ptr + b).to(tl.int64)
    p = tl.arange(0, BLOCK)
    run_max = tl.full((M,), float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros((M,), dtype=tl.float32)
    acc = tl.zeros((M, D), dtype=tl.float32)
    if UPCAST:
        q = q.to(tl.float32)
    for i in range(split * split_blocks, tl.minimum(nb, (split + 1) * split_blocks)):
        # int64: block * s_kn passes 2^31 elements in a large pool
        block = tl.load(table_ptr + row * s_tr + i).to(tl.int64)
        base = block * s_kn + kvh * s_kh + p[:, None] * s_kp + d[None, :]
        k = tl.load(k_ptr + base)  # [BLOCK, D]
        v = tl.load(v_ptr + base)
        key = i * BLOCK + p
        v = tl.where((key <= top)[:, None], v, 0.0).to(v_ptr.dtype.element_ty)  # no query sees it: may be NaN
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [M, BLOCK] fp32
        s = tl.where(key[None, :] <= limit[:, None], s, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(s, axis=1))
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)  # a query with no key yet: exp(-inf) = 0
        alpha = tl.exp(run_max - safe)
        prob = tl.exp(s - safe[:, None])
        run_sum = run_sum * alpha + tl.sum(prob, axis=1)
        acc = acc * alpha[:, None] + tl.dot(prob.to(v.dtype), v, input_precision=PRECISION)
        run_max = new_max
    if SPLIT:  # unnormalised: `combine` merges the splits (and adds the sinks)
        at = ((split * n_rows + b) * T + t) * n_heads + head  # [M] index into [S, B, T, H]
        tl.store(max_ptr + at, run_max, mask=live)
        tl.store(sum_ptr + at, run_sum, mask=live)
        tl.store(acc_ptr + at[:, None] * D + d[None, :], acc, mask=live[:, None])
    else:
        if HAS_SINKS:  # softmax over [scores, sink] with the sink's column dropped: the sink only adds mass
            sink = tl.load(sinks_ptr + head).to(tl.float32)
            big = tl.maximum(run_max, sink)
            shrink = tl.exp(run_max - big)
            run_sum = run_sum * shrink + tl.exp(sink - big)
            acc = acc * shrink[:, None]
        out = acc / tl.where(run_sum > 0, run_sum, 1.0)[:, None]  # no visible key: zeros
        tl.store(out_ptr + b * s_ob + t[:, None] * s_ot + head[:, None] * s_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=live[:, None])


@functools.lru_cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def num_splits(programs: int, span_blocks: int, device: torch.device, min_blocks: int = 16) -> int:
    """Splits along the keys (flash-decoding) so that about two programs run per multiprocessor: a batch-1 plain
    step has only H_kv programs otherwise. Each split reads at least `min_blocks` blocks."""
    wanted = triton.cdiv(2 * _multiprocessors(device), programs)
    return max(1, min(wanted, span_blocks // min_blocks))


def combine(acc: torch.Tensor, top: torch.Tensor, total: torch.Tensor, sinks) -> torch.Tensor:
    """Partial results of S splits (acc [S, B, T, H, D], running max and sum [S, B, T, H]) -> [B, T, H, D] fp32."""
    big = top.amax(0)
    if sinks is not None:
        big = torch.maximum(big, sinks.float())
    big = big.masked_fill(big == float("-inf"), 0.0)
    weight = torch.exp(top - big)  # [S, B, T, H]; a split that saw no key: 0
    den = (total * weight).sum(0)
    if sinks is not None:
        den = den + torch.exp(sinks.float() - big)
    return (acc * weight[..., None]).sum(0) / torch.where(den > 0, den, 1.0)[..., None]


def paged_attention_triton(q, k_pool, v_pool, table, rows, positions, kv_len: int, causal: bool, scale: float,
                           sinks=None, splits: int | None = None) -> torch.Tensor:
    """Same contract as `reference.paged_attention_reference`; `splits` along the keys (None: `num_splits`)."""
    b, t, h, d = q.shape
    h_kv, block = k_pool.shape[2], k_pool.shape[1]
    assert k_pool.stride(-1) == 1 and v_pool.stride() == k_pool.stride() and h % h_kv == 0
    q = q if q.stride(-1) == 1 else q.contiguous()
    positions = positions.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous, as the op's fake kernel says
    group = h // h_kv
    tq = min(triton.next_power_of_2(t), max(1, 64 // group))  # queries per program: T's power of two, <= 64 rows
    tiles = triton.cdiv(t, tq)
    span = min(triton.cdiv(kv_len, block), table.shape[1])  # blocks any row can read
    splits = max(1, min(splits or num_splits(b * h_kv * tiles, span, q.device), max(span, 1)))
    per_split = triton.cdiv(max(span, 1), splits)
    splits = triton.cdiv(max(span, 1), per_split)
    parts = [torch.empty(splits, b, t, h, *extra, dtype=torch.float32, device=q.device) for extra in ((d,), (), ())
             ] if splits > 1 else [out] * 3  # one split writes out itself
    _paged_attention_kernel[(b, h_kv, tiles * splits)](
        q, k_pool, v_pool, table, rows.contiguous(), positions, sinks if sinks is not None else q, out, *parts,
        kv_len, table.shape[1], scale, splits, per_split, b, h, *q.stride()[:3], *out.stride()[:3],
        *k_pool.stride()[:3], table.stride(0), positions.stride(0), t, TQ=tq, GROUP=group,
        M=max(16, triton.next_power_of_2(tq * group)), D=d, BLOCK=block, CAUSAL=causal, HAS_SINKS=sinks is not None,
        UPCAST=INTERPRETED, PRECISION="ieee" if INTERPRETED or q.dtype == torch.float32 else "tf32",
        SPLIT=splits > 1)
    return out if splits == 1 else combine(*parts, sinks).to(q.dtype)
