"""The attention of one decode step at Qwen3-8B shapes: the paged kernel against gather + mask + SDPA.

    python benchmarks/paged_attention_gpu.py [--batches 1,64] [--contexts 1024,4096] [--queries 1,16] \
        [--repeats 20] [--output PATH]
    python benchmarks/paged_attention_gpu.py --tiny --device cpu [--output PATH]   # smoke (Triton's interpreter)

Both paths run through the runtime's own `ForwardContext.attend` over a `KVCache` of 36 full-attention layers
(32 query heads, 8 KV heads, head_dim 128, bf16) whose blocks lie at random in the pool, as a serving pool's do
after admissions and frees: `paged` is `torch.ops.trtllm_dflash.paged_attention` reading each row's blocks in
place (TRTLLM_DFLASH_PAGED_ATTENTION=auto), `gather` is `FullKV.view` copying them out + the additive mask + SDPA
(=off). For each (batch B, context C, queries T: 1 for plain decoding, 16 for a verify block) the rows hold
ragged lengths in [C/2, C]; one timed call is one forward's attention over every layer (the new K/V written, then
read), median of --repeats, eager and replayed as one CUDA graph (`*_graph_s`; null with the error if capture
fails). floor_s: the K/V bytes the rows' queries must read once / device copy bandwidth. max_abs_diff: the two
paths' outputs (last layer). The whole decode step with either path: gpu_decode.py run twice, with
TRTLLM_DFLASH_PAGED_ATTENTION=off and =auto. Writes benchmarks/results/paged_attention_gpu.json (or --output;
--tiny writes only to an explicit --output: its timings mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from context_kv_gpu import copy_bandwidth, scattered_table  # noqa: E402  (a sibling script, not a package)

OUT = Path(__file__).parent / "results" / "paged_attention_gpu.json"
QWEN3_8B = dict(layers=36, heads=32, kv_heads=8, head_dim=128)
TINY = dict(layers=2, heads=4, kv_heads=2, head_dim=16)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_s(fn, device: str, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def scattered_cache(shape: dict, batch: int, capacity: int, device: str, dtype, g):
    """The runtime's KVCache (every layer full) over a block table whose rows' blocks lie at random in the pool."""
    from trtllm_dflash.cache.kv_cache import KVCache, LayerCacheSpec

    table = scattered_table(batch, capacity, device, g)
    cache = KVCache([LayerCacheSpec()] * shape["layers"], batch, shape["kv_heads"], capacity, shape["head_dim"],
                    dtype, device, table=table)
    for pool in (cache.k, cache.v):
        pool.normal_(generator=g)
    return cache


def graphed(fn, device: str):
    """fn captured as one CUDA graph -> (replay, None), or (None, the reason it could not be captured)."""
    if not device.startswith("cuda"):
        return None, "not CUDA"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay, None
    except RuntimeError as e:  # recorded, not fatal: the eager numbers still stand
        return None, str(e).splitlines()[0]


def run_case(shape: dict, batch: int, context: int, queries: int, device: str, dtype, repeats: int,
             bandwidth: float) -> dict:
    from trtllm_dflash.models.attention import AttentionSpec, ForwardContext
    from trtllm_dflash.plugins.paged_attention import op as paged

    g = torch.Generator(device=device).manual_seed(batch * 100_000 + context + queries)
    cache = scattered_cache(shape, batch, context + queries, device, dtype, g)
    starts = context - torch.randint(0, context // 2 + 1, (batch,), generator=g, device=device)
    positions = starts[:, None] + torch.arange(queries, device=device)  # [B, T]
    kv_len = context + queries
    spec = AttentionSpec(shape["heads"], shape["kv_heads"], shape["head_dim"])
    q, k, v = (torch.randn(batch, queries, n, shape["head_dim"], generator=g, device=device, dtype=dtype)
               for n in (shape["heads"], shape["kv_heads"], shape["kv_heads"]))
    paged_mode = "triton" if device == "cpu" else "auto"  # the CPU runs the kernel only when forced

    def forward(mode: str):
        def attention():
            paged.MODE = mode
            ctx = ForwardContext.cached(positions, cache, kv_len)
            for layer in range(shape["layers"]):
                out = ctx.attend(layer, spec, q, k, v)
            return out
        return attention

    row = dict(batch=batch, context=context, queries=queries, keys_read=int((starts + queries).sum()))
    outputs = {}
    with torch.inference_mode():
        for name, mode in (("gather", "off"), ("paged", paged_mode)):
            outputs[name] = forward(mode)().float()
            row[f"{name}_s"] = median_s(forward(mode), device, repeats)
            replay, error = graphed(forward(mode), device)
            row[f"{name}_graph_s"] = median_s(replay, device, repeats) if replay else None
            if error and device.startswith("cuda"):
                row[f"{name}_graph_error"] = error
    paged.MODE = os.environ.get("TRTLLM_DFLASH_PAGED_ATTENTION", "auto")
    row["max_abs_diff"] = (outputs["paged"] - outputs["gather"]).abs().max().item()
    row["speedup"] = row["gather_s"] / row["paged_s"]
    if row["paged_graph_s"] and row["gather_graph_s"]:
        row["graph_speedup"] = row["gather_graph_s"] / row["paged_graph_s"]
    kv_bytes = row["keys_read"] * shape["layers"] * 2 * shape["kv_heads"] * shape["head_dim"] * dtype.itemsize
    row["floor_s"] = kv_bytes / bandwidth
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run of the script; on a CPU it runs "
                                                       "the kernel in Triton's interpreter)")
    p.add_argument("--batches", type=ints, default=[1, 64])
    p.add_argument("--contexts", type=ints, default=None, help="committed tokens per row (default 1024,4096)")
    p.add_argument("--queries", type=ints, default=[1, 16])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("paged_attention_gpu.py: no CUDA device here (use --tiny --device cpu for a smoke run)", file=sys.stderr)
        return 1
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    shape, dtype = (TINY, torch.float32) if args.tiny else (QWEN3_8B, torch.bfloat16)
    contexts = args.contexts or ([40] if args.tiny else [1024, 4096])
    bandwidth = copy_bandwidth(args.device)
    rows = []
    for context in contexts:
        for batch in args.batches:
            for queries in args.queries:
                rows.append(run_case(shape, batch, context, queries, args.device, dtype, args.repeats, bandwidth))
                print(json.dumps(rows[-1]), flush=True)
    output = args.output or (None if args.tiny else str(OUT))
    if output:
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
        record = {"command": "python " + " ".join(sys.argv), "device": device, "torch": torch.__version__,
                  "dtype": str(dtype), "shapes": "tiny" if args.tiny else "qwen3-8b", "shape": shape,
                  "copy_bandwidth_bytes_per_s": bandwidth, "rows": rows}
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'batch':>5} {'context':>7} {'T':>3} {'gather ms':>10} {'paged ms':>9} {'speedup':>8} {'floor ms':>9} "
          f"{'max diff':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['context']:>7} {r['queries']:>3} {r['gather_s'] * 1e3:>10.3f} "
              f"{r['paged_s'] * 1e3:>9.3f} {r['speedup']:>8.2f} {r['floor_s'] * 1e3:>9.3f} {r['max_abs_diff']:>9.2g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
