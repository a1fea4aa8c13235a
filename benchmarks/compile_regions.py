"""Warm-up compile time of compiled steps: as they are, with the decoder layer as a nested compile region (a trial),
and padded to cuda-graphs' buckets (sizes from 2: one target graph and one drafter graph).

    python benchmarks/compile_regions.py [--layers 8,20] [--threads 2] [--variants plain,region]
    python benchmarks/compile_regions.py --layers 8 --variants plain,graph-shapes,plain,graph-shapes \
        --output benchmarks/results/compile_graph_shapes.json

The random Qwen3-shaped build of benchmarks/gpu_decode.py at hidden 256 (8 heads, 2 KV heads, head_dim 32,
intermediate 512, vocab 1024, float32, CPU) with `--layers` target layers and a 2-layer drafter. For each depth,
two runs, each in a fresh process on an empty inductor cache (`TORCHINDUCTOR_CACHE_DIR`): the runtime as it is,
and the same with `TargetLayer.forward` wrapped in `torch.compiler.nested_compile_region` (the attention masks
built before the layers, so the region has no side effect). Each records the seconds of `compile_step_shapes`
(the load's warm-up in compile mode), whether greedy output after it equals the eager output before it, and
dynamo's captured calls and unique graphs. One run per case: a compile-time comparison, not a rate. The region
variant is a monkeypatch here, not a runtime option (it did not shorten the warm-up on torch 2.13). The
graph-shapes variant runs compile mode with cuda-graphs' padding buckets (`step_mode.GRAPH_SHAPES`), which CUDA
graph recording itself needs a GPU for: the compile work is the same, done here.
Writes benchmarks/results/compile_regions.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "compile_regions.json"
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
             vocab_size=1024)


def as_region() -> None:
    """The decoder layer as a nested compile region; masks built before it (ForwardContext.mask caches them)."""
    import torch

    from trtllm_dflash.models import target as tmod

    layer_forward, model_forward = tmod.TargetLayer.forward, tmod.TargetModel.forward
    region = torch.compiler.nested_compile_region(lambda layer, x, ctx: layer_forward(layer, x, ctx))
    tmod.TargetLayer.forward = lambda layer, x, ctx: region(layer, x, ctx)

    def forward(model, input_ids, ctx):
        dtype = model.model.embed_tokens.weight.dtype
        for i, layer in enumerate(model.attention_layers()):
            cache = ctx.cache.layers[i]
            ctx.mask(layer.self_attn.spec, "prefill" if ctx.prefilling else cache.kind, cache,
                     ctx.positions if ctx.prefilling else None, dtype)
        return model_forward(model, input_ids, ctx)

    tmod.TargetModel.forward = forward


def one(layers: int, variant: str, threads: int) -> dict:
    """In this process: build, decode eagerly, compile the steps, decode again."""
    import torch
    import torch._dynamo.utils as dynamo_utils

    sys.path.insert(0, str(Path(__file__).parent))
    from gpu_decode import build, set_mode

    from trtllm_dflash.draft_length.policy import FixedDraftLen
    from trtllm_dflash.request import Request

    from trtllm_dflash.step_mode import GRAPH_SHAPES, StepMode, compile_step_shapes

    torch.set_num_threads(threads)
    if variant == "region":
        as_region()
    generator, _ = build({**SHAPE, "num_hidden_layers": layers}, 2, "cpu", torch.float32)
    generator.policy = FixedDraftLen()
    request = Request((1, 2, 3, 4, 5), 20, ignore_eos=True)
    eager = generator.generate([request])[0].output_ids
    if variant == "graph-shapes":
        generator.set_step_mode(StepMode("compile", GRAPH_SHAPES))
        started = time.perf_counter()
        compile_step_shapes(generator)
        seconds = time.perf_counter() - started
    else:
        seconds = set_mode(generator, "compile", "cpu")
    compiled = generator.generate([request])[0].output_ids
    stats = dynamo_utils.counters["stats"]
    return {"layers": layers, "variant": variant, "region": variant == "region", "warm_up_s": seconds,
            "same_as_eager": compiled == eager,
            "calls_captured": stats["calls_captured"], "unique_graphs": stats["unique_graphs"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="8,20")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default="plain,region", help="in this order, per depth: plain, region, graph-shapes")
    p.add_argument("--output", type=Path, default=OUT)
    p.add_argument("--one", help=argparse.SUPPRESS)  # "LAYERS:VARIANT": run one case in this process
    args = p.parse_args()
    if args.one:
        layers, variant = args.one.split(":")
        print(json.dumps(one(int(layers), variant, args.threads)))
        return
    started, load_before, cases = time.time(), os.getloadavg(), []
    for layers in (int(n) for n in args.layers.split(",")):
        for variant in args.variants.split(","):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": str(args.threads)}
                out = subprocess.run([sys.executable, __file__, "--one", f"{layers}:{variant}", "--threads",
                                      str(args.threads)], env=env, capture_output=True, text=True, check=True)
            cases.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(cases[-1], file=sys.stderr, flush=True)
    record = {"command": "python " + " ".join(sys.argv),
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "wall_s": time.time() - started,
              "threads": args.threads, "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "shape": SHAPE, "drafter_layers": 2, "cases": cases}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
