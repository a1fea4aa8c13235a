"""Host time the cost-based draft-length policy adds to every decode step (choose, keeps_context at a plain
step, timed, observe).

    python benchmarks/policy_overhead.py [--steps 2000] [--repeats 5]

At batch 1 on the CPU a plain step of the built-in pair takes about 2.5 ms, so the policy's own
work is a visible share of it. The policy runs with a step-cost grid shaped as calibration makes it
for a 16-slot engine (synthetic seconds: the host work does not depend on their values) and
acceptance evidence from simulated drafting steps. Three regimes per batch size: a run of plain
steps (the policy keeps choosing k = 0: what a DFlash engine does where drafting does not pay), a run
of drafting steps (k = 4, one or two drafts accepted per row), and plain-only requests alone (none
keeps the drafter's context: the generator asks nothing, and reports `plain_only_step`; the row
"plain-only, as before" times the `timed` and `observe` calls it made there until it reported only that).
Median over --repeats of the mean microseconds per step. Writes benchmarks/results/policy_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from trtllm_dflash.draft_length.calibrate import CalibrationPlan
from trtllm_dflash.draft_length.cost import CostModel
from trtllm_dflash.draft_length.policy import BatchView, CostBasedDraftLen

OUT = Path(__file__).parent / "results" / "policy_overhead.json"
SLOTS, MAX_DRAFT_LEN, CONTEXT = 16, 15, 1100


def grid_cost() -> CostModel:
    """Calibration's grid for 16 slots and contexts up to 2048; seconds linear in rows and drafts."""
    plan = CalibrationPlan.covering(SLOTS, MAX_DRAFT_LEN, 2048)
    seconds = [[[2e-3 * (1 + 0.1 * b) * (1 + (0.6 + 0.05 * k if k else 0)) * (1 + c / 4096) for k in plan.draft_lens]
                for b in plan.batch_sizes] for c in plan.contexts]
    return CostModel(plan.batch_sizes, plan.draft_lens, plan.contexts, seconds)


def prepared(cost: CostModel) -> CostBasedDraftLen:
    policy = CostBasedDraftLen(cost)
    generator = type("G", (), {"slots": type("S", (), {"usable": SLOTS}), "block": MAX_DRAFT_LEN + 1})()
    policy.prepare(generator)
    return policy


def asked(draft_len: int):
    """A step whose draft length the policy is asked for (draft_len runs: 0 a plain run, else a drafting run)."""
    def step(policy: CostBasedDraftLen, slots: list[int], view: BatchView, accepted: list[int]) -> None:
        if policy.choose(view) == 0:  # the generator then asks which requests keep the drafter's context
            policy.keeps_context(view)
        policy.timed(len(slots), CONTEXT, draft_len, 2.5e-3)
        policy.observe(slots, draft_len, accepted if draft_len else [0] * len(slots))
    return step


def plain_only(policy: CostBasedDraftLen, slots: list[int], view: BatchView, accepted: list[int]) -> None:
    """Plain-only requests alone: the generator asks nothing and reports only that the step ran."""
    policy.plain_only_step()


def plain_only_before(policy: CostBasedDraftLen, slots: list[int], view: BatchView, accepted: list[int]) -> None:
    """... as the generator reported such a step before `plain_only_step`: a plain step's timed and observe."""
    policy.timed(len(slots), CONTEXT, 0, 2.5e-3)
    policy.observe(slots, 0, [0] * len(slots))


# (regime, draft_len recorded in the JSON, one step's policy calls)
REGIMES = (("plain run", 0, asked(0)), ("drafting run", 4, asked(4)), ("plain-only", None, plain_only),
           ("plain-only, as before", -1, plain_only_before))


def per_step_us(policy: CostBasedDraftLen, batch: int, step, steps: int) -> float:
    """Mean microseconds of one step's policy calls (`step`, one of REGIMES') over `steps` steps."""
    slots = list(range(batch))
    policy.admit(slots, [CONTEXT] * batch)
    rng = np.random.default_rng(0)
    for _ in range(50):  # some evidence, so the estimates are not the prior's
        policy.observe(slots, 4, rng.integers(0, 3, batch).tolist())
    view = BatchView(slots, CONTEXT, [1000] * batch, MAX_DRAFT_LEN)
    accepted = [[int(a) for a in rng.integers(0, 3, batch)] for _ in range(steps)]
    t0 = time.perf_counter()
    for i in range(steps):
        step(policy, slots, view, accepted[i])
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    cost, rows = grid_cost(), []
    for batch in (1, 16):
        for regime, k, step in REGIMES:
            us = [per_step_us(prepared(cost), batch, step, args.steps) for _ in range(args.repeats)]
            rows.append({"batch": batch, "regime": regime, "draft_len": k, "us_per_step_median": statistics.median(us),
                         "us_per_step": us})
            print(f"batch {batch:2}  {regime:21}  {statistics.median(us):7.1f} us/step  "
                  f"({min(us):.1f}-{max(us):.1f})", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": commit, "machine": {"platform": platform.platform(), "python": platform.python_version(),
                                            "numpy": np.__version__},
              "settings": vars(args) | {"output": str(args.output)}, "rows": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
