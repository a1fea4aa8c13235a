"""What torch.compile's guards cost a compiled decode step: the DFlash engine (built-in pair) in `compile` mode on
this CPU, steps at a pinned context, with dynamo's guards evaluated (the runtime's setting) and with only the
guards that tell its cache entries apart (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`, not used by
the runtime: an input that needed a new graph would run a wrong one silently).

    python benchmarks/guard_overhead.py [--repeats 5] [--steps 40] [--threads 1]

Draft-length sequences: plain steps only, whole-block drafts only, and three plain steps then a draft (the cost
policy's mix: each step's passes hit a different cache entry than the last). Per repeat and sequence: the median
step (ms), then a profiled run's "TorchDynamo Cache Lookup" time per step (guard evaluation, µs) and lookups per
step. Settings alternate order per repeat. On the GPU the profile of one plain step of the same pair
(benchmarks/results/gpu_h100_policy/plain_path/) spent 172-188 µs of host time per step in that lookup.
Writes benchmarks/results/guard_overhead.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode import run_record  # noqa: E402

OUT = Path(__file__).parent / "results" / "guard_overhead.json"
SEQUENCES = {"plain": [0], "whole block": [15], "3 plain, 1 draft": [0, 0, 0, 15]}
CONTEXT, BATCH = 128, 4


def run(generator, lengths: list[int], steps: int, profiled: bool) -> tuple[float, float, float]:
    """-> (median step ms, cache lookup µs per step, lookups per step); `steps` steps cycling `lengths`."""
    from torch.profiler import ProfilerActivity, profile

    from trtllm_dflash.request import Request

    seqs = generator.admit([Request((0,) * (20 + i), 500, ignore_eos=True) for i in range(BATCH)])
    ks, times = (lengths * steps)[:steps], []
    with profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext() as prof:
        for k in ks:
            generator.hold(seqs, CONTEXT)
            t0 = time.perf_counter()
            generator.step(k)
            times.append(time.perf_counter() - t0)
    for seq in seqs:
        if not seq.done:
            generator.cancel(seq, "benchmark")
    lookup = [e for e in prof.key_averages() if e.key == "TorchDynamo Cache Lookup"] if profiled else []
    us = lookup[0].cpu_time_total / steps if lookup else float("nan")
    count = lookup[0].count / steps if lookup else float("nan")
    return statistics.median(times) * 1e3, us, count


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    load_before, started = os.getloadavg(), time.time()
    torch.set_num_threads(args.threads)
    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.pipeline import load_pipeline

    t0 = time.perf_counter()
    generator = load_pipeline(*stdlib_pair(), step_mode="compile").generator
    load_s = time.perf_counter() - t0
    generator.allocate(BATCH, 600, generator.block)
    cells = {}  # (sequence, setting) -> [(ms, lookup µs, lookups)] per repeat
    for r in range(args.repeats):
        for unsafe in ((False, True) if r % 2 == 0 else (True, False)):
            torch.compiler.set_stance("default", skip_guard_eval_unsafe=unsafe)
            for name, lengths in SEQUENCES.items():
                ms = run(generator, lengths, args.steps, profiled=False)[0]
                _, us, count = run(generator, lengths, args.steps, profiled=True)
                cells.setdefault(f"{name} | {'only differing guards' if unsafe else 'guarded'}", []).append(
                    (ms, us, count))
        torch.compiler.set_stance("default")
        print(f"repeat {r} done", file=sys.stderr, flush=True)
    table = {key: {"step_ms_median": statistics.median(v[0] for v in vals),
                   "step_ms": [v[0] for v in vals],
                   "cache_lookup_us_per_step_median": statistics.median(v[1] for v in vals),
                   "lookups_per_step": vals[0][2]} for key, vals in cells.items()}
    for name in SEQUENCES:
        guarded, unsafe = cells[f"{name} | guarded"], cells[f"{name} | only differing guards"]
        ratios = [u[0] / g[0] for g, u in zip(guarded, unsafe)]
        table[f"{name} | guarded"]["only_differing_over_guarded"] = {
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    record = run_record(args, started, load_before) | {
        "load_s": load_s, "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "context": CONTEXT, "batch": BATCH, "table": table}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    for key, row in table.items():
        extra = row.get("only_differing_over_guarded")
        print(f"{key:45} step {row['step_ms_median']:7.3f} ms  lookup {row['cache_lookup_us_per_step_median']:6.1f} "
              f"us/step ({row['lookups_per_step']:.2f}/step)"
              + (f"  only-differing/guarded {extra['median']:.3f} ({extra['min']:.3f}-{extra['max']:.3f})"
                 if extra else ""))
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
