"""Host time of the draft-length policy's calls inside real decode steps of plain-only requests alone.

    python benchmarks/plain_only_host.py [--repeats 5] [--threads 2] [--batch 4]

Where drafting does not pay, a served DFlash engine admits requests plain-only, and its steps then run plain
decoding's ops; what is left of DFlash there is the policy's bookkeeping between steps. The built-in pair
(float32), `--batch` requests of 1024-token held-out windows at a time, 24 requests, 128 new tokens, all
admitted plain-only, under the cost policy (`--draft-len auto`, calibrated once here). Two cases, interleaved
per repeat: the generator as it is (it reports such a step with `plain_only_step`), and "as before": a policy
whose `plain_only_step` makes the `timed` and `observe` calls of a plain step for the running rows, which is
what the generator called there until it reported only that step. The policy's methods are timed in the loop,
where the step has just evicted their data from the caches (benchmarks/policy_overhead.py times them alone,
warm). Microseconds per step of each method, and the median wall time per step.
Writes benchmarks/results/plain_only_host.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from plain_only_admission import CONTEXT, NEW, windows  # noqa: E402

OUT = Path(__file__).parent / "results" / "plain_only_host.json"
REQUESTS = 24
METHODS = ("choose", "keeps_context", "drafts_for", "admit", "timed", "observe", "plain_only_step", "release")
NESTED = ("timed", "observe")  # in these runs called only from "as before"'s plain_only_step, already in its time


def as_before(cost):
    from trtllm_dflash.draft_length.policy import CostBasedDraftLen

    class AsBefore(CostBasedDraftLen):
        """Reports a plain-only step as the generator did before: `timed` and `observe` of a plain step."""

        def __init__(self, cost):
            super().__init__(cost)
            self.rows: set[int] = set()

        def admit(self, slots, contexts):
            super().admit(slots, contexts)
            self.rows.update(slots)

        def release(self, slot, drafting):
            super().release(slot, drafting)
            self.rows.discard(slot)

        def plain_only_step(self):
            rows = sorted(self.rows)
            self.timed(len(rows), CONTEXT, 0, 5e-3)
            self.observe(rows, 0, [0] * len(rows))

    return AsBefore(cost)


def timed_methods(policy, spent: dict) -> None:
    """Wrap the policy's per-step methods to add their wall seconds into spent[name]."""
    for name in METHODS:
        method = getattr(policy, name)

        @functools.wraps(method)
        def wrapper(*args, _method=method, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - t0

        setattr(policy, name, wrapper)


def run(generator, policy, prompts, batch: int) -> tuple[float, int, dict]:
    """-> (wall seconds of the steps, steps, seconds per policy method)."""
    from trtllm_dflash.request import Request

    spent: dict = {}
    generator.policy = policy
    generator.allocate(batch, CONTEXT + NEW + generator.block + 1, generator.block)
    timed_methods(policy, spent)
    todo, steps, stepping = list(range(REQUESTS)), 0, 0.0
    while todo or generator.slots.running:
        room = min(len(generator.slots.free()), len(todo))
        if room:
            generator.admit([Request(prompts[i % len(prompts)], NEW, ignore_eos=True) for i in todo[:room]],
                            drafting=False)
            del todo[:room]
        t0 = time.perf_counter()
        generator.step()
        stepping += time.perf_counter() - t0
        steps += 1
    return stepping, steps, spent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    import torch

    from trtllm_dflash.draft_length.calibrate import calibrator
    from trtllm_dflash.draft_length.policy import CostBasedDraftLen
    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.pipeline import load_pipeline

    torch.set_num_threads(args.threads)
    spec = load_pipeline(*stdlib_pair())
    prompts = windows(spec.tokenizer, args.batch)
    gen = spec.generator
    gen.allocate(args.batch, CONTEXT + NEW + gen.block + 1, gen.block)
    cost = calibrator(None)(gen)
    cases = {"now": lambda: CostBasedDraftLen(cost), "as before": lambda: as_before(cost)}
    samples = {name: [] for name in cases}
    for r in range(args.repeats):
        for name in (list(cases) if r % 2 == 0 else list(cases)[::-1]):
            samples[name].append(run(gen, cases[name](), prompts, args.batch))
    rows = []
    for name, runs in samples.items():
        us = {m: statistics.median(spent.get(m, 0.0) / steps * 1e6 for _, steps, spent in runs) for m in METHODS}
        step_ms = [wall / steps * 1e3 for wall, steps, _ in runs]
        total = sum(v for m, v in us.items() if m not in NESTED)
        rows.append({"case": name, "policy_us_per_step": total, "us_per_step_by_method": us,
                     "step_ms_median": statistics.median(step_ms), "step_ms": step_ms})
        calls = ", ".join(f"{m} {v:.1f}" for m, v in us.items() if v >= 0.05)
        print(f"{name:9}  policy {total:6.1f} us/step ({calls})  step {statistics.median(step_ms):.3f} ms "
              f"(median of {args.repeats}, {min(step_ms):.3f}-{max(step_ms):.3f})")
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"platform": platform.platform(), "threads": args.threads}, "context": CONTEXT,
              "new_tokens": NEW, "requests": REQUESTS, "batch": args.batch, "rows": rows}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
