"""The op's definition in plain PyTorch (gather + mask, fp32 accumulation): the CPU path of the op.

Visibility (models/attention.py's rule for full-attention caches): query t of row b at positions[b, t] sees the
keys at positions 0..L, L = positions[b, t] (causal) or positions[b, -1] (block, `causal=False`: DFlash drafting),
and never a key at or past kv_len. A query that sees no key gets zeros (FlashAttention's convention,
`flash_attn_with_kvcache` in Dao-AILab/flash-attention flash_attn/flash_attn_interface.py at 0053002, 2.x).
"""

from __future__ import annotations

import torch
from torch import Tensor


def limits(positions: Tensor, kv_len: int, causal: bool) -> Tensor:
    """positions [B, T] -> the last visible key position of each query [B, T] (negative: none)."""
    last = positions if causal else positions[:, -1:].expand_as(positions)
    return last.clamp(max=kv_len - 1)


def paged_attention_reference(q: Tensor, k_pool: Tensor, v_pool: Tensor, table: Tensor, rows: Tensor,
                              positions: Tensor, kv_len: int, causal: bool, scale: float,
                              sinks: Tensor | None = None) -> Tensor:
    """q [B, T, H, D]; k_pool, v_pool [N + 1, BLOCK, H_kv, D]; table [S, M] int32; rows [B] long (each batch row's
    table row); positions [B, T] long -> [B, T, H, D] in q's dtype. Sinks [H] join the softmax denominator only."""
    b, t, h, d = q.shape
    block, h_kv = k_pool.shape[1], k_pool.shape[2]
    nb = min(-(-kv_len // block), table.shape[1])
    blocks = table[rows, :nb].long()  # [B, nb]
    span = nb * block
    k = k_pool[blocks].view(b, span, h_kv, d).float()  # [B, S, H_kv, D]
    v = v_pool[blocks].view(b, span, h_kv, d).float()
    limit = limits(positions, kv_len, causal)  # [B, T]
    seen = torch.arange(span, device=q.device)[None, None, :] <= limit[:, :, None]  # [B, T, S]
    # keys no query of the row sees may be anything (NaN included): zero them so that 0 * v stays 0
    v = v.masked_fill(~seen.any(1)[:, :, None, None], 0.0)
    qg = q.float().view(b, t, h_kv, h // h_kv, d)  # head h -> KV head h // group (transformers' repeat_kv)
    scores = torch.einsum("btkgd,bskd->bkgts", qg, k) * scale  # [B, H_kv, G, T, S]
    scores = scores.masked_fill(~seen[:, None, None], float("-inf"))
    top = scores.amax(-1, keepdim=True)
    if sinks is not None:
        top = torch.maximum(top, sinks.float().view(1, h_kv, -1, 1, 1))
    top = top.masked_fill(top == float("-inf"), 0.0)
    p = torch.exp(scores - top)
    total = p.sum(-1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(sinks.float().view(1, h_kv, -1, 1, 1) - top)
    out = torch.einsum("bkgts,bskd->btkgd", p / total.clamp(min=torch.finfo(torch.float32).tiny), v)
    return out.reshape(b, t, h, d).to(q.dtype)
