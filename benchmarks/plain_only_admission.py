"""Offline: a DFlash engine decoding plainly, with and without the drafter's context, against plain decoding.

    python benchmarks/plain_only_admission.py [--repeats 5] [--threads 2]

The built-in pair (float32), 4 requests of 1024-token held-out windows, 128 new tokens, every step plain
(draft length 0). Three generators, interleaved per repeat: the target alone (plain decoding); the DFlash
engine admitting the requests with the drafter's context (its prompt context K/V computed at prefill, each
plain step's deferred); and the DFlash engine admitting them plain-only (no drafter work). Prefill and
decode wall seconds per repeat, and their medians over repeats as ratios to plain decoding.
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
BATCH, CONTEXT, NEW = 4, 1024, 128


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import torch

    from trtllm_dflash.pairs import held_out_texts, stdlib_pair
    from trtllm_dflash.pipeline import load_pipeline

    torch.set_num_threads(args.threads)
    target, drafter = stdlib_pair()
    spec, plain = load_pipeline(target, drafter), load_pipeline(target)
    ids = spec.tokenizer("\n".join(held_out_texts(40)), add_special_tokens=False)["input_ids"]
    prompts = [tuple(ids[i * 300: i * 300 + CONTEXT]) for i in range(BATCH)]
    if any(len(q) < CONTEXT for q in prompts):
        raise SystemExit("held-out text too short for 4 x 1024-token windows")
    cases = {"plain decoding": (plain.generator, None), "dflash, drafter context kept": (spec.generator, True),
             "dflash, plain-only admission": (spec.generator, False)}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    run(spec.generator, prompts[:1], True)  # first-call costs out of the samples
    for r in range(args.repeats):
        order = list(cases) if r % 2 == 0 else list(cases)[::-1]
        for name in order:
            generator, drafting = cases[name]
            samples[name].append(run(generator, prompts, drafting))
    base = {k: statistics.median(s[i] for s in samples["plain decoding"]) for i, k in enumerate(("prefill", "decode"))}
    rows = []
    for name, s in samples.items():
        pre, dec = statistics.median(x for x, _ in s), statistics.median(y for _, y in s)
        rows.append({"case": name, "prefill_s": [x for x, _ in s], "decode_s": [y for _, y in s],
                     "prefill_median_s": pre, "decode_median_s": dec, "prefill_vs_plain": pre / base["prefill"],
                     "decode_vs_plain": dec / base["decode"]})
        print(f"{name:30} prefill {pre:.3f} s ({pre / base['prefill']:.2f}x plain)  decode {dec:.3f} s "
              f"({dec / base['decode']:.2f}x plain)", file=sys.stderr)
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "threads": args.threads}, "batch": BATCH, "context": CONTEXT, "new_tokens": NEW,
              "repeats": args.repeats, "rows": rows}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
