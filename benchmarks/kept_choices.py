"""Issue 16: the cost policy keeping a clear drafting choice for a few steps (DRAFT_KEPT_STEPS, 4) against choosing
at every step (1, as before), offline on this CPU.

    python benchmarks/kept_choices.py [--repeats 10] [--points short:1,short:4,short:16] [--cost FILE] [--threads 2]

One process, the built-in pair's DFlash generator (float32, eager), newcomer_backoff.py's closed loop (the served
workload: held-out snippets or 1024-token windows, 128 new tokens, EOS ignored, `concurrency` requests in flight,
6 per client, after the served warm-up). Both cases run the cost policy on one cost model: calibrated here at the
load, or a gpu_policy.json's with `--cost` (the H100's makes the policy draft at 16 rows, as it did there); they
alternate order per repeat, each on a fresh policy. Per point: output tokens/s of each case, the ratio kept ÷ every
step per repeat (median, range), and per case the steps, drafting steps and evaluations of the expected rates (the
host work a kept choice saves; benchmarks/policy_host_time.py times it) per repeat, medians. Every request's output
is compared between the cases (greedy: both must be the target's). Writes benchmarks/results/kept_choices.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpu_policy import StepTrace  # noqa: E402
from newcomer_backoff import capacity, closed_loop, offline_pairs, parse_points, served_warm_up  # noqa: E402

from trtllm_dflash.draft_length import policy as policies  # noqa: E402
from trtllm_dflash.draft_length.cost import CostModel  # noqa: E402

OUT = Path(__file__).parent / "results" / "kept_choices.json"
CASES = {"kept (4)": 4, "every step (1)": 1}


def count_evaluations(policy) -> list:
    """Wraps `policy.expected_rates` (an instance attribute); -> a list that gets one item per evaluation."""
    evaluations, rates = [], policy.expected_rates
    policy.expected_rates = lambda batch: evaluations.append(1) or rates(batch)
    return evaluations


def one_case(generator, cost, kept: int, prompts: dict, points, outputs: dict) -> dict:
    """A fresh policy keeping drafting choices `kept` steps serves every point in order; -> point -> counts."""
    policies.DRAFT_KEPT_STEPS = kept
    policy = policies.CostBasedDraftLen(cost)
    generator.policy = policy
    generator.allocate(max(c for _, c in points), capacity(generator), generator.block)
    served_warm_up(generator, prompts, 2)
    evaluations, out = count_evaluations(policy), {}
    for context, c in points:
        trace, before = StepTrace().wrap(generator), len(evaluations)
        try:
            tokens_per_s, _ = closed_loop(generator, prompts[context], c, outputs.setdefault(f"{context}:{c}", []))
        finally:
            del generator.step, generator.admit
        cells = trace.summary()["steps"]  # "rows k keeping" -> counts
        out[f"{context}:{c}"] = {"tokens_per_s": tokens_per_s, "steps": sum(v["count"] for v in cells.values()),
                                 "drafting_steps": sum(v["count"] for key, v in cells.items() if key.split()[1] != "0"),
                                 "rate_evaluations": len(evaluations) - before}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--points", default="short:1,short:4,short:16")
    p.add_argument("--cost", type=Path, default=None, help="a gpu_policy.json whose cost model to use")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    started = time.time()
    points = parse_points(args.points)
    spec, _, prompts, calibrated = offline_pairs(args.threads, max(c for _, c in points))
    cost = calibrated.cost if args.cost is None else CostModel.from_json(
        json.loads(args.cost.read_text())["cost_model"], str(args.cost))
    default = policies.DRAFT_KEPT_STEPS
    runs: dict = {name: [] for name in CASES}
    differing = {}
    try:
        for r in range(args.repeats):
            outputs = {name: {} for name in CASES}
            for name in (list(CASES) if r % 2 == 0 else list(CASES)[::-1]):
                runs[name].append(one_case(spec.generator, cost, CASES[name], prompts, points, outputs[name]))
            first, second = (outputs[name] for name in CASES)
            for point in first:
                differing[point] = differing.get(point, 0) + sum(a != b for a, b in zip(first[point], second[point]))
            print(f"[{time.time() - started:5.0f} s] repeat {r}: " + "; ".join(
                f"{pt} {runs['kept (4)'][-1][pt]['tokens_per_s'] / runs['every step (1)'][-1][pt]['tokens_per_s']:.3f}"
                for pt in first), flush=True)
    finally:
        policies.DRAFT_KEPT_STEPS = default
    table = []
    for context, c in points:
        point = f"{context}:{c}"
        ratios = [a[point]["tokens_per_s"] / b[point]["tokens_per_s"] for a, b in zip(*runs.values())]
        row = {"point": point, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios), "ratios": ratios, "requests_differing": differing[point]}
        for name in CASES:
            for key in ("tokens_per_s", "steps", "drafting_steps", "rate_evaluations"):
                row[f"{name}: {key}"] = statistics.median(run[point][key] for run in runs[name])
        table.append(row)
        print(f"{point}: kept / every step {row['ratio_median']:.3f} ({row['ratio_min']:.3f}-{row['ratio_max']:.3f}); "
              + "; ".join(f"{name}: {row[f'{name}: drafting_steps']:.0f} drafting of {row[f'{name}: steps']:.0f} "
                          f"steps, {row[f'{name}: rate_evaluations']:.0f} evaluations" for name in CASES)
              + f"; requests differing {differing[point]}")
    args.output.write_text(json.dumps({
        "command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": time.time() - started, "threads": args.threads,
        "cost_model_from": str(args.cost) if args.cost else "calibrated at the load", "cost_model": cost.to_json(),
        "table": table, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
