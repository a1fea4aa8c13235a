"""Offline: a DFlash engine decoding plainly, with and without the drafter's context, against plain decoding.

    python benchmarks/plain_only_admission.py [--repeats 15] [--threads 2] [--batches 1,4] [--context 1024]
                                              [--output FILE]

The built-in pair (float32), 1 or 4 (--batches) requests of 1024-token (--context) held-out windows, 128 new
tokens, every step plain (draft length 0). Three generators, interleaved per repeat: the target alone (plain
decoding); the DFlash engine admitting the requests with the drafter's context (target features captured
at prefill and every step, their context K/V deferred until a drafter pass reads them: here, none does, so
this is what a request that ends before drafting again pays); and the DFlash engine admitting them
plain-only (no drafter work: what a request that dropped its context runs). Prefill and decode wall seconds per repeat; each case's ratio to plain
decoding per repeat (the three ran back to back), median and quartiles over repeats: on this shared
machine single runs differ by 10-20 %, so a few percent needs the paired ratios of many repeats.
Writes benchmarks/results/plain_only_admission.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "plain_only_admission.json"
CONTEXT, NEW = 1024, 128


def run(generator, prompts, drafting) -> tuple[float, float]:
    from trtllm_dflash.draft_length.policy import FixedDraftLen
    from trtllm_dflash.request import Request

    generator.policy = FixedDraftLen(0)
    generator.allocate(len(prompts), CONTEXT + NEW + generator.block + 1, generator.block)
    t0 = time.perf_counter()
    generator.admit([Request(p, NEW, ignore_eos=True) for p in prompts], drafting=drafting)
    t1 = time.perf_counter()
    while generator.slots.running:
        generator.step()
    return t1 - t0, time.perf_counter() - t1


def windows(tokenizer, count: int) -> list[tuple[int, ...]]:
    """`count` CONTEXT-token windows of held-out stdlib text (overlapping, 300 tokens apart)."""
    from trtllm_dflash.pairs import held_out_texts

    ids = tokenizer("\n".join(held_out_texts(40)), add_special_tokens=False)["input_ids"]
    prompts = [tuple(ids[i * 300: i * 300 + CONTEXT]) for i in range(count)]
    if any(len(q) < CONTEXT for q in prompts):
        raise SystemExit(f"held-out text too short for {count} x {CONTEXT}-token windows")
    return prompts


def quartiles(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2]}


def measure(spec, plain, prompts, repeats: int) -> list[dict]:
    cases = {"plain decoding": (plain.generator, None), "dflash, drafter context kept": (spec.generator, True),
             "dflash, plain-only admission": (spec.generator, False)}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for r in range(repeats):
        order = list(cases) if r % 2 == 0 else list(cases)[::-1]
        for name in order:
            generator, drafting = cases[name]
            samples[name].append(run(generator, prompts, drafting))
    base = samples["plain decoding"]
    rows = []
    for name, s in samples.items():
        pre = [x / b[0] for x, b in zip((x for x, _ in s), base)]
        dec = [y / b[1] for y, b in zip((y for _, y in s), base)]
        rows.append({"case": name, "prefill_s": [x for x, _ in s], "decode_s": [y for _, y in s],
                     "prefill_vs_plain": quartiles(pre), "decode_vs_plain": quartiles(dec)})
        print(f"batch {len(prompts)} {name:30} prefill {rows[-1]['prefill_vs_plain']['median']:.3f}x plain, decode "
              f"{rows[-1]['decode_vs_plain']['median']:.3f}x (quartiles {rows[-1]['decode_vs_plain']['q1']:.3f}-"
              f"{rows[-1]['decode_vs_plain']['q3']:.3f})", file=sys.stderr)
    return rows


def main() -> None:
    global CONTEXT
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,4")
    p.add_argument("--context", type=int, default=CONTEXT)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    CONTEXT = args.context
    import torch

    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.pipeline import load_pipeline

    torch.set_num_threads(args.threads)
    target, drafter = stdlib_pair()
    spec, plain = load_pipeline(target, drafter), load_pipeline(target)
    batches = [int(b) for b in args.batches.split(",")]
    prompts = windows(spec.tokenizer, max(batches))
    run(spec.generator, prompts[:1], True)  # first-call costs out of the samples
    results = {f"batch_{b}": measure(spec, plain, prompts[:b], args.repeats) for b in batches}
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "threads": args.threads}, "context": CONTEXT, "new_tokens": NEW,
              "repeats": args.repeats, "results": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
