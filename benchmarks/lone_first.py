"""Offline: `make demo`'s concurrency-16 point when its wave's first request is admitted alone, a few steps before
the other 15, DFlash with the plain streak counted on any batch (before) and on a batch of the newcomers' kind (now),
over plain decoding.

    python benchmarks/lone_first.py [--repeats 9] [--leads 0,3] [--threads 2]

In the served `make demo` the 16 requests of a one-wave point arrive together, but the serving loop often admits the
first one alone (its prefill, 12-25 ms) and the other 15 in a second call (build/demo/runs/r*/*/requests.jsonl: the
first token of one request at 17-25 ms, the others' at 140-380). Alone, a newcomer probes and drafts with no margin,
which breaks the plain streak that `CostBasedDraftLen.drafts_for` reads; the 15 then kept the drafter's context beside
it. Here each case runs `demo_waves.py`'s sweep up to the concurrency-16 warm-up on freshly allocated caches and a
fresh policy (sharing one calibration), then the measured wave: one request admitted, `lead` steps, the other 15
admitted, decoded to the end. Cases rotate per repeat. Per lead: each DFlash case's output tokens/s over plain per
repeat, and the wave's request-steps that kept the drafter's context. Writes benchmarks/results/lone_first.json.
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
from demo_waves import (MEASURED, NEW_TOKENS, WARMUP_PER_LOAD, closed_loop, compare, demo_prompts,  # noqa: E402
                        each_case)
from newcomer_backoff import capacity, offline_pairs  # noqa: E402

from trtllm_dflash.draft_length.policy import PLAIN_ONLY_AFTER, CostBasedDraftLen  # noqa: E402

OUT = Path(__file__).parent / "results" / "lone_first.json"
WAVE = 16  # make demo's largest concurrency: one wave of MEASURED requests


class StreakOfAnyBatch(CostBasedDraftLen):
    """The rule before: fewer than PLAIN_ONLY_AFTER plain-best steps in a row keep newcomers' context, whatever
    batch the streak was counted on."""

    def streak_holds(self, batch) -> bool:
        return self.plain_streak < PLAIN_ONLY_AFTER


CASES = {"plain": None, "before": StreakOfAnyBatch, "now": CostBasedDraftLen}


def wave(generator, prompts, first: int, lead: int) -> tuple[float, int]:
    """The measured wave: one request, `lead` steps, the other 15 -> (output tokens/s, request-steps that kept the
    drafter's context)."""
    from trtllm_dflash.request import Request

    requests = [Request(prompts[i % len(prompts)], NEW_TOKENS, ignore_eos=True) for i in range(first, first + WAVE)]
    start, keeping = time.perf_counter(), 0
    done = generator.admit(requests[:1])
    for _ in range(lead):
        keeping += sum(s.drafting for s in generator.step())
    done += generator.admit(requests[1:])
    while generator.slots.running:
        keeping += sum(s.drafting for s in generator.step())
    return sum(len(s.result.output_ids) for s in done) / (time.perf_counter() - start), keeping


def point(generator, prompts, lead: int) -> dict:
    """demo_waves' sweep up to the concurrency-16 warm-up, then the wave."""
    generator.allocate(WAVE, capacity(generator), generator.block)
    nxt = 0
    for c in (1, 2, 4, 8):
        closed_loop(generator, prompts, nxt, WARMUP_PER_LOAD * c + MEASURED, c)
        nxt += WARMUP_PER_LOAD * c + MEASURED
    closed_loop(generator, prompts, nxt, WARMUP_PER_LOAD * WAVE, WAVE)
    tokens_per_s, keeping = wave(generator, prompts, nxt + WARMUP_PER_LOAD * WAVE, lead)
    return {"tokens_per_s": tokens_per_s, "keeping_steps": keeping}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--leads", default="0,3", help="steps the first request runs alone before the other 15 join")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    started, load_before = time.time(), os.getloadavg()
    leads = [int(x) for x in args.leads.split(",")]
    spec, plain, _, calibrated = offline_pairs(args.threads, WAVE)
    prompts = demo_prompts(spec.tokenizer)
    runs = {str(lead): {name: [] for name in CASES} for lead in leads}
    for r in range(args.repeats):
        for lead in leads:
            for name, generator in each_case(CASES, r, spec, plain, calibrated.cost):
                runs[str(lead)][name].append(point(generator, prompts, lead))
        print(f"[{time.time() - started:5.0f} s] repeat {r}: "
              + json.dumps({lead: {n: v[-1] for n, v in cases.items()} for lead, cases in runs.items()}), flush=True)
    table = []
    for lead, cases in runs.items():
        row = {"lead": int(lead)} | compare(cases["plain"], cases["before"], cases["now"])
        table.append(row)
        print(f"lead {lead}: " + ", ".join(f"{k} {row[k]['median']:.3f} ({row[k]['min']:.3f}-{row[k]['max']:.3f})"
                                           for k in ("before / plain", "now / plain", "now / before"))
              + f"; keeping steps before {row['before keeping steps']}, now {row['now keeping steps']}")
    record = run_record(args, started, load_before) | {"table": table, "runs": runs}
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
