"""Offline closed loop: DFlash (--draft-len auto) with and without the newcomer probes' back-off, over plain decoding.

    python benchmarks/newcomer_backoff.py [--repeats 5] [--threads 2] [--points short:1,short:4,1024:1,1024:4]

The served benchmark's workload without the server (benchmarks/serve_dflash_vs_plain.py: the same held-out
prompts, snippets and 1024-token windows, 128 new tokens, EOS ignored, `concurrency` requests in flight and 6
per client, taken in the same order), run by three generators of the built-in pair (float32) in one process:
plain decoding, and the cost policy with `newcomer_longest` 1 (every newcomer in a small batch probes: the
policy before the back-off) and 16 (the default: newcomers of a prompt-length bucket whose requests keep
failing probe less often, trtllm_dflash/draft_length/newcomers.py). Each generator runs every point in order,
like one server; the three alternate order per repeat; the policies share one calibration. Output tokens/s
per point, each DFlash case's ratio to plain per repeat, median and range over repeats, and how many requests
of the point never drafted. Writes benchmarks/results/newcomer_backoff.json.
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
from serve_dflash_vs_plain import NEW_TOKENS, prompt_sets  # noqa: E402

OUT = Path(__file__).parent / "results" / "newcomer_backoff.json"
REQUESTS_PER_CLIENT = 6
CASES = {"plain": None, "every newcomer probes": 1, "back-off (default)": 16}  # name -> newcomer_longest


def closed_loop(generator, prompts: list[list[int]], concurrency: int,
                outputs: list | None = None) -> tuple[float, int]:
    """`concurrency` requests in flight until REQUESTS_PER_CLIENT x concurrency have run, each admitted as soon as
    it has a slot; -> (output tokens/s, requests that never drafted). Prompts in the served benchmark's order (its
    clients pop from the end). outputs: gets each request's output ids, in admission order (the same order in
    every generator)."""
    return gated_loop(generator, prompts, concurrency, [] if outputs is None else outputs, None)


def gated_loop(generator, prompts: list[list[int]], concurrency: int, outputs: list, gate,
               clock=time.perf_counter, on_admit=None) -> tuple[float, int]:
    """`closed_loop` with the serving loop's admission gate (serve/admission.py) between steps: each client's next
    request (prompts in closed_loop's order) arrives when its last one ends and is admitted when `gate` says (at
    once where gate is None). clock:
    seconds (a benchmark's priced clock: `on_admit(n)` is told each admission's size). -> (output tokens/s on
    `clock`, requests that never drafted)."""
    from trtllm_dflash.request import Request

    todo, waiting, done, running = list(range(REQUESTS_PER_CLIENT * concurrency))[::-1], [], [], generator.slots.running
    start = clock()
    while todo or waiting or running:
        now = clock()
        while todo and len(waiting) + len(running) < concurrency:
            waiting.append((todo.pop(0), now))
            if gate is not None:
                gate.arrived(now)
        batch = waiting[: len(generator.slots.free())]
        if batch and (gate is None or gate.ready(len(running), [now - t for _, t in batch])):
            done += generator.admit([Request(prompts[i % len(prompts)], NEW_TOKENS, ignore_eos=True)
                                     for i, _ in batch])
            if on_admit is not None:
                on_admit(len(batch))
            del waiting[: len(batch)]
        if running:
            generator.step()
    outputs.extend(list(s.result.output_ids) for s in done)
    tokens = sum(len(s.result.output_ids) for s in done)
    return tokens / (clock() - start), sum(not any(s.result.draft_lengths) for s in done)


def serve_one_at_a_time(generator, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> None:
    from trtllm_dflash.request import Request

    for prompt in prompts:
        generator.admit([Request(prompt, new_tokens, ignore_eos=True)])
        while generator.slots.running:
            generator.step()


def served_warm_up(generator, prompts: dict, per_context: int) -> None:
    """What serve_dflash_vs_plain.py's `warm_up` serves: one 8-token request, then the last `per_context` prompts
    of each context, one at a time."""
    serve_one_at_a_time(generator, [next(iter(prompts.values()))[0]], 8)
    for context in prompts:
        serve_one_at_a_time(generator, prompts[context][len(prompts[context]) - per_context:] if per_context else [])


def one_server(generator, policy, prompts: dict, points: list[tuple[str, int]], warmup: int | None = None) -> dict:
    """Every point in order on freshly allocated caches and a fresh policy, like one server's run; warmup: first
    the served benchmark's warm-up with `--warmup warmup` (None: none at all)."""
    if policy is not None:
        generator.policy = policy
    generator.allocate(max(c for _, c in points), capacity(generator), generator.block)
    if warmup is not None:
        served_warm_up(generator, prompts, warmup)
    return {f"{context}:{c}": closed_loop(generator, prompts[context], c) for context, c in points}


