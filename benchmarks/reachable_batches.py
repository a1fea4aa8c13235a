"""Which batches the cost policy's `reachable` lets probe, on this machine's calibration of the built-in pair.

    python benchmarks/reachable_batches.py [--threads 2] [--contexts 128,512,1024] [--batches 1,2,3,4,8,16]

The built-in pair (float32) calibrated as benchmarks/newcomer_backoff.py's offline runs are (16 slots, up to 1024
tokens). For each context and batch size B, and each count D = 1..B of requests keeping the drafter's context (the
rest plain-only), whether `CostBasedDraftLen.reachable` holds: whether some draft length would beat a plain step by
the batch's margin even if every draft were accepted. Also the calibrated step cost at batch 16 in plain steps
per draft length. Writes benchmarks/results/reachable_batches.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from newcomer_backoff import offline_pairs  # noqa: E402

OUT = Path(__file__).parent / "results" / "reachable_batches.json"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--contexts", default="128,512,1024")
    p.add_argument("--batches", default="1,2,3,4,8,16")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    from trtllm_dflash.draft_length.policy import BatchView

    spec, _, _, policy = offline_pairs(args.threads, 16)
    k = spec.generator.block - 1
    out = {}
    for context in (int(c) for c in args.contexts.split(",")):
        seconds = policy.cost.step_seconds(16, context, k)
        row = {"batch_16_cost_in_plain_steps": [round(float(x / seconds[0]), 3) for x in seconds]}
        for b in (int(x) for x in args.batches.split(",")):
            row[f"batch_{b}_reachable_with_d_keeping"] = [
                policy.reachable(BatchView(list(range(b)), context, [128] * b, k, (True,) * d + (False,) * (b - d)))
                for d in range(1, b + 1)]
        out[str(context)] = row
        print(context, json.dumps(row))
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "threads": args.threads, "calibration": policy.cost.meta, "contexts": out}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
