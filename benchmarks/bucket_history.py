"""Offline: newcomer back-off with and without the bucket's verdict history, on `make demo`'s sweep.

    python benchmarks/bucket_history.py [--repeats 9] [--threads 2] [--concurrency 1,2,4]

The cost policy backs off a prompt-length bucket's newcomer probes after a run of its requests fail
(draft_length/newcomers.py). Before, any run of n >= 2 failures did; now a bucket whose recent verdicts (decayed 0.9
per verdict) paid at least as often as they failed is not backed off. `make demo`'s held-out snippets mix easy and
hard prompts, and runs of hard ones held whole points plain. Three "servers" run benchmarks/demo_waves.py's sweep
(the demo's warm-ups, 16 measured requests per point, its prompts in its order) in one process, order rotating:
plain decoding, the policy with the streak-only back-off (before), and the default (now). Per point: DFlash's
tokens/s over plain per repeat and the request-steps that kept the drafter's context (0: the point ran plain).
Writes benchmarks/results/bucket_history.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import demo_waves  # noqa: E402
from cpu_decode import run_record  # noqa: E402

from trtllm_dflash.draft_length.newcomers import NewcomerBackoff  # noqa: E402
from trtllm_dflash.draft_length.policy import CostBasedDraftLen  # noqa: E402

OUT = Path(__file__).parent / "results" / "bucket_history.json"


class StreakOnlyPolicy(CostBasedDraftLen):
    """The rule before: n >= 2 failures in a row back a bucket off, whatever it paid before them (the back-off that
    large batches keep, `NewcomerBackoff(history=False)`)."""

    def prepare(self, generator) -> None:
        super().prepare(generator)
        self.newcomers = NewcomerBackoff(generator.slots.usable, self.probe.newcomer_longest, history=False)


CASES = {"plain": None, "before": StreakOnlyPolicy, "now": CostBasedDraftLen}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", default="1,2,4")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    started, load_before = time.time(), os.getloadavg()
    concurrency = tuple(int(c) for c in args.concurrency.split(","))
    runs = demo_waves.rotated_runs(CASES, args.repeats, args.threads, concurrency, started)
    table = []
    for c in map(str, concurrency):
        row = {"concurrency": int(c)}
        for name in ("before", "now"):
            ratios = [a[c]["tokens_per_s"] / b[c]["tokens_per_s"] for a, b in zip(runs[name], runs["plain"])]
            row[name] = demo_waves.summary(ratios) | {"keeping_steps": [run[c]["keeping_steps"] for run in runs[name]]}
            print(f"c={c} {name}: {row[name]['median']:.3f} ({row[name]['min']:.3f}-{row[name]['max']:.3f}), "
                  f"keeping steps {row[name]['keeping_steps']}")
        table.append(row)
    record = run_record(args, started, load_before) | {"table": table, "runs": runs}
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
