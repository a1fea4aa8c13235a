"""The paged attention op (its PyTorch reference) and its Triton kernel (CPU: Triton's interpreter) against a
float64 loop over rows, queries and the keys each query sees, placed by position; the pool around them poisoned."""

import os
import subprocess
import sys

import pytest
import torch
from helpers.paged_attention import oracle

from trtllm_dflash.cache.kv_cache import BLOCK, BlockTable
from trtllm_dflash.plugins.paged_attention.reference import paged_attention_reference
from trtllm_dflash.plugins.paged_attention.triton_kernel import paged_attention_triton

HUGE = 1e30  # blocks owned by nobody; NaN in the null block and past each row's keys in its own blocks


def paged_rows(g, lengths, slots, num_slots, h_kv, d, dtype, spare=3):
    """Rows' keys [L_b, H_kv, D] (float64, rounded through dtype) placed position by position in a pool whose blocks
    are scattered at random -> keys, values, k_pool, v_pool, table."""
    owned = [(s, i) for s, n in zip(slots, lengths) for i in range(-(-n // BLOCK))]
    num_blocks = len(owned) + spare
    table = BlockTable(num_slots, max(lengths) + 4, num_blocks, "cpu")
    pick = torch.randperm(num_blocks, generator=g)[: len(owned)].tolist()
    table.set(*map(list, zip(*((s, i, blk) for (s, i), blk in zip(owned, pick)))))
    shape = (num_blocks + 1, BLOCK, h_kv, d)
    k_pool, v_pool = torch.full(shape, HUGE, dtype=dtype), torch.full(shape, -HUGE, dtype=dtype)
    for pool in (k_pool, v_pool):
        pool[num_blocks] = float("nan")  # the null block
        for blk in pick:
            pool[blk] = float("nan")
    keys, values = [], []
    for s, n in zip(slots, lengths):
        k = torch.randn(n, h_kv, d, generator=g).to(dtype)
        v = torch.randn(n, h_kv, d, generator=g).to(dtype)
        for pos in range(n):
            blk = int(table.table[s, pos // BLOCK])
            k_pool[blk, pos % BLOCK], v_pool[blk, pos % BLOCK] = k[pos], v[pos]
        keys.append(k.double())
        values.append(v.double())
    return keys, values, k_pool, v_pool, table.table


CASES = [  # heads, kv heads, head_dim, queries per row, keys per row, causal, sinks
    (4, 2, 64, 1, [1, 37, 80], True, False),
    (8, 8, 64, 1, [16, 5, 33], True, True),
    (4, 1, 128, 16, [16, 50, 81], True, False),
    (4, 2, 128, 16, [17, 32, 70], False, False),
    (6, 2, 64, 16, [40, 16], False, True),
    (2, 2, 64, 3, [3, 20], True, True),
    (4, 2, 64, 40, [45, 90], True, False),  # a chunk's T: two tiles of 32 queries
    (2, 1, 64, 70, [70], False, True),
]


def make_case(case, dtype, gathered, seed=0):
    h, h_kv, d, t, lengths, causal, with_sinks = case
    g = torch.Generator().manual_seed(seed)
    num_slots = len(lengths) + 2
    slots = torch.randperm(num_slots, generator=g)[: len(lengths)].tolist() if gathered else list(range(len(lengths)))
    keys, values, k_pool, v_pool, table = paged_rows(g, lengths, slots, num_slots, h_kv, d, dtype)
    q = torch.randn(len(lengths), t, h, d, generator=g).to(dtype)
    positions = torch.stack([torch.arange(n - t, n) for n in lengths])  # each row's last t positions
    sinks = torch.randn(h, generator=g) if with_sinks else None
    args = (q, k_pool, v_pool, table, torch.tensor(slots), positions, max(lengths), causal, d ** -0.5, sinks)
    return args, oracle(q, keys, values, positions, causal, d ** -0.5, sinks)


TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.mark.parametrize("splits", [1, 3], ids=["one-split", "split-kv"])
@pytest.mark.parametrize("gathered", [False, True], ids=["rows-0..B-1", "rows-gathered"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_triton_kernel_against_oracle(case, dtype, gathered, splits):
    """splits: the keys split three ways (flash-decoding), as a GPU does when rows x heads are few."""
    args, expected = make_case(case, dtype, gathered)
    out = paged_attention_triton(*args, splits=splits)
    assert out.dtype == dtype and out.shape == args[0].shape
    torch.testing.assert_close(out.double(), expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_op_reference_against_oracle(case, dtype):
    args, expected = make_case(case, dtype, gathered=True)
    out = torch.ops.trtllm_dflash.paged_attention(*args)
    torch.testing.assert_close(out.double(), expected, **TOL[dtype])


@pytest.mark.parametrize("with_sinks", [False, True], ids=["no-sinks", "sinks"])
def test_queries_past_the_key_span_see_only_keys_before_it(with_sinks):
    """kv_len bounds what any query sees (a padded row's junk positions); a query that sees nothing gets zeros."""
    args, _ = make_case(CASES[0], torch.float32, gathered=False)
    q, k_pool, v_pool, table, rows, positions, kv_len, causal, scale, _ = args
    sinks = torch.randn(q.shape[2]) if with_sinks else None
    split = lambda *a: paged_attention_triton(*a, splits=2)  # noqa: E731
    for run in (paged_attention_reference, paged_attention_triton, split):  # rows hold 1, 37 and 80 keys
        out = run(q, k_pool, v_pool, table, rows, torch.tensor([[-1], [500], [20]]), 37, causal, scale, sinks)
        assert torch.isfinite(out).all() and (out[0] == 0).all()
        within = run(q, k_pool, v_pool, table, rows, torch.tensor([[0], [36], [20]]), 37, causal, scale, sinks)
        torch.testing.assert_close(out[1:], within[1:])


def test_op_registration_holds_under_compile_checks():
    """torch.library.opcheck: schema, fake (meta) kernel and dispatch agree, as torch.compile needs."""
    args, _ = make_case(CASES[1], torch.float32, gathered=True)
    torch.library.opcheck(torch.ops.trtllm_dflash.paged_attention.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from trtllm_dflash.plugins.paged_attention.triton_kernel import _paged_attention_kernel

STRIDES = ("s_qb", "s_qt", "s_qh", "s_ob", "s_ot", "s_oh", "s_kn", "s_kp", "s_kh", "s_tr", "s_pb")
for arch in (90, 100):
    target = GPUTarget("cuda", arch, 32)
    for dtype, t, group, d, causal, sinks in (("bf16", 1, 4, 128, True, False), ("bf16", 16, 4, 128, False, True),
                                              ("fp32", 16, 1, 64, True, True), ("fp16", 3, 8, 256, True, False),
                                              ("bf16", 100, 1, 128, True, False)):
        tq = min(triton.next_power_of_2(t), max(1, 64 // group))
        consts = dict(TQ=tq, GROUP=group, M=max(16, triton.next_power_of_2(tq * group)), D=d, BLOCK=16,
                      CAUSAL=causal, HAS_SINKS=sinks, UPCAST=False, PRECISION="ieee" if dtype == "fp32" else "tf32",
                      SPLIT=t < 16)
        sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "table_ptr": "*i32",
               "rows_ptr": "*i64", "pos_ptr": "*i64", "sinks_ptr": "*fp32", "out_ptr": f"*{dtype}",
               "acc_ptr": "*fp32", "max_ptr": "*fp32", "sum_ptr": "*fp32", "kv_len": "i32", "table_width": "i32",
               "scale": "fp32", "n_splits": "i32", "split_blocks": "i32", "n_rows": "i32", "n_heads": "i32",
               **{s: "i64" for s in STRIDES}, "T": "i32",
               **{k: "constexpr" for k in consts}}
        c = triton.compile(ASTSource(fn=_paged_attention_kernel, signature=sig, constexprs=consts), target=target)
        assert ".visible .entry _paged_attention_kernel(" in c.asm["ptx"] and "cubin" in c.asm
        print(arch, dtype, t, group, d, "ok", c.metadata.num_warps, c.metadata.shared, flush=True)
"""


def test_kernel_compiles_for_hopper_and_blackwell():
    """Real ahead-of-time compilation (Triton's LLVM and ptxas) to sm_90a and sm_100a, no GPU needed: bf16 decode and
    verify shapes at Qwen3-8B's head_dim, fp32 with sinks, fp16 at head_dim 256, MHA tiles of 64 queries; split
    along the keys (T < 16) and not."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(" ok ") == 10
