"""The fused context-KV Triton kernel against a float64 reference (CPU: Triton's interpreter)."""

import pytest
import torch

from trtllm_dflash.plugins.context_kv import ContextKVWeights
from trtllm_dflash.plugins.context_kv.reference import context_kv_reference, project_context_kv
from trtllm_dflash.plugins.context_kv.triton_kernel import context_kv_triton

POISON = 1e4


def random_weights(g, hidden, n_ids, layers, kv_heads, head_dim, dtype) -> ContextKVWeights:
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)
    return ContextKVWeights(
        fc=rnd(hidden, n_ids * hidden, scale=hidden ** -0.5), hidden_norm=1 + rnd(hidden, scale=0.1),
        kv=rnd(layers * 2 * kv_heads * head_dim, hidden, scale=hidden ** -0.5),
        k_norm=1 + rnd(layers, head_dim, scale=0.1),
        inv_freq=1.0 / 1e6 ** (torch.arange(0, head_dim, 2).float() / head_dim), hidden_eps=1e-6, k_eps=1e-6)


def as64(w: ContextKVWeights) -> ContextKVWeights:
    to = lambda t: t.double()  # noqa: E731
    return ContextKVWeights(to(w.fc), to(w.hidden_norm), to(w.kv), to(w.k_norm), w.inv_freq.double(),
                            w.hidden_eps, w.k_eps)


def ragged_tokens(g, new_tokens: list[int], starts: list[int], slots: list[int]):
    """Flatten a batch where request b adds new_tokens[b] tokens at positions starts[b]... in slot slots[b]."""
    pos = torch.cat([s + torch.arange(n) for n, s in zip(new_tokens, starts)])
    slot = torch.cat([torch.full((n,), s) for n, s in zip(new_tokens, slots)])
    return pos, slot


CASES = [  # hidden, n_ids, layers, kv heads, head_dim, new tokens per request, start positions, slots
    (64, 3, 2, 2, 64, [1, 16, 5], [0, 40, 3000], [2, 0, 1]),
    (128, 2, 3, 1, 128, [7, 1], [9000, 17], [1, 3]),
    (96, 5, 2, 4, 64, [33], [100_000], [0]),
    (32, 2, 2, 2, 16, [4, 2, 9], [5, 0, 60], [0, 1, 2]),
]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2), (torch.float16, 3e-3)])
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_float64_reference(case, dtype, tol):
    hidden, n_ids, layers, kv_heads, head_dim, new, starts, slots = case
    g = torch.Generator().manual_seed(hash((case[0], case[4], str(dtype))) % 2**31)
    w = random_weights(g, hidden, n_ids, layers, kv_heads, head_dim, dtype)
    pos, slot = ragged_tokens(g, new, starts, slots)
    features = torch.randn(len(pos), n_ids * hidden, generator=g).to(dtype)
    capacity = int(pos.max()) + 3
    shape = (layers, max(slots) + 2, kv_heads, capacity, head_dim)
    k_cache = torch.full(shape, POISON, dtype=dtype)
    v_cache = torch.full(shape, POISON, dtype=dtype)
    context_kv_triton(features, pos, slot, w, k_cache, v_cache)
    k_ref, v_ref = project_context_kv(features.double(), pos, as64(w))  # [N, L, H_kv, D]
    k_out, v_out = k_cache[:, slot, :, pos].double(), v_cache[:, slot, :, pos].double()
    for out, ref in ((k_out, k_ref), (v_out, v_ref)):
        assert ((out - ref).norm() / ref.norm()).item() < tol
    written = torch.zeros(shape[1], shape[3], dtype=torch.bool)
    written[slot, pos] = True
    untouched = ~written[None, :, None, :, None].expand(shape)
    assert (k_cache[untouched] == POISON).all() and (v_cache[untouched] == POISON).all()
    assert (k_cache[~untouched] != POISON).all() and (v_cache[~untouched] != POISON).all()


def test_reference_path_writes_the_same_places():
    g = torch.Generator().manual_seed(0)
    w = random_weights(g, 64, 2, 2, 2, 64, torch.float32)
    pos, slot = ragged_tokens(g, [3, 5], [10, 2], [1, 0])
    features = torch.randn(len(pos), 128, generator=g)
    caches = [torch.full((2, 2, 2, 16, 64), POISON) for _ in range(4)]
    context_kv_reference(features, pos, slot, w, caches[0], caches[1])
    context_kv_triton(features, pos, slot, w, caches[2], caches[3])
    torch.testing.assert_close(caches[0], caches[2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[1], caches[3], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", CASES[:2])
def test_dense_kernel_for_tensorrt_matches_reference(case):
    """The TensorRT plugin's kernel (dense [N, L, H_kv, D] outputs) on the same fp64 oracle."""
    from trtllm_dflash.plugins.context_kv.triton_kernel import context_kv_dense_triton

    hidden, n_ids, layers, kv_heads, head_dim, new, starts, slots = case
    g = torch.Generator().manual_seed(7)
    w = random_weights(g, hidden, n_ids, layers, kv_heads, head_dim, torch.float32)
    pos, _ = ragged_tokens(g, new, starts, slots)
    features = torch.randn(len(pos), n_ids * hidden, generator=g)
    k, v = context_kv_dense_triton(features @ w.fc.T, pos, w)
    k_ref, v_ref = project_context_kv(features.double(), pos, as64(w))
    assert ((k.double() - k_ref).norm() / k_ref.norm()).item() < 2e-6
    assert ((v.double() - v_ref).norm() / v_ref.norm()).item() < 2e-6
