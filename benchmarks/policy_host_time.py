"""Host time the cost policy spends per step in the served workload's short, c=16 point, with the H100's cost
model (issue 16, cause 2 of benchmarks/results/gpu_h100_policy/RUN.md: auto's 16-row whole-block steps took
0.7-1.7 ms longer than always-15's at the same shape on the H100, per-repeat medians).

    python benchmarks/policy_host_time.py [--cost RESULTS/gpu_policy.json] [--repeats 3] [--points short:16]
                                          [--step-mode eager] [--device cpu] [--output FILE]
    python benchmarks/policy_host_time.py --device cuda --threads 4 --output $OUT/policy_host_time.json  # a GPU host

On this CPU (eager, or compile: `--step-mode`), the built-in pair's DFlash generator runs gpu_policy.py's closed
loop (the served warm-up, then 16 clients, 6 requests each, 128 new tokens) under a CostBasedDraftLen built on
the cost model that run calibrated on the H100, so it chooses as it did there at the start (its live correction
learns this CPU's step times, so later choices may differ). Every policy call the generator makes is timed
(choose, keeps_context, drafts_for, admit, observe, timed, release, plain_only_step), and per step: the policy's
host time (with the calls admissions and finished requests made before it), grouped by the step's (rows, draft
length, rows keeping the drafter's context). Medians over repeats of the mean microseconds a step, and their
range; and per point the policy's total time a repeat and its share of the steps' time (median, range). Then one
more repeat times the acceptance model's `folded` (where the steps `observe` queued are applied)
as called and the same call again at once. Before the kept drafting choices (1bb4b84) that repeat timed `observe`,
which then applied each step itself: results/policy_host_time_1bb4b84.json.
The policy's work is host Python and numpy whatever the device, so its size here is what it would add to
a GPU step on a host of this speed; `--device cuda` (the device's default step mode unless `--step-mode`) measures
it on a GPU host itself, between real GPU steps. Writes benchmarks/results/policy_host_time.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from newcomer_backoff import capacity, closed_loop, offline_pairs, parse_points, served_warm_up  # noqa: E402

OUT = Path(__file__).parent / "results" / "policy_host_time.json"
COST = Path(__file__).parent / "results" / "gpu_h100_policy" / "prefill_e1f6625" / "gpu_policy.json"
CALLS = ("choose", "keeps_context", "drafts_for", "admit", "observe", "timed", "release", "plain_only_step")


class Timed:
    """The policy's calls, each timed into `spent` (seconds since the last step ended)."""

    def __init__(self, policy):
        self.spent = 0.0
        for name in CALLS:
            setattr(policy, name, self.wrap(getattr(policy, name)))

    def wrap(self, method):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return method(*a, **kw)
            finally:
                self.spent += time.perf_counter() - t0
        return timed


def fold_twice(generator, cost, prompts: dict, points) -> dict:
    """One more repeat, untimed but for the acceptance model's `folded` where it applies queued steps (`observe`
    only queues a step since the kept drafting choices): each call made as the policy makes it (the first read after
    the steps), then at once again on a copy of the model as it was: -> the calls, the mean steps each applied, and
    medians of both in microseconds (the same work, the cold call against a warm one)."""
    import copy

    from trtllm_dflash.draft_length.acceptance import AcceptanceModel

    if not hasattr(AcceptanceModel, "folded"):  # a package from before the queue (PYTHONPATH at an older copy)
        return {}
    first, again, steps, real = [], [], [], AcceptanceModel.folded

    def folded(self):
        if not self.pending:
            return self
        twin = copy.deepcopy(self)
        steps.append(len(self.pending))
        t0 = time.perf_counter()
        real(self)
        t1 = time.perf_counter()
        real(twin)
        first.append(t1 - t0)
        again.append(time.perf_counter() - t1)
        return self

    AcceptanceModel.folded = folded
    try:
        one_repeat(generator, cost, prompts, points)
    finally:
        AcceptanceModel.folded = real
    return {"calls": len(first), "steps_per_call": statistics.mean(steps), "first_us": 1e6 * statistics.median(first),
            "again_at_once_us": 1e6 * statistics.median(again)}


