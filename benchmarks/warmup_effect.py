"""Do a DFlash server's first requests, hard ones included, change how it serves short requests after? Offline.

    python benchmarks/warmup_effect.py [--repeats 7] [--threads 2]

The served benchmark's snippets at concurrency 4 (benchmarks/newcomer_backoff.py's closed loop: 6 requests per
client, 128 new tokens, EOS ignored) on the built-in pair (float32): plain decoding, and the cost policy
(`--draft-len auto`) fresh and after serving what `serve_dflash_vs_plain.py --warmup 4` serves first (the last
4 snippets, then the last 4 1024-token windows, where the drafter fails, one at a time). The three cases
alternate order per repeat in one process; output tokens/s, each DFlash case's ratio to plain per repeat,
median and range. (Where DFlash does not draft it pays nothing: benchmarks/plain_only_admission.py.)
Writes benchmarks/results/warmup_effect.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode import run_record  # noqa: E402
from newcomer_backoff import capacity, closed_loop, offline_pairs, serve_one_at_a_time  # noqa: E402

OUT = Path(__file__).parent / "results" / "warmup_effect.json"
WARMUP = 4  # requests of each context, as the served run's --warmup 4
CASES = ("plain", "dflash fresh", "dflash after the warm-up's requests")


def one_case(name: str, spec, plain, prompts, cost) -> float:
    """-> output tokens/s of the snippets at concurrency 4 on freshly allocated caches (and a fresh policy)."""
    from trtllm_dflash.draft_length.policy import CostBasedDraftLen

    generator = plain.generator if name == "plain" else spec.generator
    if name != "plain":
        generator.policy = CostBasedDraftLen(cost)
    generator.allocate(4, capacity(generator), generator.block)
    if name == CASES[2]:
        for context in ("short", "1024"):
            serve_one_at_a_time(generator, prompts[context][-WARMUP:])
    return closed_loop(generator, prompts["short"], 4)[0]


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    load_before, started = os.getloadavg(), time.time()
    spec, plain, prompts, calibrated = offline_pairs(args.threads, 4)
    rates = {name: [] for name in CASES}
    for r in range(args.repeats):
        for name in CASES if r % 2 == 0 else CASES[::-1]:
            rates[name].append(one_case(name, spec, plain, prompts, calibrated.cost))
        print(f"repeat {r}: " + ", ".join(f"{k} {v[-1]:.0f} tok/s" for k, v in rates.items()), file=sys.stderr)
    record = run_record(args, started, load_before) | {"tok_s": {name: spread(v) for name, v in rates.items()},
                                                       "ratio_to_plain": {name: spread([a / b for a, b in zip(
                                                           rates[name], rates["plain"])]) for name in CASES[1:]}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    for name in CASES:
        ratio = record["ratio_to_plain"].get(name)
        print(f"snippets c=4 {name:36} {record['tok_s'][name]['median']:7.0f} tok/s"
              + (f"  {ratio['median']:.3f} of plain ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else ""))
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
