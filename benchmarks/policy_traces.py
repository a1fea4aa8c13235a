"""Where each case's time went, per point, from gpu_policy.py's step traces: admit calls and their ms, steps and
their seconds, and the costliest step cells (rows, draft length, rows keeping the drafter's context), as means
over repeats.

    python benchmarks/policy_traces.py RESULTS/gpu_policy.json [--nested] [--out FILE]

--nested: traces written by gpu_policy.py at 91bcb87, whose StepTrace wrapped the previous point's wrapper, so a
point's trace also holds every later point's steps and admissions; a point's own is its trace less the next
point's (counts and seconds subtract; per-step medians do not, so cells report means).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def own(traces: dict, points: list[str], point: str, nested: bool) -> dict:
    """-> {"admit_s", "admits", "steps": {cell: [count, seconds, tokens]}} of `point` alone."""
    mine = traces[point]
    steps = {key: [v["count"], v["seconds"], v["tokens"]] for key, v in mine["steps"].items()}
    admit_s, admits = mine["admit_s"], mine.get("admits")
    later = points.index(point) + 1
    if nested and later < len(points):
        after = traces[points[later]]
        for key, v in after["steps"].items():
            cell = steps[key]
            cell[0], cell[1], cell[2] = cell[0] - v["count"], cell[1] - v["seconds"], cell[2] - v["tokens"]
        admit_s -= after["admit_s"]
    return {"admit_s": admit_s, "admits": admits, "steps": {k: v for k, v in steps.items() if v[0] > 0}}


def summary(record: dict, nested: bool, top: int = 4) -> dict:
    points = [f"{row['context']}:{row['concurrency']}" for row in record["table"]]
    out = {}
    for case, repeats in record["step_traces"].items():
        for point in points:
            mine = [own(r, points, point, nested) for r in repeats]
            cells: dict[str, list] = {}
            for m in mine:
                for key, (count, seconds, tokens) in m["steps"].items():
                    c = cells.setdefault(key, [0, 0.0, 0])
                    c[0], c[1], c[2] = c[0] + count, c[1] + seconds, c[2] + tokens
            n = len(mine)
            costly = sorted(cells.items(), key=lambda kv: -kv[1][1])[:top]
            out.setdefault(point, {})[case] = {
                "admit_s_median": statistics.median(m["admit_s"] for m in mine),
                "admits_median": None if mine[0]["admits"] is None else statistics.median(m["admits"] for m in mine),
                "step_s_median": statistics.median(sum(v[1] for v in m["steps"].values()) for m in mine),
                "steps_per_repeat": sum(v[0] for v in cells.values()) / n,
                "costliest_cells": {key: {"steps_per_repeat": c / n, "mean_ms": 1e3 * s / c, "tokens_per_step": t / c}
                                    for key, (c, s, t) in costly}}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("results", type=Path)
    p.add_argument("--nested", action="store_true", help="traces from gpu_policy.py at 91bcb87 (see the docstring)")
    p.add_argument("--out", type=Path, default=None, help="default: policy_traces.json beside the results")
    args = p.parse_args()
    out = summary(json.loads(args.results.read_text()), args.nested)
    for point, cases in out.items():
        print(f"== {point}")
        for case, s in cases.items():
            admits = "" if s["admits_median"] is None else f" in {s['admits_median']:.0f} calls"
            cells = " | ".join(f"{k}: {v['steps_per_repeat']:.0f} x {v['mean_ms']:.2f} ms, "
                               f"{v['tokens_per_step']:.1f} tok" for k, v in s["costliest_cells"].items())
            print(f"  {case:18} admit {s['admit_s_median']:.3f} s{admits}; steps {s['step_s_median']:.3f} s | {cells}")
    (args.out or args.results.parent / "policy_traces.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
