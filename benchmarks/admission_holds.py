"""Whether the serving loop's admission gate holds requests on this machine, and what it sees.

    python benchmarks/admission_holds.py [--repeats 2] [--threads 2] [--points short:16,short:4,1024:16]

The served benchmark's closed loop offline (benchmarks/newcomer_backoff.py's `gated_loop`: held-out prompts, 128
new tokens, 6 requests per client), DFlash with the cost policy, each point's requests admitted through an
`AdmissionGate` (serve/admission.py) whose fixed cost `fixed_cost` measured on this engine after the served
warm-up, as `dflash-serve` does at load. Per repeat and point: the fixed cost, the gate's decisions while
requests waited (admitted now / held), the largest arrival rate it estimated, admission calls and output
tokens/s. On this CPU the admission's fixed part is a few ms against prefill work of ~20 ms a prompt, and
lambda B F stays near or below 1, so the gate should admit at once (the served numbers before it stand).
Writes benchmarks/results/admission_holds.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode import run_record  # noqa: E402
from newcomer_backoff import capacity, gated_loop, offline_pairs, parse_points, served_warm_up  # noqa: E402

from trtllm_dflash.draft_length.policy import CostBasedDraftLen  # noqa: E402
from trtllm_dflash.serve.admission import AdmissionGate, fixed_cost  # noqa: E402

OUT = Path(__file__).parent / "results" / "admission_holds.json"


class CountingGate(AdmissionGate):
    """An AdmissionGate that counts its decisions while requests wait (`now`: admission calls)."""

    def __init__(self, fixed_s: float):
        super().__init__(fixed_s)
        self.now, self.held, self.calls, self.max_rate = 0, 0, 0, 0.0

    def ready(self, running: int, waited: list[float]) -> bool:
        admit = super().ready(running, waited)
        if waited:
            self.now += admit
            self.held += not admit
            self.max_rate = max(self.max_rate, self.rate())
        return admit


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--points", default="short:16,short:4,1024:16")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    started, load_before = time.time(), os.getloadavg()
    points = parse_points(args.points)
    spec, _, prompts, calibrated = offline_pairs(args.threads, max(c for _, c in points))
    generator, rows = spec.generator, []
    for r in range(args.repeats):
        generator.policy = CostBasedDraftLen(calibrated.cost)  # a fresh server's policy
        generator.allocate(max(c for _, c in points), capacity(generator), generator.block)
        served_warm_up(generator, prompts, 4)
        fixed = fixed_cost(generator)
        for context, c in points:
            gate = CountingGate(fixed)
            tokens_per_s, never = gated_loop(generator, prompts[context], c, [], gate)
            rows.append({"repeat": r, "point": f"{context}:{c}", "fixed_cost_ms": fixed * 1e3,
                         "admission_calls": gate.now, "held": gate.held, "max_rate_per_s": gate.max_rate,
                         "tokens_per_s": tokens_per_s, "never_drafted": never})
            print(json.dumps(rows[-1]), flush=True)
    args.output.write_text(json.dumps(run_record(args, started, load_before) | {"rows": rows}, indent=1) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
