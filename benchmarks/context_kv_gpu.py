"""Fused context-KV op against the unfused PyTorch path and against its memory-traffic floor, both writing the
runtime's paged pool (blocks scattered in it, located through a block table as DFlashProposer.write does).

Shapes: the Qwen3-8B DFlash drafter (hidden 4096, 5 layers, 5 captured target layers, 8 KV heads,
head_dim 128), bf16. Decode: 1/4/16 new tokens x batch 1/8/64; prefill: 1k/4k/8k tokens.
Floor = bytes that must move (weights, features, the fc output written and read once, K/V
written, each token's position, block, offset and table entry) / measured device-to-device copy
bandwidth. Targets (issue): >= 2x faster than unfused at decode shapes, within 1.3x of the floor.

Run on a GPU:  python benchmarks/context_kv_gpu.py            (writes results/context_kv_gpu.json)
Smoke on CPU:  python benchmarks/context_kv_gpu.py --smoke    (tiny shapes, Triton interpreter,
               checks the script end to end; its timings mean nothing and are not written)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

OUT = Path(__file__).parent / "results" / "context_kv_gpu.json"
QWEN3_8B = dict(hidden=4096, layers=5, n_ids=5, kv_heads=8, head_dim=128, heads=32, intermediate=12288)
TINY = dict(hidden=64, layers=2, n_ids=2, kv_heads=2, head_dim=32, heads=4, intermediate=128)
DECODE = [(t, b) for t in (1, 4, 16) for b in (1, 8, 64)]
PREFILL = [(n, 1) for n in (1024, 4096, 8192)]


def make_drafter(shape: dict, device, dtype):
    from trtllm_dflash.models.registry import parse_drafter_config

    from trtllm_dflash.models.drafter import DFlashDrafter

    cfg = parse_drafter_config({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": shape["hidden"], "intermediate_size": shape["intermediate"],
        "num_hidden_layers": shape["layers"], "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"], "head_dim": shape["head_dim"], "rope_theta": 1e6,
        "block_size": 16, "dflash_config": {"mask_token_id": 151669, "target_layer_ids": list(range(shape["n_ids"]))},
    }, "benchmark drafter")
    torch.manual_seed(0)
    with torch.device(device):
        drafter = DFlashDrafter(cfg)
    for p in drafter.parameters():
        torch.nn.init.normal_(p, 0, 0.02)
    return drafter.to(dtype).eval()


def copy_bandwidth(device) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    src = torch.empty(2 << 30 if str(device).startswith("cuda") else 1 << 24, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device)
    return 2 * src.numel() / seconds


def timed(fn, device, reps: int = 20) -> float:
    """Median seconds per call (CUDA events on a GPU)."""
    fn()
    if not str(device).startswith("cuda"):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    import triton.testing

    return triton.testing.do_bench(fn, warmup=5, rep=reps * 5, return_mode="median") / 1e3


def floor_bytes(shape: dict, n: int, elt: int) -> int:
    h, f = shape["hidden"], shape["n_ids"] * shape["hidden"]
    kv_rows = shape["layers"] * 2 * shape["kv_heads"] * shape["head_dim"]
    weights = (h * f + kv_rows * h + h + shape["layers"] * shape["head_dim"]) * elt
    # per token: positions, blocks, offsets (int64) and its table entry (int32)
    return weights + n * f * elt + 2 * n * h * elt + n * kv_rows * elt + 28 * n


def scattered_table(batch: int, capacity: int, device, g):
    """A block table for `batch` rows of `capacity` positions whose blocks lie at random in the pool, as a serving
    pool's blocks do after admissions and frees."""
    from trtllm_dflash.cache.kv_cache import BlockTable, blocks_for

    per_row = blocks_for(capacity + 1)  # BlockTable.max_blocks
    table = BlockTable(batch, capacity, batch * per_row, device)
    order = torch.randperm(batch * per_row, generator=g, device=device).to(torch.int32)
    table.table[:, :per_row] = order.view(batch, per_row)
    return table


