"""Decode-step latency of the torch runtime at Qwen3-8B shapes on one GPU, against the HBM roofline.

    python benchmarks/gpu_decode.py [--device cuda] [--batches 1,8,32,64] [--context 1024] [--repeats 10] \
        [--step-modes eager,cuda-graphs]
    python benchmarks/gpu_decode.py --tiny --device cpu --step-modes eager   # a smoke run of the script itself (CI)

Target: Qwen3-8B shapes (36 layers, hidden 4096, GQA 32/8, head_dim 128, intermediate 12288, vocab 151936),
bf16, random weights; drafter: 5 Qwen3 layers at the same width, block 16, conditioned on 5 target layers.
Both built through the runtime's own loader from an in-memory checkpoint. For each batch size B, with B
requests held at --context committed tokens:
  ar_step_s       a plain step (draft length 0: the target on one token per request)
  dflash_step_s   a step drafting 15 tokens and verifying the 16-token block
  drafter_s       the drafter's part of that step (timed around the proposer)
  verify_s        dflash_step_s - drafter_s (target verify, acceptance, commit)
medians of --repeats, synchronised around each timed call, for each step mode (trtllm_dflash/compilation/step_mode.py:
eager, and cuda-graphs: the passes compiled and replayed as CUDA graphs, compiled at the warm-up, which is
timed and reported as compile_s). Roofline: bytes of the target's weights read by a step (all but the
embedding table) / device copy bandwidth (a 2 GiB copy, read + write), the time a batch-1 step cannot beat.
Projected speedup at tau: tau x ar_step_s / dflash_step_s. The JSON is rewritten after each mode.
Goals (issue 15): ar_step at batch 1 >= 85 % of roofline, verify <= 1.3 x ar_step, drafter <= 15 % of
ar_step, projected batch-1 speedup at tau 6.49 >= 5. Writes benchmarks/results/gpu_decode.json (or --output).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

OUT = Path(__file__).parent / "results" / "gpu_decode.json"
TAU = 6.49
BLOCK = 16
QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512)


def configs(shape: dict, drafter_layers: int) -> tuple[dict, dict]:
    common = dict(rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=False)
    target = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **shape, **common}
    layers = shape["num_hidden_layers"]
    ids = [round(1 + i * (layers - 3) / (drafter_layers - 1)) for i in range(drafter_layers)]  # spread, as DFlash's
    drafter = {"model_type": "qwen3", "architectures": ["DFlashDraftModel"], **shape, **common,
               "num_hidden_layers": drafter_layers, "block_size": BLOCK, "num_target_layers": layers,
               "dflash_config": {"mask_token_id": shape["vocab_size"] - 1, "target_layer_ids": ids}}
    return target, drafter


def random_checkpoint(model_cls, cfg, device, dtype) -> dict[str, torch.Tensor]:
    """Random tensors under every name the model's loader expects (shapes from a meta-device instance)."""
    with torch.device("meta"):
        names = {k: v.shape for k, v in model_cls(cfg).state_dict().items()}
    gen = torch.Generator(device=device).manual_seed(0)
    return {k: torch.randn(s, generator=gen, device=device, dtype=dtype) * 0.02 for k, s in names.items()}


def build(shape: dict, drafter_layers: int, device: str, dtype):
    from trtllm_dflash.checkpoint.loader import drafter_from_tensors, target_from_tensors
    from trtllm_dflash.models.registry import parse_drafter_config, parse_target_config
    from trtllm_dflash.engine.generator import Generator

    from trtllm_dflash.distributed.parallel import SINGLE
    from trtllm_dflash.models.drafter import DFlashDrafter
    from trtllm_dflash.models.target import TargetModel
    from trtllm_dflash.speculative import DFlashProposer

    t_raw, d_raw = configs(shape, drafter_layers)
    t_cfg, d_cfg = parse_target_config(t_raw, "target"), parse_drafter_config(d_raw, "drafter")
    target = target_from_tensors(t_cfg, random_checkpoint(TargetModel, t_cfg, device, dtype), Path("random"),
                                 SINGLE, dtype, device)
    drafter = drafter_from_tensors(d_cfg, random_checkpoint(DFlashDrafter, d_cfg, device, dtype), Path("random"),
                                   SINGLE, dtype, device)
    return Generator(target, DFlashProposer(drafter, target)), target


def build_pair(tiny: bool, device: str):
    """-> (generator, target, dtype): Qwen3-8B shapes in bf16 with a 5-layer drafter, or --tiny's smoke shapes in
    float32 with a 2-layer one."""
    shape, dtype = (TINY, torch.float32) if tiny else (QWEN3_8B, torch.bfloat16)
    generator, target = build(shape, 2 if tiny else 5, device, dtype)
    return generator, target, dtype


def bench_context(tiny: bool, context: int) -> int:
    """The committed context, capped for --tiny's smoke run."""
    return min(context, 64) if tiny else context


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes/s moved by a device-to-device copy (read + write), median of 5."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    times = []
    for _ in range(6):
        sync(device)
        t0 = time.perf_counter()
        y.copy_(x)
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(times[1:])


def step_bytes(target) -> int:
    """Weights a decode step reads: every parameter but the embedding table (one row per token is read)."""
    embed = target.model.embed_tokens.weight
    return sum(p.numel() * p.element_size() for p in target.parameters() if p is not embed)


