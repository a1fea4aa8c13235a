"""Offline: newcomer back-off verdicts from any batch for every newcomer (before), or per batch kind (now).

    python benchmarks/bucket_verdicts.py [--repeats 8] [--threads 2] [--points short:16,short:4]

The cost policy backs off a prompt-length bucket's newcomer probes after its requests fail in a row
(draft_length/newcomers.py). A request is judged where it stops keeping the drafter's context or ends keeping
it. Before, every verdict backed off every newcomer of its bucket; now a verdict from a batch larger than
`ProbeSettings.newcomer_batch` backs off only newcomers joining a large batch (`CostBasedDraftLen.judges`).
Each repeat, like a fresh server, runs the served warm-up and then the points in order (benchmarks/
newcomer_backoff.py's closed loop: held-out prompts, 128 new tokens, 6 requests per client) once with each rule,
the order alternating between repeats. Per repeat, rule and point: output tokens/s, requests that never
drafted, and the buckets backed off after the point; per point, the ratio now / before per repeat (median,
range). Writes benchmarks/results/bucket_verdicts.json.
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
from cpu_decode import run_record  # noqa: E402
from newcomer_backoff import capacity, closed_loop, offline_pairs, parse_points, served_warm_up  # noqa: E402

from trtllm_dflash.draft_length.policy import CostBasedDraftLen  # noqa: E402

OUT = Path(__file__).parent / "results" / "bucket_verdicts.json"


class JudgedAnywhere(CostBasedDraftLen):
    """The rule before: every verdict, from any batch, counts for every newcomer of its bucket."""

    def judging(self, batch) -> bool:
        return True


def one_server(generator, policy, prompts: dict, points) -> dict:
    generator.policy = policy
    generator.allocate(max(c for _, c in points), capacity(generator), generator.block)
    served_warm_up(generator, prompts, 4)
    out = {}
    for context, c in points:
        tokens_per_s, never = closed_loop(generator, prompts[context], c, [])
        out[f"{context}:{c}"] = {"tokens_per_s": tokens_per_s, "never_drafted": never,
                                 "backed_off_after": policy.newcomers.describe(),
                                 "large_batches_backed_off_after": policy.crowd.describe()}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--points", default="short:16,short:4")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    started, load_before = time.time(), os.getloadavg()
    points = parse_points(args.points)
    spec, _, prompts, calibrated = offline_pairs(args.threads, max(c for _, c in points))
    cases = {"per batch kind (now)": CostBasedDraftLen, "any batch, every newcomer (before)": JudgedAnywhere}
    runs = {name: [] for name in cases}
    for r in range(args.repeats):
        for name in (list(cases) if r % 2 == 0 else list(cases)[::-1]):
            runs[name].append(one_server(spec.generator, cases[name](calibrated.cost), prompts, points))
            print(f"[{time.time() - started:5.0f} s] repeat {r} {name}: {json.dumps(runs[name][-1])}", flush=True)
    table = []
    for context, c in points:
        key = f"{context}:{c}"
        ratios = [now[key]["tokens_per_s"] / before[key]["tokens_per_s"]
                  for now, before in zip(*(runs[name] for name in cases))]
        table.append({"point": key, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                      "ratio_max": max(ratios), "ratios": ratios,
                      "never_drafted": {name: [run[key]["never_drafted"] for run in runs[name]] for name in cases}})
        print(json.dumps(table[-1]))
    record = run_record(args, started, load_before) | {"table": table, "runs": runs}
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
