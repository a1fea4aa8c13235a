"""What a plain step costs in the DFlash engine against plain decoding's engine, on one GPU (issue 16: never
slower than plain needs the DFlash engine's plain steps as cheap as plain decoding's).

    python benchmarks/gpu_plain_path.py --out DIR [--rounds 5] [--steps 20] [--batches 1,4,16] [--contexts 128,1024]
    python benchmarks/gpu_plain_path.py --device cpu --step-mode eager --rounds 1 --steps 3 --out /tmp/p  # smoke

The built-in pair (float32) in the device's default step mode (cuda-graphs on a GPU), two generators in one
process: plain decoding, and DFlash. Synthetic requests pinned at each context (the calibration's `hold`), cases:
- plain: the plain engine's step;
- plain-only: the DFlash engine's step with no request keeping the drafter's context (admitted plain-only, as a
  backed-off newcomer or `--draft-len 0`);
- drafting 15: the DFlash engine's step drafting the whole block.
Each cell times `--steps` steps per round (each a synchronised wall time: a step ends reading its tokens), the
cases interleaved per round after two untimed settle rounds; median and quartiles over all rounds. Then
torch.profiler over `--steps` steps of plain and plain-only at the middle batch and the first context: the ops
the host dispatched per step, the most expensive by self CPU time, and CUDA graph launches. Writes
DIR/gpu_plain_path.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from newcomer_backoff import capacity, offline_pairs  # noqa: E402

CASES = ("plain", "plain-only", "drafting 15")


def admitted(generator, batch: int, drafting: bool | None):
    from trtllm_dflash.request import Request

    budget = generator.capacity - generator.block - 2
    return generator.admit([Request((0,), budget, ignore_eos=True) for _ in range(batch)], drafting=drafting)


def timed_steps(generator, sequences, context: int, k: int, steps: int) -> list[float]:
    """-> ms per step, the sequences pinned at `context` before each."""
    out = []
    for _ in range(steps):
        generator.hold(sequences, context)
        t0 = time.perf_counter()
        generator.step(k)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def profile(generator, sequences, context: int, k: int, steps: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=activities) as prof:
        timed_steps(generator, sequences, context, k, steps)
    events = prof.key_averages()
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
    return {"ops_per_step": sum(e.count for e in events if e.key.startswith("aten::")) / steps,
            "graph_launches_per_step": sum(e.count for e in events if "GraphLaunch" in e.key) / steps,
            "kernel_launches_per_step": sum(e.count for e in events if e.key in ("cudaLaunchKernel",
                                                                                 "cuLaunchKernel")) / steps,
            "device_us_per_step": sum(e.self_device_time_total for e in events) / steps,
            "top_device_us_per_step": {e.key[:120]: round(e.self_device_time_total / steps, 1) for e in
                                       sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:12]},
            "top_self_cpu_us_per_step": {e.key: round(e.self_cpu_time_total / steps, 1) for e in top}}


def measure(spec, plain, batches: list[int], contexts: list[int], rounds: int, steps: int, log=None) -> tuple:
    """-> (cells, profiles) on the two pipelines' generators (both allocated for max(batches) rows and idle)."""
    cells, profiles = {}, {}
    for batch in batches:
        groups = {"plain": (plain.generator, admitted(plain.generator, batch, None), 0)}
        groups["plain-only"] = (spec.generator, admitted(spec.generator, batch, False), 0)
        samples = {(case, c): [] for case in CASES for c in contexts}
        for r in range(rounds + 2):  # two settle rounds: CUDA graphs record each new shape on its 2nd call
            for case in (CASES if r % 2 == 0 else CASES[::-1]):
                if case == "drafting 15":  # its own requests: the plain-only ones cannot draft
                    for seq in groups["plain-only"][1]:
                        spec.generator.cancel(seq, "benchmark")
                    gen, seqs, k = spec.generator, admitted(spec.generator, batch, True), spec.generator.block - 1
                else:
                    gen, seqs, k = groups[case]
                for c in contexts:
                    ms = timed_steps(gen, seqs, c, k, steps)
                    if r >= 2:
                        samples[case, c] += ms
                if case == "drafting 15":
                    for seq in seqs:
                        spec.generator.cancel(seq, "benchmark")
                    groups["plain-only"] = (spec.generator, admitted(spec.generator, batch, False), 0)
        for (case, c), ms in samples.items():
            q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
            cells[f"{case} batch {batch} context {c}"] = {"median_ms": q[1], "quartiles_ms": [q[0], q[2]],
                                                          "steps": len(ms)}
        if batch == batches[len(batches) // 2]:
            for case in ("plain", "plain-only"):
                gen, seqs, k = groups[case]
                profiles[f"{case} batch {batch} context {contexts[0]}"] = profile(gen, seqs, contexts[0], k, steps)
        for gen, seqs, _ in groups.values():
            for seq in seqs:
                gen.cancel(seq, "benchmark")
        if log:
            log(f"batch {batch}: " + "; ".join(f"{key.split(' batch')[0]} @{key.split()[-1]} {v['median_ms']:.3f}"
                                              for key, v in cells.items() if f"batch {batch} " in key))
    return cells, profiles


def device_args(p: argparse.ArgumentParser) -> None:
    """The options every GPU script here shares: threads, device, step mode, output folder."""
    p.add_argument("--threads", type=int, default=4, help="torch CPU threads (the host side of each step)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--step-mode", default=None, help="eager, compile or cuda-graphs; default: the device's")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))


def load(args, rows: int):
    """-> `offline_pairs`' (DFlash pipeline, plain pipeline, prompts, calibrated policy), the plain generator
    allocated for `rows` requests too (both idle)."""
    spec, plain, prompts, calibrated = offline_pairs(args.threads, rows, args.device, args.step_mode)
    plain.generator.allocate(rows, capacity(plain.generator), plain.generator.block)
    return spec, plain, prompts, calibrated


def stamped(clock: float, prefix: str = ""):
    """A log function: each line to stderr after the seconds since `clock`."""
    return lambda line: print(f"[{time.perf_counter() - clock:5.0f} s] {prefix}{line}", file=sys.stderr, flush=True)


def device_record(device: str) -> dict:
    if not device.startswith("cuda"):
        return {"device": device}
    props = torch.cuda.get_device_properties(device)
    return {"device": device, "gpu": props.name, "gpu_memory_gib": props.total_memory / 2**30,
            "cuda": torch.version.cuda}


def write(args, started: float, spec, name: str, **fields) -> None:
    """DIR/name: the command, date, device, torch and step mode, then `fields`."""
    record = {"command": "python " + " ".join(sys.argv),
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
              "device": device_record(args.device), "torch": torch.__version__,
              "step_mode": spec.generator.step_mode.mode, **fields}
    out = Path(args.out) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--contexts", default="128,1024")
    device_args(p)
    args = p.parse_args()
    started, clock = time.time(), time.perf_counter()
    batches, contexts = [int(b) for b in args.batches.split(",")], [int(c) for c in args.contexts.split(",")]
    spec, plain, _, _ = load(args, max(batches))
    stamped(clock)("loaded")
    cells, profiles = measure(spec, plain, batches, contexts, args.rounds, args.steps, log=stamped(clock))
    write(args, started, spec, "gpu_plain_path.json", settings=vars(args), cells=cells, profiles=profiles)
    print(json.dumps({"cells": cells, "profiles": profiles}, indent=1))


if __name__ == "__main__":
    main()