def one_repeat(generator, cost, prompts: dict, points) -> dict:
    """-> point -> cell -> [steps, policy seconds, step seconds]."""
    from trtllm_dflash.draft_length.policy import CostBasedDraftLen

    policy = CostBasedDraftLen(cost)
    generator.policy = policy
    generator.allocate(max(c for _, c in points), capacity(generator), generator.block)
    served_warm_up(generator, prompts, 2)
    clock = Timed(policy)
    step = type(generator).step.__get__(generator)
    cells: dict = {}

    def traced(*a, **kw):
        t0 = time.perf_counter()
        ran = step(*a, **kw)
        seconds = time.perf_counter() - t0
        k = max((s.result.draft_lengths[-1] for s in ran), default=0)
        key = f"{len(ran)} {k} {sum(bool(s.drafting) for s in ran)}"
        cell = cells.setdefault(key, [0, 0.0, 0.0])
        cell[0], cell[1], cell[2] = cell[0] + 1, cell[1] + clock.spent, cell[2] + seconds
        clock.spent = 0.0  # what admit and release spent before the next step is charged to it
        return ran

    out = {}
    generator.step = traced
    try:
        for context, c in points:
            cells = {}
            closed_loop(generator, prompts[context], c)
            out[f"{context}:{c}"] = cells
    finally:
        del generator.step
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cost", type=Path, default=COST, help="a gpu_policy.json whose cost_model to use")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--points", default="short:16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--step-mode", default=None,
                   help="eager or compile on a CPU (compile: few ops a step, as on a GPU); default eager on a CPU, the "
                        "device's default (cuda-graphs) on a GPU")
    p.add_argument("--device", default="cpu")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    from trtllm_dflash.draft_length.cost import CostModel

    points = parse_points(args.points)
    record = json.loads(args.cost.read_text())
    cost = CostModel.from_json(record["cost_model"], str(args.cost))
    if args.step_mode is None and args.device == "cpu":
        args.step_mode = "eager"
    spec, _, prompts, _ = offline_pairs(args.threads, max(c for _, c in points), args.device, args.step_mode)
    runs = [one_repeat(spec.generator, cost, prompts, points) for _ in range(args.repeats)]
    twice = fold_twice(spec.generator, cost, prompts, points)
    if twice:
        print(f"folding queued steps: {twice['first_us']:.0f} us as called, {twice['again_at_once_us']:.0f} us the "
              f"same call again at once ({twice['calls']} calls of {twice['steps_per_call']:.1f} steps)")
    totals = {}
    for point in runs[0]:  # per repeat: the policy's seconds over all steps of the point, and their share of the steps'
        policy = [sum(cell[1] for cell in run[point].values()) for run in runs]
        share = [p / sum(cell[2] for cell in run[point].values()) for p, run in zip(policy, runs)]
        totals[point] = {"policy_ms_per_repeat": 1e3 * statistics.median(policy),
                         "policy_ms_range": [1e3 * min(policy), 1e3 * max(policy)],
                         "share_of_step_time": statistics.median(share), "share_range": [min(share), max(share)]}
        print(f"{point}: the policy's calls took {totals[point]['policy_ms_per_repeat']:.1f} ms a repeat "
              f"({1e3 * min(policy):.1f}-{1e3 * max(policy):.1f}), {100 * totals[point]['share_of_step_time']:.1f} % "
              f"({100 * min(share):.1f}-{100 * max(share):.1f}) of the steps' time")
    table = {}
    for point in runs[0]:
        keys = sorted({k for run in runs for k in run[point]},
                      key=lambda k: -sum(r[point].get(k, [0])[0] for r in runs))  # most steps first
        table[point] = {}
        for k in keys:
            policy_us = [1e6 * r[point][k][1] / r[point][k][0] for r in runs if k in r[point]]
            table[point][k] = {"steps_per_repeat": statistics.median(r[point].get(k, [0])[0] for r in runs),
                               "policy_us_per_step": statistics.median(policy_us),
                               "policy_us_per_step_range": [min(policy_us), max(policy_us)],
                               "step_ms": statistics.median(1e3 * r[point][k][2] / r[point][k][0]
                                                            for r in runs if k in r[point])}
        for k, v in list(table[point].items())[:8]:
            low, high = v["policy_us_per_step_range"]
            print(f"{point} {k:>9}: {v['steps_per_repeat']:5.0f} steps a repeat, policy {v['policy_us_per_step']:4.0f} "
                  f"({low:.0f}-{high:.0f}) us a step, step {v['step_ms']:.1f} ms")
    args.output.write_text(json.dumps({
        "command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cost_model_from": str(args.cost), "cost_device": record["cost_model"]["meta"].get("device"),
        "threads": args.threads, "device": args.device, "step_mode": spec.generator.step_mode.mode,
        "repeats": args.repeats, "totals": totals, "cells": table,
        "fold_cold_and_warm": twice},
        indent=1) + "\n")


if __name__ == "__main__":
    main()