def ratio_table(runs: dict, points: list[tuple[str, int]]) -> list[dict]:
    """runs: case -> per repeat {point: (tok/s, never drafted)}, "plain" first -> per point each other case's
    ratio to plain per repeat (median, min, max) and its requests that never drafted."""
    table = []
    for context, c in points:
        key = f"{context}:{c}"
        row = {"context": context, "concurrency": c,
               "plain_tok_s_median": statistics.median(run[key][0] for run in runs["plain"])}
        for name in list(runs)[1:]:
            ratios = [run[key][0] / base[key][0] for run, base in zip(runs[name], runs["plain"])]
            row[name] = {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                         "ratio_max": max(ratios), "ratios": ratios,
                         "never_drafted": [run[key][1] for run in runs[name]]}
        table.append(row)
    return table


def print_ratio_table(table: list[dict], names: list[str]) -> None:
    print("context conc  plain tok/s  " + "  ".join(f"{n:>22}" for n in names)
          + "   [median (min-max), never drafted]")
    for row in table:
        cells = [f"{row[n]['ratio_median']:.3f} ({row[n]['ratio_min']:.2f}-{row[n]['ratio_max']:.2f}) "
                 f"{statistics.median(row[n]['never_drafted']):.0f}" for n in names]
        print(f"{row['context']:>7} {row['concurrency']:4} {row['plain_tok_s_median']:11.1f}  "
              + "  ".join(f"{cell:>22}" for cell in cells))


def record_runs(runs: dict) -> dict:
    return {name: [{k: {"tok_s": v[0], "never_drafted": v[1]} for k, v in run.items()} for run in rs]
            for name, rs in runs.items()}


def parse_points(text: str) -> list[tuple[str, int]]:
    """"short:1,1024:4" -> [("short", 1), ("1024", 4)]."""
    return [(spec.split(":")[0], int(spec.split(":")[1])) for spec in text.split(",")]


def interleaved_runs(names: list[str], repeats: int, run_case) -> dict:
    """-> case -> per repeat `run_case(name)`'s {point: (tok/s, never drafted)}, the cases in alternating order per
    repeat; each repeat's ratios to the first case (plain) printed as they come."""
    runs = {name: [] for name in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            runs[name].append(run_case(name))
        print(f"repeat {r}: " + "; ".join(f"{n} " + " ".join(f"{runs[n][-1][k][0] / runs[names[0]][-1][k][0]:.3f}"
                                                             for k in runs[n][-1]) for n in names[1:]),
              file=sys.stderr, flush=True)
    return runs


def write_results(args, started: float, load_before, runs: dict, points: list[tuple[str, int]], extra: dict) -> None:
    """The ratio table and every run to args.output (with `run_record` and `extra`), and the table printed."""
    table = ratio_table(runs, points)
    record = run_record(args, started, load_before) | extra | {"table": table, "runs": record_runs(runs)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print_ratio_table(table, list(runs)[1:])
    print(f"written: {args.output}")


def offline_pairs(threads: int, slots: int, device: str = "cpu", step_mode: str | None = None):
    """-> (DFlash pipeline, plain pipeline, the served benchmark's prompts as token ids per context, a cost policy
    calibrated on the DFlash generator, which it is set on, allocated for `slots` requests up to 1024 tokens).
    step_mode None: the device's default (cuda-graphs on a GPU)."""
    import torch

    from trtllm_dflash.draft_length.calibrate import calibrator
    from trtllm_dflash.draft_length.policy import CostBasedDraftLen
    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.pipeline import load_pipeline

    torch.set_num_threads(threads)
    target, drafter = stdlib_pair()
    spec = load_pipeline(target, drafter, device=device, step_mode=step_mode)
    plain = load_pipeline(target, device=device, step_mode=step_mode)
    tokenizer = spec.tokenizer
    prompts = {name: [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
               for name, texts in prompt_sets(tokenizer, quick=False).items()}
    calibrated = CostBasedDraftLen(calibrator=calibrator(None))
    spec.generator.policy = calibrated
    spec.generator.allocate(slots, capacity(spec.generator), spec.generator.block)
    return spec, plain, prompts, calibrated


def capacity(generator) -> int:
    """Positions per slot for the served workload: a 1024-token window, its new tokens and a block's margin."""
    return 1024 + NEW_TOKENS + 2 * generator.block + 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--points", default="short:1,short:4,1024:1,1024:4", help="context:concurrency, run in order")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    points = parse_points(args.points)
    load_before, started = os.getloadavg(), time.time()
    from trtllm_dflash.draft_length.policy import CostBasedDraftLen, ProbeSettings

    spec, plain, prompts, calibrated = offline_pairs(args.threads, max(c for _, c in points))

    def run_case(name: str) -> dict:
        longest = CASES[name]
        policy = None if longest is None else CostBasedDraftLen(calibrated.cost,
                                                                probe=ProbeSettings(newcomer_longest=longest))
        return one_server(plain.generator if longest is None else spec.generator, policy, prompts, points)

    runs = interleaved_runs(list(CASES), args.repeats, run_case)
    write_results(args, started, load_before, runs, points,
                  {"requests_per_client": REQUESTS_PER_CLIENT, "new_tokens": NEW_TOKENS})


if __name__ == "__main__":
    main()