def run_case(drafter, weights, shape, tokens, batch, device, dtype) -> dict:
    from trtllm_dflash.cache.kv_cache import BLOCK
    from trtllm_dflash.plugins.context_kv.op import write_context_kv

    g = torch.Generator(device=device).manual_seed(tokens * 1000 + batch)
    features = torch.randn(batch, tokens, shape["n_ids"] * shape["hidden"], generator=g, device=device, dtype=dtype)
    starts = torch.randint(0, 4096, (batch,), generator=g, device=device)
    positions = starts[:, None] + torch.arange(tokens, device=device)
    rows = torch.arange(batch, device=device)
    # the runtime's paged pool k, v [L, N_blocks + 1, BLOCK, H_kv, D] (kv_cache.KVCache), blocks scattered
    table = scattered_table(batch, 4096 + tokens, device, g)
    layout = (shape["layers"], table.num_blocks + 1, BLOCK, shape["kv_heads"], shape["head_dim"])
    pools = [torch.zeros(layout, device=device, dtype=dtype) for _ in range(4)]  # unfused k, v; fused k, v
    flat_rows, flat_pos = rows[:, None].expand(batch, tokens).reshape(-1), positions.reshape(-1)

    def unfused():  # the runtime's "unfused" path: per layer k, v [B, T, H_kv, D] at the rows' (block, offset)
        blocks, offsets = table.locate(rows, positions)  # once per write, as ForwardContext.once does
        for layer, (k, v) in enumerate(drafter.context_kv(features, positions)):
            pools[0][layer][blocks, offsets] = k
            pools[1][layer][blocks, offsets] = v

    def fused():  # the runtime's "op" path (DFlashProposer.write): locate once, one op call
        blocks, offsets = table.locate(flat_rows, flat_pos)
        write_context_kv(features.view(batch * tokens, -1), flat_pos, blocks, offsets, weights, *pools[2:])

    with torch.inference_mode():
        t_unfused, t_fused = timed(unfused, device), timed(fused, device)
    # both paths wrote the same pool entries: the largest difference is rounding, not a misplaced write
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(pools[:2], pools[2:]))
    return dict(tokens=tokens, batch=batch, n=tokens * batch, unfused_us=t_unfused * 1e6, fused_us=t_fused * 1e6,
                speedup=t_unfused / t_fused, floor_bytes=floor_bytes(shape, tokens * batch, dtype.itemsize),
                max_abs_diff=diff)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter): checks the script")
    args = p.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device, dtype, shape, cases = "cpu", torch.float32, TINY, [(1, 1), (4, 3), (32, 1)]
    else:
        if not torch.cuda.is_available():
            print("context_kv_gpu: error: needs a CUDA GPU (use --smoke to check the script on a CPU)", file=sys.stderr)
            return 2
        device, dtype, shape, cases = "cuda", torch.bfloat16, QWEN3_8B, DECODE + PREFILL
    from trtllm_dflash.plugins.context_kv import context_kv_weights

    drafter = make_drafter(shape, device, dtype)
    weights = context_kv_weights(drafter)
    bandwidth = copy_bandwidth(device)
    rows = [run_case(drafter, weights, shape, t, b, device, dtype) for t, b in cases]
    for r in rows:
        r["floor_us"] = r["floor_bytes"] / bandwidth * 1e6
        r["fused_over_floor"] = r["fused_us"] / r["floor_us"]
    if not args.smoke:
        record = {"command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "dtype": str(dtype), "shape": shape,
                  "copy_bandwidth_GBps": bandwidth / 1e9, "rows": rows}
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'tokens':>6} {'batch':>5} {'unfused us':>11} {'fused us':>9} {'speedup':>8} {'floor us':>9} "
          f"{'fused/floor':>11} {'max diff':>9}")
    for r in rows:
        print(f"{r['tokens']:>6} {r['batch']:>5} {r['unfused_us']:>11.1f} {r['fused_us']:>9.1f} {r['speedup']:>8.2f} "
              f"{r['floor_us']:>9.1f} {r['fused_over_floor']:>11.2f} {r['max_abs_diff']:>9.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
