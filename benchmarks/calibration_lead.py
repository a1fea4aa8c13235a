"""Whether the step-cost calibration's cells cost what runs of their steps cost (issue 16's cost model).

    python benchmarks/calibration_lead.py [--repeats 3] [--threads 2]

On the built-in pair (float32, this CPU), per repeat, in alternating order:
- the calibration as it was (each cell timed right after a step of another draft length: `plain_lead` and
  `draft_lead` 0) and as it is (`CalibrationPlan`'s defaults: 3 untimed plain steps before a timed plain one,
  1 drafting step before a timed drafting one), batches 1, 4 and 16, context 128 and the allocation's longest;
- steady runs of the same steps (benchmarks/gpu_plain_path.py's `measure` on the CPU: plain decoding's engine,
  the DFlash engine with no request keeping the drafter's context, whole-block drafting; each 10 steps in a row);
- the after-effect: plain steps of keeping requests (the calibration's plain cells) in a cycle of three plain
  steps and one whole-block step, each position's median, against a run of plain steps alone.
Writes benchmarks/results/calibration_lead.json: per repeat each calibration's plain and whole-block cells at
context 128 over the steady medians, and the after-effect per position.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gpu_plain_path  # noqa: E402
from cpu_decode import run_record  # noqa: E402
from newcomer_backoff import capacity, offline_pairs  # noqa: E402

OUT = Path(__file__).parent / "results" / "calibration_lead.json"
BATCHES = (1, 4, 16)
CONTEXT = 128


def calibrated(generator, plain_lead: int, draft_lead: int) -> dict:
    """-> {batch: (plain ms, whole-block ms)} at CONTEXT, from one calibration with these leads."""
    from trtllm_dflash.draft_length.calibrate import CalibrationPlan, measure

    covering = CalibrationPlan.covering(max(BATCHES), generator.block - 1,
                                        generator.capacity - generator.block - 1)
    plan = CalibrationPlan(BATCHES, covering.draft_lens, covering.contexts, 3, plain_lead, draft_lead)
    model = measure(generator, plan)
    c = model.contexts.index(CONTEXT)
    return {b: (model.seconds[c][i][0] * 1e3, model.seconds[c][i][-1] * 1e3) for i, b in enumerate(BATCHES)}


def after_effect(generator, batch: int, cycles: int = 15) -> dict:
    """-> median ms of plain steps alone, and of each of the three plain steps after a whole-block step."""
    seqs = gpu_plain_path.admitted(generator, batch, True)
    times: dict[str, list[float]] = {}
    for label, cycle in (("plain run", [0, 0, 0, 0]), ("after a whole block", [15, 0, 0, 0])):
        for _ in range(cycles):
            for position, k in enumerate(cycle):
                generator.hold(seqs, CONTEXT)
                t0 = time.perf_counter()
                generator.step(k)
                if k == 0:
                    times.setdefault(f"{label}: plain step {position}", []).append((time.perf_counter() - t0) * 1e3)
    for seq in seqs:
        if not seq.done:
            generator.cancel(seq, "benchmark")
    return {key: statistics.median(v) for key, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    load_before, started = os.getloadavg(), time.time()
    spec, plain, _, _ = offline_pairs(args.threads, max(BATCHES))
    plain.generator.allocate(max(BATCHES), capacity(plain.generator), plain.generator.block)
    repeats = []
    for r in range(args.repeats):
        leads = {"as it was (no lead steps)": (0, 0), "as it is (3 plain, 1 drafting)": (3, 1)}
        cal = {name: calibrated(spec.generator, *lead)
               for name, lead in (leads.items() if r % 2 == 0 else reversed(leads.items()))}
        cells, _ = gpu_plain_path.measure(spec, plain, list(BATCHES), [CONTEXT], 3, 10)
        steady = {b: {case: cells[f"{case} batch {b} context {CONTEXT}"]["median_ms"]
                      for case in ("plain", "plain-only", "drafting 15")} for b in BATCHES}
        row = {"steady_ms": steady, "calibrated_ms": cal, "after_effect_batch_4": after_effect(spec.generator, 4),
               "plain_cell_over_steady_plain_only": {n: {b: c[b][0] / steady[b]["plain-only"] for b in BATCHES}
                                                     for n, c in cal.items()},
               "whole_block_cell_over_steady": {n: {b: c[b][1] / steady[b]["drafting 15"] for b in BATCHES}
                                                for n, c in cal.items()}}
        repeats.append(row)
        print(f"repeat {r}: plain cell / steady plain-only: " + "; ".join(
            f"{n}: " + " ".join(f"b{b} {v:.2f}" for b, v in ratios.items())
            for n, ratios in row["plain_cell_over_steady_plain_only"].items()), file=sys.stderr, flush=True)
    record = run_record(args, started, load_before) | {"context": CONTEXT, "batches": BATCHES, "repeats": repeats}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    for key in ("plain_cell_over_steady_plain_only", "whole_block_cell_over_steady"):
        for name in repeats[0][key]:
            print(f"{key} | {name}: " + "; ".join(
                f"b{b} {statistics.median(r[key][name][b] for r in repeats):.2f} "
                f"({min(r[key][name][b] for r in repeats):.2f}-{max(r[key][name][b] for r in repeats):.2f})"
                for b in BATCHES))
    for key in repeats[0]["after_effect_batch_4"]:
        print(f"batch 4 {key}: {statistics.median(r['after_effect_batch_4'][key] for r in repeats):.2f} ms")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
