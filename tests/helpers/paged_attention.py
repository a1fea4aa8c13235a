"""The paged attention oracle: float64 softmax attention of each (row, query) over the keys it sees."""

import torch


def oracle(q, keys, values, positions, causal, scale, sinks):
    """float64: each (row, query) over the keys at positions 0..last it sees; head h reads KV head h // group."""
    b, t, h, d = q.shape
    out = torch.zeros(b, t, h, d, dtype=torch.float64)
    for r in range(b):
        for i in range(t):
            last = int(positions[r, i] if causal else positions[r, -1])
            k = keys[r][: last + 1].repeat_interleave(h // keys[r].shape[1], dim=1)  # [L, H, D]
            v = values[r][: last + 1].repeat_interleave(h // keys[r].shape[1], dim=1)
            logits = torch.einsum("hd,lhd->hl", q[r, i].double(), k) * scale  # [H, L]
            if sinks is not None:
                logits = torch.cat([logits, sinks.double()[:, None]], dim=1)
            probs = torch.softmax(logits, dim=1)[:, : last + 1]
            out[r, i] = torch.einsum("hl,lhd->hd", probs, v)
    return out
