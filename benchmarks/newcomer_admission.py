"""Offline, each case run like a fresh DFlash server: newcomers of a backed-off prompt-length bucket admitted
plain-only (this runtime) against admitted on the bucket's estimates (the rule before), over plain decoding.

    python benchmarks/newcomer_admission.py [--repeats 5] [--threads 2]
                                            [--points short:1,short:4,short:16,1024:1,1024:4]

The served benchmark's workload without the server (benchmarks/serve_dflash_vs_plain.py --warmup 4: the same
held-out prompts, snippets and 1024-token windows, 128 new tokens, EOS ignored; benchmarks/newcomer_backoff.py's
closed loop: `concurrency` requests in flight, 6 per client). Each case starts as that benchmark's servers do:
a fresh policy and caches, then its warm-up (one 8-token request, the last 4 snippets and the last 4 windows, one
at a time), then every point in order, like one server. Cases, on the built-in pair (float32), one process:
- plain: plain decoding;
- this runtime: `CostBasedDraftLen` (`--draft-len auto`), whose newcomers of a bucket backed off by
  draft_length/newcomers.py, when it is not their bucket's turn and no running request keeps the drafter's
  context, join plain-only;
- estimates decide: the same policy with `drafts_for` as it was before (`EstimatesDecide` below): those newcomers
  joined drafting where the bucket's optimistic rates said a draft length beats a plain step.
The cases alternate order per repeat and share one calibration. Output tokens/s per point, each DFlash case's
ratio to plain per repeat, median and range, and how many of the point's requests never drafted. Writes
benchmarks/results/newcomer_admission.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from newcomer_backoff import interleaved_runs, offline_pairs, one_server, parse_points, write_results  # noqa: E402
from serve_dflash_vs_plain import NEW_TOKENS  # noqa: E402

from trtllm_dflash.draft_length.policy import PLAIN_ONLY_AFTER, CostBasedDraftLen, pick  # noqa: E402

OUT = Path(__file__).parent / "results" / "newcomer_admission.json"
WARMUP = 4  # requests of each context, as the served benchmark's --warmup 4


class EstimatesDecide(CostBasedDraftLen):
    """`drafts_for` without the rule that admits newcomers of a backed-off bucket plain-only (as at commit 98ea4c8,
    with the later `reachable` check kept, so the two cases differ in that rule alone)."""

    def drafts_for(self, batch) -> bool:
        if self.cost is None or self.acceptance is None:
            return True
        if not self.reachable(batch):
            return False
        if self.newcomer_probe(batch):
            return True
        if self.plain_run + 1 >= self.wait and not (self.newcomer_waits and self.small(batch)):
            return True
        return self.plain_streak < PLAIN_ONLY_AFTER or pick(self.expected_rates(batch), self.margin(batch)) > 0


CASES = {"plain": None, "this runtime": CostBasedDraftLen, "estimates decide": EstimatesDecide}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--points", default="short:1,short:4,short:16,1024:1,1024:4", help="context:concurrency, in order")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    points = parse_points(args.points)
    load_before, started = os.getloadavg(), time.time()
    spec, plain, prompts, calibrated = offline_pairs(args.threads, 16)

    def run_case(name: str) -> dict:
        cls = CASES[name]
        generator = plain.generator if cls is None else spec.generator
        return one_server(generator, None if cls is None else cls(calibrated.cost), prompts, points, warmup=WARMUP)

    runs = interleaved_runs(list(CASES), args.repeats, run_case)
    write_results(args, started, load_before, runs, points, {"warmup": WARMUP, "new_tokens": NEW_TOKENS})


if __name__ == "__main__":
    main()
