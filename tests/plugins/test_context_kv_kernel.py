"""The fused context-KV Triton kernel writing the paged pool, against a float64 reference placed token by token
(CPU: Triton's interpreter)."""

import pytest
import torch

from trtllm_dflash.cache.kv_cache import BLOCK, BlockTable
from trtllm_dflash.plugins.context_kv import ContextKVWeights
from trtllm_dflash.plugins.context_kv.op import write_context_kv
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


def ragged_tokens(g, new_tokens: list[int], starts: list[int], rows: list[int]):
    """Flatten a batch where request b adds new_tokens[b] tokens at positions starts[b]... of table row rows[b]."""
    pos = torch.cat([s + torch.arange(n) for n, s in zip(new_tokens, starts)])
    row = torch.cat([torch.full((n,), r) for n, r in zip(new_tokens, rows)])
    return pos, row


def scattered_table(g, pos, row, spare: int = 3) -> tuple[BlockTable, dict]:
    """A block table where each (row, logical block) the tokens touch owns a pool block at random, `spare` blocks
    owned by nobody -> (table, {(row, logical block): pool block}) (the mapping as plain Python, for the oracle)."""
    needed = sorted({(int(r), int(p) // BLOCK) for r, p in zip(row, pos)})
    num_blocks = len(needed) + spare
    owned = dict(zip(needed, torch.randperm(num_blocks, generator=g)[: len(needed)].tolist()))
    table = BlockTable(int(row.max()) + 2, int(pos.max()) + 1, num_blocks, "cpu")
    table.set(*map(list, zip(*((r, i, b) for (r, i), b in owned.items()))))
    return table, owned


def expected_pools(k, v, pos, row, owned, shape, dtype):
    """k, v [N, L, H_kv, D] placed token by token at pool[:, owned[row, pos // BLOCK], pos % BLOCK]; POISON
    elsewhere. -> k_pool, v_pool, written mask [N_blocks, BLOCK]."""
    k_pool, v_pool = torch.full(shape, POISON, dtype=dtype), torch.full(shape, POISON, dtype=dtype)
    written = torch.zeros(shape[1], BLOCK, dtype=torch.bool)
    for n, (r, p) in enumerate(zip(row.tolist(), pos.tolist())):
        block, offset = owned[r, p // BLOCK], p % BLOCK
        k_pool[:, block, offset], v_pool[:, block, offset] = k[n].to(dtype), v[n].to(dtype)
        written[block, offset] = True
    return k_pool, v_pool, written


CASES = [  # hidden, n_ids, layers, kv heads, head_dim, new tokens per request, start positions, table rows
    (64, 3, 2, 2, 64, [1, 16, 5], [0, 40, 3000], [2, 0, 1]),
    (128, 2, 3, 1, 128, [7, 1], [9000, 17], [1, 3]),
    (96, 5, 2, 4, 64, [33], [100_000], [0]),
    (32, 2, 2, 2, 16, [4, 2, 9], [5, 0, 60], [0, 1, 2]),
]


def paged_case(case, dtype, seed):
    """-> features, positions, rows, weights, the table's (blocks, offsets) per token, {(row, i): block}, pool shape."""
    hidden, n_ids, layers, kv_heads, head_dim, new, starts, rows = case
    g = torch.Generator().manual_seed(seed)
    w = random_weights(g, hidden, n_ids, layers, kv_heads, head_dim, dtype)
    pos, row = ragged_tokens(g, new, starts, rows)
    features = torch.randn(len(pos), n_ids * hidden, generator=g).to(dtype)
    table, owned = scattered_table(g, pos, row)
    shape = (layers, table.num_blocks + 1, BLOCK, kv_heads, head_dim)  # the last block is the null block
    return features, pos, row, w, table.locate(row, pos), owned, shape


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2), (torch.float16, 3e-3)])
@pytest.mark.parametrize("case", CASES)
def test_kernel_writes_the_paged_pool_like_a_float64_reference(case, dtype, tol):
    features, pos, row, w, (blocks, offsets), owned, shape = paged_case(case, dtype, hash((case[0], case[4])) % 2**31)
    k_pool = torch.full(shape, POISON, dtype=dtype)
    v_pool = torch.full(shape, POISON, dtype=dtype)
    context_kv_triton(features, pos, blocks, offsets, w, k_pool, v_pool)
    k_ref, v_ref = project_context_kv(features.double(), pos, as64(w))  # [N, L, H_kv, D]
    k_exp, v_exp, written = expected_pools(k_ref, v_ref, pos, row, owned, shape, torch.float64)
    assert not written[-1].any()  # the null block is nobody's
    for out, exp in ((k_pool, k_exp), (v_pool, v_exp)):
        got, want = out.double()[:, written], exp[:, written]  # [L, N, H_kv, D]
        assert ((got - want).norm() / want.norm()).item() < tol
        assert (out[:, ~written] == POISON).all()  # other offsets, other blocks and the null block untouched


@pytest.mark.parametrize("case", CASES[:2])
def test_op_and_reference_write_the_pool_in_the_same_places(case):
    """The op (on CPU: the reference) and the kernel against the same token-by-token placement."""
    features, pos, row, w, (blocks, offsets), owned, shape = paged_case(case, torch.float32, 0)
    k, v = project_context_kv(features, pos, w)
    k_exp, v_exp, _ = expected_pools(k, v, pos, row, owned, shape, torch.float32)
    for write in (write_context_kv, context_kv_reference, context_kv_triton):
        k_pool, v_pool = torch.full(shape, POISON), torch.full(shape, POISON)
        write(features, pos, blocks, offsets, w, k_pool, v_pool)
        torch.testing.assert_close(k_pool, k_exp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v_pool, v_exp, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", CASES[:2])
def test_dense_kernel_for_tensorrt_matches_reference(case):
    """The TensorRT plugin's kernel (dense [N, L, H_kv, D] outputs) on the same fp64 oracle."""
    from trtllm_dflash.plugins.context_kv.triton_kernel import context_kv_dense_triton

    hidden, n_ids, layers, kv_heads, head_dim, new, starts, rows = case
    g = torch.Generator().manual_seed(7)
    w = random_weights(g, hidden, n_ids, layers, kv_heads, head_dim, torch.float32)
    pos, _ = ragged_tokens(g, new, starts, rows)
    features = torch.randn(len(pos), n_ids * hidden, generator=g)
    k, v = context_kv_dense_triton(features @ w.fc.T, pos, w)
    k_ref, v_ref = project_context_kv(features.double(), pos, as64(w))
    assert ((k.double() - k_ref).norm() / k_ref.norm()).item() < 2e-6
    assert ((v.double() - v_ref).norm() / v_ref.norm()).item() < 2e-6
