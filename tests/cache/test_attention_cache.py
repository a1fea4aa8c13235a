"""The attention/cache interface against explicit softmax attention over each row's true history."""

import pytest
import torch

from trtllm_dflash.cache.kv_cache import KVCache, LayerCacheSpec
from trtllm_dflash.models.attention import AttentionSpec, ForwardContext

H, HKV, D = 4, 2, 8


def oracle(q, history, q_pos, window, sinks=None):
    """q [T, H, D] at positions q_pos; history: {position: (k [H_kv, D], v)} -> [T, H, D]."""
    out = torch.empty_like(q)
    for t, p in enumerate(q_pos):
        keys = sorted(j for j in history if j <= p and (window is None or p - j < window))
        k = torch.stack([history[j][0] for j in keys]).repeat_interleave(H // HKV, dim=1)  # [S, H, D]
        v = torch.stack([history[j][1] for j in keys]).repeat_interleave(H // HKV, dim=1)
        scores = torch.einsum("hd,shd->hs", q[t], k) / D ** 0.5
        if sinks is not None:
            scores = torch.cat([scores, sinks[:, None]], dim=1)
        probs = scores.softmax(-1)[:, : len(keys)]
        out[t] = torch.einsum("hs,shd->hd", probs, v)
    return out


def random_qkv(g, b, t):
    return (torch.randn(b, t, H, D, generator=g), torch.randn(b, t, HKV, D, generator=g),
            torch.randn(b, t, HKV, D, generator=g))


@pytest.mark.parametrize("kind", ["full", "window"])
def test_window_attention_over_prefill_verify_and_rollback(kind):
    """Two rows: ragged prompts longer than the ring, verify blocks of 3 then 2 tokens with different
    acceptance per row (rejected entries stay in the cache), every output equal to the oracle's."""
    window, block = 4, 3
    spec = AttentionSpec(H, HKV, D, window=window)
    cache = KVCache([LayerCacheSpec(kind, window if kind == "window" else None)], 2, HKV, 40, D, torch.float32,
                    "cpu", max_step_tokens=block)
    if kind == "window":
        assert cache.layers[0].k.shape[2] == window + block - 1 + 1  # the ring plus its spare entry
    g = torch.Generator().manual_seed(0)
    lengths = [13, 7]
    history = [{}, {}]  # per row: position -> (k, v) of committed tokens
    q, k, v = random_qkv(g, 2, 13)
    positions = torch.arange(13).expand(2, -1)
    ctx = ForwardContext.prefill(positions, cache, torch.tensor([0, 1]), torch.tensor(lengths))
    out = ctx.attend(0, spec, q, k, v)
    for b, n in enumerate(lengths):
        history[b].update({p: (k[b, p], v[b, p]) for p in range(n)})
        torch.testing.assert_close(out[b, :n], oracle(q[b, :n], history[b], range(n), window))
    starts = list(lengths)
    for t, accepted in ((3, [0, 2]), (2, [1, 0]), (3, [2, 2])):
        q, k, v = random_qkv(g, 2, t)
        positions = torch.tensor(starts)[:, None] + torch.arange(t)
        ctx = ForwardContext.cached(positions, cache, max(starts) + t)
        out = ctx.attend(0, spec, q, k, v)
        for b in range(2):
            block_kv = {starts[b] + i: (k[b, i], v[b, i]) for i in range(t)}
            expected = oracle(q[b], {**history[b], **block_kv}, positions[b].tolist(), window)
            torch.testing.assert_close(out[b], expected)
            keep = accepted[b] + 1  # accepted drafts + the anchor; the rest is rejected
            history[b].update({p: block_kv[p] for p in range(starts[b], starts[b] + keep)})
            starts[b] += keep


def test_block_attention_sees_the_whole_block_and_the_context_only():
    """DFlash drafting (causal=False): every block query sees the context and all block keys."""
    spec = AttentionSpec(H, HKV, D, causal=False)
    cache = KVCache([LayerCacheSpec()], 1, HKV, 32, D, torch.float32, "cpu")
    g = torch.Generator().manual_seed(1)
    _, k0, v0 = random_qkv(g, 1, 20)  # stale entries at 10..19 must stay invisible
    cache.layers[0].write(ForwardContext(torch.arange(20)[None], cache, torch.tensor([0])), k0, v0)
    q, k, v = random_qkv(g, 1, 4)
    out = ForwardContext.cached(10 + torch.arange(4)[None], cache, 20).attend(0, spec, q, k, v)
    history = {p: (k0[0, p], v0[0, p]) for p in range(10)} | {10 + i: (k[0, i], v[0, i]) for i in range(4)}
    expected = oracle(q[0], history, [13] * 4, None)  # a query at the block's end sees everything before it
    torch.testing.assert_close(out[0], expected)


def test_sinks_match_transformers_gpt_oss_eager_attention():
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    g = torch.Generator().manual_seed(2)
    spec = AttentionSpec(H, HKV, D)
    sinks = torch.randn(H, generator=g) * 2
    cache = KVCache([LayerCacheSpec()], 1, HKV, 16, D, torch.float32, "cpu")
    q, k, v = random_qkv(g, 1, 9)
    out = ForwardContext.prefill(torch.arange(9)[None], cache, torch.tensor([0]), torch.tensor([9])).attend(
        0, spec, q, k, v, sinks)
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups = sinks, H // HKV
    causal = torch.full((9, 9), float("-inf")).triu(1)[None, None]
    expected, _ = eager_attention_forward(module, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal,
                                          D ** -0.5)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[0], oracle(q[0], {p: (k[0, p], v[0, p]) for p in range(9)}, range(9), None, sinks))
