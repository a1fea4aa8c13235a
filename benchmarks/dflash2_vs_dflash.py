"""The built-in DFlash2 drafter against the built-in DFlash drafter: held-out tau and CPU decode speed.

    python benchmarks/dflash2_vs_dflash.py [--prompts 32] [--speed-prompts 6] [--repeats 5] [--threads 1]

Same target (trtllm_dflash/pairs/stdlib), same block size (16, the whole block drafted every step), greedy,
batch 1, prompts from stdlib files held out from every stage of training (pairs.held_out_texts).
- tau: tokens per verify step pooled over all steps (the bonus token included), stopping at EOS; the two
  outputs are checked identical (both are the target's greedy output).
- speed: output tokens/s over --speed-prompts prompts at a fixed length (EOS ignored), DFlash2 and DFlash
  runs made in alternating order (AB, BA, ...) --repeats times. `tokens_per_s` is each run's ratio
  DFlash2 / DFlash (whole requests, prefill included); `at_same_tau` is the ratio of their verify steps per
  second of decoding (first token to last, prefill excluded: the fewer steps of the higher tau would otherwise
  carry the same prefill): the decode speed ratio the two would have at one tau, what the convolutions and the
  selector cost.
Goals (issue 57): tau(DFlash2) >= tau(DFlash); at_same_tau median >= 0.9. Nothing is asserted: the JSON
(benchmarks/results/dflash2_vs_dflash.json) keeps every ratio, its min / median / max and the load average.
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

sys.path.insert(0, str(Path(__file__).parent))  # the sibling benchmark scripts, from any working directory
from cpu_decode import interleaved, ours, prompts, run_record  # noqa: E402

OUT = Path(__file__).parent / "results" / "dflash2_vs_dflash.json"


def spread(values: list[float]) -> dict:
    return {"values": values, "min": min(values), "median": statistics.median(values), "max": max(values)}


def held_out_tau(pipelines: dict, requests: list) -> dict:
    """-> per method: pooled tau over the held-out prompts; and whether the outputs are identical."""
    from trtllm_dflash.bench.compare import run_one_by_one
    from trtllm_dflash.engine.request import pooled_tau

    results = {name: run_one_by_one(p.generator, requests) for name, p in pipelines.items()}
    same = all(a.output_ids == b.output_ids for a, b in zip(results["dflash"], results["dflash2"]))
    return {**{name: pooled_tau(r) for name, r in results.items()}, "identical_outputs": same}


def speed(pipelines: dict, prompt_ids: list, new_tokens: int, repeats: int) -> dict:
    from trtllm_dflash.engine.request import pooled_tau

    v1, v2 = (lambda g=pipelines[m].generator: ours(g, prompt_ids, new_tokens, 1) for m in ("dflash", "dflash2"))
    a, b = interleaved(v2, v1, repeats)  # a: DFlash2 runs, b: DFlash runs
    rate = lambda run: sum(len(ids) for ids in run[1]) / run[0]  # noqa: E731  output tokens/s
    steps = lambda run: (sum(len(r.acceptance_lengths) for r in run[2])  # noqa: E731  verify steps / decode s
                         / sum(r.finish_s - r.first_token_s for r in run[2]))
    taus = [(pooled_tau(x[2]), pooled_tau(y[2])) for x, y in zip(a, b)]
    return {"tokens_per_s": spread([rate(x) / rate(y) for x, y in zip(a, b)]),
            "at_same_tau": spread([steps(x) / steps(y) for x, y in zip(a, b)]),
            "dflash2_tokens_per_s": spread([rate(x) for x in a]), "dflash_tokens_per_s": spread([rate(y) for y in b]),
            "dflash2_tau": taus[0][0], "dflash_tau": taus[0][1],
            "identical_outputs": all(x[1] == y[1] for x, y in zip(a, b))}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=32, help="held-out prompts for tau")
    p.add_argument("--speed-prompts", type=int, default=6, help="prompts per speed run")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    from trtllm_dflash.engine.pipeline import load_pipeline
    from trtllm_dflash.engine.request import Request

    from trtllm_dflash.pairs import stdlib_pair

    load_before = os.getloadavg()
    torch.set_num_threads(args.threads)
    pipelines = {m: load_pipeline(*stdlib_pair(m)) for m in ("dflash", "dflash2")}
    started = time.time()
    tokenizer = pipelines["dflash"].tokenizer
    requests = [Request(ids, args.max_new_tokens) for ids in prompts(tokenizer, args.prompts)]
    tau = held_out_tau(pipelines, requests)
    fast = speed(pipelines, prompts(tokenizer, args.speed_prompts), args.max_new_tokens, args.repeats)
    goals = {"tau": {"goal": "dflash2 >= dflash", "met": tau["dflash2"] >= tau["dflash"]},
             "at_same_tau": {"goal": ">= 0.9", "met": fast["at_same_tau"]["median"] >= 0.9}}
    record = {**run_record(args, started, load_before), "pair": {m: str(stdlib_pair(m)[1]) for m in pipelines},
              "held_out_tau": tau, "speed_dflash2_over_dflash": fast, "goals": goals}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"held-out tau: DFlash {tau['dflash']:.3f}, DFlash2 {tau['dflash2']:.3f} "
          f"(outputs identical: {tau['identical_outputs']})")
    for name in ("tokens_per_s", "at_same_tau"):
        s = fast[name]
        print(f"DFlash2 / DFlash {name}: median {s['median']:.3f} (min {s['min']:.3f}, max {s['max']:.3f})")
    print(f"goals: {goals}\nwritten: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
