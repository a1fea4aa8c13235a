"""Offline: `make demo`'s sweep without the server, DFlash with and without the large-batch rule for requests that
drafted once, over plain decoding.

    python benchmarks/demo_waves.py [--repeats 8] [--threads 2]

`make demo` (trtllm_dflash/cli/demo.py) sweeps concurrency 1, 2, 4, 8, 16 with `dflash-bench sweep`: per point
2 x concurrency warm-up requests, then 16 measured ones, held-out prompts in PromptSource's order (the demo's
dataset shuffled with seed 0), 128 new tokens, a closed loop. At concurrency 16 the measured requests are one
wave arriving together, at 8 two. Here three "servers" run that sweep in one process (each on freshly allocated
caches and a fresh policy, sharing one calibration), their order rotating per repeat:
- plain: plain decoding;
- before: the cost policy where a request with fewer than OWN_PROBES drafting steps always keeps the drafter's
  context (the rule before `CostBasedDraftLen.another_probe`);
- now: the default policy, where in a large batch such a request keeps it only if the next probe comes before
  it ends.
Per point: each DFlash case's output tokens/s over plain per repeat (median, range), now over before, and at
concurrency 8 and 16 the request-steps that kept the drafter's context. Writes benchmarks/results/demo_waves.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode import run_record  # noqa: E402
from newcomer_backoff import capacity, offline_pairs  # noqa: E402

from trtllm_dflash.draft_length.policy import CostBasedDraftLen  # noqa: E402

OUT = Path(__file__).parent / "results" / "demo_waves.json"
CONCURRENCY = (1, 2, 4, 8, 16)  # make demo's default sweep
MEASURED, WARMUP_PER_LOAD, NEW_TOKENS = 16, 2, 128  # dflash-demo --prompts-per-point, bench/spec.py, --osl


class KeptAfterOneProbe(CostBasedDraftLen):
    """The rule before: too few drafting steps of its own always keep a request's drafter context."""

    def another_probe(self, batch) -> list[bool]:
        return [True] * len(batch.slots)


CASES = {"plain": None, "before": KeptAfterOneProbe, "now": CostBasedDraftLen}


def demo_prompts(tokenizer) -> list[list[int]]:
    """The demo's dataset (held_out_texts(256)) in PromptSource's order: shuffled by random.Random(0)."""
    from trtllm_dflash.pairs import held_out_texts

    texts = held_out_texts(256)
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)
    return [tokenizer(texts[i], add_special_tokens=False)["input_ids"] for i in order]


def closed_loop(generator, prompts, first: int, count: int, concurrency: int) -> tuple[float, int, int]:
    """Requests first..first+count-1, `concurrency` in flight, each admitted when a client's last one ends;
    -> (output tokens/s, request-steps that kept the drafter's context, requests that ended plain-only)."""
    from trtllm_dflash.request import Request

    todo, done, running, keeping = list(range(first, first + count)), [], generator.slots.running, 0
    start = time.perf_counter()
    while todo or running:
        n = min(concurrency - len(running), len(todo))
        if n > 0:
            done += generator.admit([Request(prompts[i % len(prompts)], NEW_TOKENS, ignore_eos=True)
                                     for i in todo[:n]])
            del todo[:n]
        keeping += sum(s.drafting for s in generator.step())
    seconds = time.perf_counter() - start
    return sum(len(s.result.output_ids) for s in done) / seconds, keeping, sum(not s.drafting for s in done)


def sweep(generator, prompts, concurrency: tuple[int, ...] = CONCURRENCY) -> dict:
    """One server's sweep on freshly allocated caches: per point its warm-up, then the measured requests."""
    generator.allocate(max(concurrency), capacity(generator), generator.block)
    out, nxt = {}, 0
    for c in concurrency:
        closed_loop(generator, prompts, nxt, WARMUP_PER_LOAD * c, c)
        nxt += WARMUP_PER_LOAD * c
        tokens_per_s, keeping, plain_only = closed_loop(generator, prompts, nxt, MEASURED, c)
        nxt += MEASURED
        out[str(c)] = {"tokens_per_s": tokens_per_s, "keeping_steps": keeping, "ended_plain_only": plain_only}
    return out


def summary(ratios: list[float]) -> dict:
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "ratios": ratios}


def compare(plain: list[dict], before: list[dict], now: list[dict]) -> dict:
    """Each case's points of one kind, per repeat ({"tokens_per_s", "keeping_steps"}) -> both DFlash cases' tokens/s
    over plain and now over before (median, range, per repeat), and their request-steps keeping the drafter's
    context."""
    row = {}
    for name, points in (("before", before), ("now", now)):
        row[f"{name} / plain"] = summary([a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(points, plain)])
        row[f"{name} keeping steps"] = [point["keeping_steps"] for point in points]
    row["now / before"] = summary([a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(now, before)])
    return row


def each_case(cases: dict, r: int, spec, plain, cost):
    """-> (name, generator) in repeat r's order (rotating), each DFlash case's generator given a fresh policy of its
    class on the shared cost model; cases: name -> policy class (None: plain decoding)."""
    for name in list(cases)[r % len(cases):] + list(cases)[:r % len(cases)]:
        generator = plain.generator if cases[name] is None else spec.generator
        if cases[name] is not None:
            generator.policy = cases[name](cost)
        yield name, generator


def rotated_runs(cases: dict, repeats: int, threads: int, concurrency: tuple[int, ...], started: float) -> dict:
    """cases: name -> policy class (None: plain decoding) -> name -> per repeat one sweep's points, the cases'
    order rotating per repeat, the policies sharing one calibration (newcomer_backoff's offline pair)."""
    spec, plain, _, calibrated = offline_pairs(threads, max(concurrency))
    prompts = demo_prompts(spec.tokenizer)
    runs = {name: [] for name in cases}
    for r in range(repeats):
        for name, generator in each_case(cases, r, spec, plain, calibrated.cost):
            runs[name].append(sweep(generator, prompts, concurrency))
        print(f"[{time.time() - started:5.0f} s] repeat {r}: " + json.dumps({n: runs[n][-1] for n in cases}),
              flush=True)
    return runs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    started, load_before = time.time(), os.getloadavg()
    runs = rotated_runs(CASES, args.repeats, args.threads, CONCURRENCY, started)
    table = []
    for c in map(str, CONCURRENCY):
        points = ([run[c] for run in runs[name]] for name in ("plain", "before", "now"))
        row = {"concurrency": int(c)} | compare(*points)
        table.append(row)
        print(f"c={c}: " + ", ".join(f"{k} {row[k]['median']:.3f} ({row[k]['min']:.3f}-{row[k]['max']:.3f})"
                                     for k in ("before / plain", "now / plain", "now / before")))
    record = run_record(args, started, load_before) | {"table": table, "runs": runs}
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
