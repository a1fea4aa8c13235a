"""Compiled decode steps against eager ones on the CPU (trtllm_dflash/step_mode.py), as ratios of runs made back to
back in alternating order (the machine is shared and noisy).

    python benchmarks/cpu_step_modes.py [--repeats 7] [--prompts 8] [--max-new-tokens 96] [--threads 1]

Built-in pair (trtllm_dflash/pairs/stdlib), held-out prompts, fixed output length (EOS ignored), greedy, the whole
block drafted every step (the pipeline's default policy, so both modes run the same steps). Four engines: plain
decoding and DFlash, each eager and compiled (`--step-mode compile`: torch.compile of the target's cached pass
and the drafter's pass; the load-time warm-up that compiles them is timed). Cases, each the ratio of output
tokens/s (prefill included) of two runs over the same prompts, alternating which runs first, --repeats times:
  plain_b1, plain_b8     compiled plain / eager plain, batch 1 and 8 (prompts cut to one length for batch 8)
  dflash_b1, dflash_b8   compiled DFlash / eager DFlash
  dflash_vs_plain_eager, dflash_vs_plain_compiled   DFlash / plain at batch 1 in each mode
  dflash_auto_vs_plain_eager, dflash_auto_vs_plain_compiled   the same with --draft-len auto (each step's draft
                         length from a step cost calibrated in that mode and live acceptance)
Outputs are checked identical across modes and between DFlash and plain. Writes
benchmarks/results/cpu_step_modes.json; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode import interleaved, prompts, run_record  # the same prompts, alternation and record

OUT = Path(__file__).parent / "results" / "cpu_step_modes.json"


def load(mode: str):
    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.pipeline import load_pipeline

    target, drafter = stdlib_pair()
    engines, load_s = {}, {}
    for name, pair in (("plain", (target,)), ("dflash", (target, drafter))):
        t0 = time.perf_counter()
        engines[name] = load_pipeline(*pair, step_mode=mode)
        load_s[name] = time.perf_counter() - t0
    return engines, load_s


def run(pipeline, prompt_ids, new_tokens: int, batch: int):
    """-> (seconds, output ids), requests `batch` at a time."""
    from trtllm_dflash.request import Request

    requests = [Request(p, new_tokens, ignore_eos=True) for p in prompt_ids]
    t0 = time.perf_counter()
    results = [r for i in range(0, len(requests), batch) for r in pipeline.generator.generate(requests[i:i + batch])]
    return time.perf_counter() - t0, [r.output_ids for r in results]


def case(a, b) -> dict:
    """Speed of A over B (output tokens/s ratio = B's seconds / A's), per repeat, and whether outputs agree."""
    ratios = [y[0] / x[0] for x, y in zip(a, b)]
    return {"ratios": ratios, "min": min(ratios), "median": statistics.median(ratios), "max": max(ratios),
            "identical": all(x[1] == y[1] for x, y in zip(a, b))}


def run_cases(eager, compiled, args) -> dict:
    from trtllm_dflash.draft_length.settings import make_policy

    n, reps = args.max_new_tokens, args.repeats
    tokenizer = eager["plain"].tokenizer
    one, same = prompts(tokenizer, args.prompts), prompts(tokenizer, 8, args.batch_prompt_tokens)
    for engines in (eager, compiled):  # first-call costs out of every measurement
        for p in engines.values():
            run(p, one[:1], 8, 1)
    cases = {}
    for name in ("plain", "dflash"):
        for batch, ids in ((1, one), (8, same)):
            a, b = interleaved(lambda e=compiled[name], i=ids, k=batch: run(e, i, n, k),
                               lambda e=eager[name], i=ids, k=batch: run(e, i, n, k), reps)
            cases[f"{name}_b{batch}"] = case(a, b)
    for label, engines in (("eager", eager), ("compiled", compiled)):
        a, b = interleaved(lambda e=engines: run(e["dflash"], one, n, 1), lambda e=engines: run(e["plain"], one, n, 1),
                           reps)
        cases[f"dflash_vs_plain_{label}"] = case(a, b)
    for label, engines in (("eager", eager), ("compiled", compiled)):  # the draft length chosen every step
        generator = engines["dflash"].generator
        generator.policy = make_policy("auto", generator.block - 1)  # calibrated in this step mode
        run(engines["dflash"], one[:1], 8, 1)
        a, b = interleaved(lambda e=engines: run(e["dflash"], one, n, 1), lambda e=engines: run(e["plain"], one, n, 1),
                           reps)
        cases[f"dflash_auto_vs_plain_{label}"] = case(a, b)
    return cases


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--prompts", type=int, default=8, help="batch-1 prompts per run")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch-prompt-tokens", type=int, default=32, help="prompt length in the batch-8 cases")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    eager, eager_load = load("eager")
    compiled, compiled_load = load("compile")
    started = time.time()
    cases = run_cases(eager, compiled, args)
    record = {**run_record(args, started, load_before), "load_s": {"eager": eager_load, "compile": compiled_load},
              "cases": cases}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"load (s): eager {eager_load}, compile {compiled_load}")
    print(f"{'case':<26} {'min':>6} {'median':>7} {'max':>6}  identical")
    for name, c in cases.items():
        print(f"{name:<26} {c['min']:>6.2f} {c['median']:>7.2f} {c['max']:>6.2f}  {c['identical']}")
    print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