def set_mode(generator, mode: str, device: str) -> float:
    """-> seconds the mode's warm-up took (compiling every graph; 0 for eager)."""
    from trtllm_dflash.compilation.step_mode import StepMode
    from trtllm_dflash.engine.warmup import compile_step_shapes

    generator.set_step_mode(StepMode.resolve(mode, device))
    if not generator.step_mode.compiled:
        return 0.0
    t0 = time.perf_counter()
    compile_step_shapes(generator)
    sync(device)
    return time.perf_counter() - t0


def measure(generator, device: str, batch: int, context: int, repeats: int) -> dict:
    from trtllm_dflash.engine.request import Request

    drafter_times: list[float] = []
    propose = generator.proposer.propose

    def timed(*args, **kwargs):
        sync(device)
        t0 = time.perf_counter()
        out = propose(*args, **kwargs)
        sync(device)
        drafter_times.append(time.perf_counter() - t0)
        return out

    generator.proposer.propose = timed
    generator.allocate(batch, context + 2 * BLOCK + 2, BLOCK)
    sequences = generator.admit([Request((0,), BLOCK + 1, ignore_eos=True) for _ in range(batch)], drafting=True)
    times = {0: [], BLOCK - 1: []}
    try:
        for r in range(repeats + 1):  # the first round warms up
            for k in (0, BLOCK - 1) if r % 2 else (BLOCK - 1, 0):
                generator.hold(sequences, context)
                sync(device)
                t0 = time.perf_counter()
                generator.step(k)
                sync(device)
                if r:
                    times[k].append(time.perf_counter() - t0)
    finally:
        generator.proposer.propose = propose
        for seq in sequences:
            if not seq.done:
                generator.cancel(seq, "benchmark")
    ar, step = statistics.median(times[0]), statistics.median(times[BLOCK - 1])
    drafter = statistics.median(drafter_times[-repeats:])
    return {"batch": batch, "context": context, "ar_step_s": ar, "dflash_step_s": step, "drafter_s": drafter,
            "verify_s": step - drafter, "verify_over_ar": (step - drafter) / ar, "drafter_over_ar": drafter / ar,
            f"projected_speedup_tau_{TAU}": TAU * ar / step, "ar_step_samples_s": times[0],
            "dflash_step_samples_s": times[BLOCK - 1]}


def header(device_arg: str, tiny: bool, dtype) -> dict:
    device = torch.cuda.get_device_name() if device_arg.startswith("cuda") else platform.processor() or "cpu"
    return {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "device": device, "torch": torch.__version__, "shapes": "tiny" if tiny else "Qwen3-8B",
            "dtype": str(dtype).removeprefix("torch."), "tau": TAU, "modes": {}}


def roofline_fields(target, device: str, tiny: bool) -> dict:
    weights = step_bytes(target)
    bandwidth = copy_bandwidth(device, (1 << 20) if tiny else (2 << 30))
    return {"weight_bytes_per_step": weights, "copy_bandwidth_bytes_per_s": bandwidth,
            "roofline_step_s": weights / bandwidth}


def run_mode(generator, mode: str, device: str, batches: list[int], context: int, repeats: int,
             roofline: float) -> dict:
    """One step mode: its warm-up (compile_s) and a row per batch size."""
    compile_s = set_mode(generator, mode, device)
    return {"compile_s": compile_s, "rows": rows_for(generator, device, batches, context, repeats, roofline)}


def rows_for(generator, device: str, batches: list[int], context: int, repeats: int, roofline: float) -> list[dict]:
    """A row per batch size in the generator's current step mode."""
    with torch.inference_mode():
        rows = [measure(generator, device, b, context, repeats) for b in batches]
    for row in rows:
        row["ar_step_roofline_fraction"] = roofline / row["ar_step_s"]  # 1.0: as fast as reading the weights
    return rows


def report(record: dict) -> None:
    for mode, result in record["modes"].items():
        print(f"{mode} (warm-up {result['compile_s']:.0f} s)", file=sys.stderr)
        for row in result["rows"]:
            print(f"  batch {row['batch']:3}: AR {row['ar_step_s'] * 1e3:8.2f} ms ({row['ar_step_roofline_fraction']:.0%} "
                  f"of roofline)  DFlash step {row['dflash_step_s'] * 1e3:8.2f} ms  drafter "
                  f"{row['drafter_over_ar']:.0%} of AR  verify {row['verify_over_ar']:.2f}x AR  projected "
                  f"{row[f'projected_speedup_tau_{TAU}']:.2f}x", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--step-modes", default="eager,cuda-graphs", help="comma-separated: eager, compile, cuda-graphs")
    p.add_argument("--tiny", action="store_true", help="tiny shapes, float32: a smoke run of the script")
    p.add_argument("--output", default=str(OUT))
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_decode.py: no CUDA device here (use --tiny --device cpu for a smoke run)")
    context = bench_context(args.tiny, args.context)
    started = time.perf_counter()
    generator, target, dtype = build_pair(args.tiny, args.device)
    record = header(args.device, args.tiny, dtype)
    record.update(roofline_fields(target, args.device, args.tiny))
    for mode in args.step_modes.split(","):
        batches = [int(b) for b in args.batches.split(",")]
        record["modes"][mode] = run_mode(generator, mode, args.device, batches, context, args.repeats,
                                         record["roofline_step_s"])
        record["wall_s"] = time.perf_counter() - started
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(record, indent=2) + "\n")
    report(record)


if __name__ == "__main__":
    main()
