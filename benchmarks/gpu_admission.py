"""What one admission (a batched prefill) costs with the target's prefill compiled against eager, on one GPU
(issue 16: on an H100 an eager admission of the built-in pair cost ~6 ms whatever the prompt, and DFlash's
requests, finishing at different steps, are admitted one call each where plain decoding's, in lockstep, are
admitted 16 at a time: benchmarks/results/gpu_h100_policy/).

    python benchmarks/gpu_admission.py --out DIR [--rounds 3] [--per-round 5] [--batches 1,16]
    python benchmarks/gpu_admission.py --device cpu --step-mode compile --rounds 1 --per-round 2 --out /tmp/a  # smoke

The built-in pair (float32) in the device's default step mode (cuda-graphs on a GPU: the prefill is compiled
without CUDA graphs), two generators in one process: plain decoding, and DFlash admitting with the drafter's
context. Cells: engine x prefill (the generator's compiled `prefill_pass`, or the target module itself, eager) x
batch x context (the served benchmark's first prompts: held-out snippets, and 1024-token windows). Each admit
call is a synchronised wall time (it reads the first tokens); the admitted requests are cancelled after it.
The cases interleave per round after one untimed settle round; median and quartiles over all rounds.
`gpu_policy.py --admission-rounds N` runs `measure` on its own load. Writes DIR/gpu_admission.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gpu_plain_path  # noqa: E402


def timed_admits(generator, prompts: list[list[int]], drafting: bool | None, calls: int) -> list[float]:
    """-> ms per admit call of len(prompts) requests, each cancelled after its call."""
    from trtllm_dflash.request import Request

    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sequences = generator.admit([Request(p, 8, ignore_eos=True) for p in prompts], drafting=drafting)
        out.append((time.perf_counter() - t0) * 1e3)
        for seq in sequences:
            generator.cancel(seq, "benchmark")
    return out


def measure(spec, plain, prompts: dict, batches: list[int], rounds: int, per_round: int, log=None) -> dict:
    """-> cells {"ENGINE PREFILL batch B context C": median, quartiles, calls}; both generators allocated for
    max(batches) rows and idle, left so with their compiled prefill."""
    engines = {"plain": (plain.generator, None), "dflash": (spec.generator, True)}
    samples: dict[str, list[float]] = {}
    for r in range(rounds + 1):  # one settle round: first calls at a new size allocate
        order = [(e, p) for e in engines for p in ("compiled", "eager")]
        for engine, prefill in (order if r % 2 == 0 else order[::-1]):
            generator, drafting = engines[engine]
            compiled = generator.prefill_pass
            if prefill == "eager":
                generator.prefill_pass = generator.target
            try:
                for batch in batches:
                    for context, texts in prompts.items():
                        ms = timed_admits(generator, texts[-batch:], drafting, per_round)
                        if r:
                            samples.setdefault(f"{engine} {prefill} batch {batch} context {context}", []).extend(ms)
            finally:
                generator.prefill_pass = compiled
    cells = {}
    for key, ms in samples.items():
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
        cells[key] = {"median_ms": q[1], "quartiles_ms": [q[0], q[2]], "calls": len(ms)}
    if log:
        log("; ".join(f"{key} {cell['median_ms']:.2f}" for key, cell in cells.items()))
    return cells


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-round", type=int, default=5, help="admit calls per cell and round")
    p.add_argument("--batches", default="1,16")
    gpu_plain_path.device_args(p)
    args = p.parse_args()
    started, clock = time.time(), time.perf_counter()
    batches = [int(b) for b in args.batches.split(",")]
    spec, plain, prompts, _ = gpu_plain_path.load(args, max(batches))
    gpu_plain_path.stamped(clock)("loaded")
    cells = measure(spec, plain, prompts, batches, args.rounds, args.per_round, log=gpu_plain_path.stamped(clock))
    gpu_plain_path.write(args, started, spec, "gpu_admission.json", settings=vars(args), cells=cells)
    print(json.dumps(cells, indent=1))


if __name__ == "__main__":
    main()
