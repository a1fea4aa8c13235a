"""Does a DFlash engine pay anything where it does not draft, or after serving hard requests? Offline, interleaved.

    python benchmarks/dflash_plain_floor.py [--repeats 7] [--threads 2]

Two checks on the built-in pair (float32), each with its cases alternating order per repeat in one process:
- floor: 4 requests of 1024 tokens (prefilled together, 128 new tokens, EOS ignored) through plain decoding,
  through the DFlash generator with the requests plain-only (no drafter context: what the cost policy's
  back-off admits at 1024 tokens) and with them keeping the drafter's context, every step plain (k = 0).
  Seconds of the prefill and of the 128 steps.
- warm: the served benchmark's snippets at concurrency 4 (benchmarks/newcomer_backoff.py's closed loop) through
  plain decoding and the cost policy (`--draft-len auto`), fresh, and after serving what
  `serve_dflash_vs_plain.py --warmup 4` serves first (4 snippets, then 4 1024-token windows, one at a time).
  Output tokens/s and the ratio to plain per repeat.
Medians and ranges over repeats. Writes benchmarks/results/dflash_plain_floor.json.
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
from newcomer_backoff import closed_loop  # noqa: E402
from serve_dflash_vs_plain import NEW_TOKENS, prompt_sets  # noqa: E402

OUT = Path(__file__).parent / "results" / "dflash_plain_floor.json"
CAPACITY = 1024 + NEW_TOKENS + 2 * 16 + 1


def decode_plainly(generator, prompts, drafting) -> tuple[float, float]:
    """-> (prefill seconds, seconds of the steps) for the prompts admitted together, every step k = 0."""
    from trtllm_dflash.draft_length.policy import FixedDraftLen
    from trtllm_dflash.request import Request

    generator.allocate(16, CAPACITY, generator.block)
    generator.policy = FixedDraftLen(0)
    t0 = time.perf_counter()
    generator.admit([Request(p, NEW_TOKENS, ignore_eos=True) for p in prompts], drafting=drafting)
    t1 = time.perf_counter()
    while generator.slots.running:
        generator.step()
    return t1 - t0, time.perf_counter() - t1


def serve_one_at_a_time(generator, prompts) -> None:
    from trtllm_dflash.request import Request

    for prompt in prompts:
        generator.admit([Request(prompt, NEW_TOKENS, ignore_eos=True)])
        while generator.slots.running:
            generator.step()


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    load_before, started = os.getloadavg(), time.time()
    import torch

    from trtllm_dflash.draft_length.calibrate import calibrator
    from trtllm_dflash.draft_length.policy import CostBasedDraftLen
    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.pipeline import load_pipeline

    torch.set_num_threads(args.threads)
    target, drafter = stdlib_pair()
    spec, plain = load_pipeline(target, drafter), load_pipeline(target)
    tokenizer = spec.tokenizer
    prompts = {name: [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
               for name, texts in prompt_sets(tokenizer, quick=False).items()}
    floor_cases = {"plain": (plain.generator, None), "dflash plain-only": (spec.generator, False),
                   "dflash keeping context": (spec.generator, True)}
    floor = {name: [] for name in floor_cases}
    for r in range(args.repeats):
        for name in list(floor_cases) if r % 2 == 0 else list(floor_cases)[::-1]:
            generator, drafting = floor_cases[name]
            floor[name].append(decode_plainly(generator, prompts["1024"][:4], drafting))
    calibrated = CostBasedDraftLen(calibrator=calibrator(None))
    spec.generator.policy = calibrated
    spec.generator.allocate(16, CAPACITY, spec.generator.block)
    warm = {"plain": [], "dflash fresh": [], "dflash after the warm-up's requests": []}
    for r in range(args.repeats):
        for name in list(warm) if r % 2 == 0 else list(warm)[::-1]:
            generator = plain.generator if name == "plain" else spec.generator
            if name != "plain":
                generator.policy = CostBasedDraftLen(calibrated.cost)
            generator.allocate(16, CAPACITY, generator.block)
            if name.endswith("requests"):
                for context in ("short", "1024"):
                    serve_one_at_a_time(generator, prompts[context][-4:])
            warm[name].append(closed_loop(generator, prompts["short"], 4)[0])
        print(f"repeat {r}: floor decode s " + ", ".join(f"{k} {v[-1][1]:.3f}" for k, v in floor.items())
              + "; snippets c=4 tok/s " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in warm.items()), file=sys.stderr)
    record = run_record(args, started, load_before) | {
        "floor": {name: {"prefill_s": spread([x[0] for x in v]), "decode_s": spread([x[1] for x in v])}
                  for name, v in floor.items()},
        "warm": {name: {"tok_s": spread(v)} | ({} if name == "plain" else {
            "ratio_to_plain": spread([a / b for a, b in zip(v, warm["plain"])])}) for name, v in warm.items()}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    for name, v in record["floor"].items():
        print(f"floor {name:24} prefill {v['prefill_s']['median'] * 1e3:6.0f} ms  128 steps "
              f"{v['decode_s']['median'] * 1e3:6.0f} ms "
              f"({v['decode_s']['min'] * 1e3:.0f}-{v['decode_s']['max'] * 1e3:.0f})")
    for name, v in record["warm"].items():
        ratio = v.get("ratio_to_plain")
        print(f"snippets c=4 {name:36} {v['tok_s']['median']:7.0f} tok/s"
              + (f"  {ratio['median']:.3f} of plain ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else ""))
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
