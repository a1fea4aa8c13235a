"""What a free slot among running requests costs a decode step, and what moving a request out of the way costs.

    python benchmarks/slot_holes.py [--repeats 9] [--threads 1] [--batch 8] [--context 1024]

The built-in pair's target (float32), `--batch` requests of `--context`-token held-out windows prefilled into
slots 0..batch (one more than the batch), then one plain decode step's target forward (one token per row,
attention over the whole context), timed three ways, interleaved per repeat:
  in place   the running requests hold slots 0..B-1: every layer reads the cache rows as views (what every
             step runs now, the generator moving requests into free slots below them: `Generator.compact`);
  gathered   they hold slots 0..B-2 and B (a free slot among them): every layer gathers the running rows'
             K/V (a copy of their whole caches), what each step ran before requests were moved;
  move       one request's caches (target K/V, drafter context K/V) moved into the free slot: paid once
             per free slot, not per step.
Per repeat the mean of 20 forwards (or 20 moves); the ratios to `in place` per repeat, median and range.
Writes benchmarks/results/slot_holes.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "slot_holes.json"
CALLS = 20


def setup(batch: int, context: int):
    import torch

    from trtllm_dflash.pairs import held_out_texts, stdlib_pair
    from trtllm_dflash.pipeline import load_pipeline
    from trtllm_dflash.request import Request

    pipe = load_pipeline(*stdlib_pair())
    gen = pipe.generator
    text = "\n".join(held_out_texts(64))
    ids = pipe.tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < 2 * context:
        raise SystemExit(f"slot_holes: the held-out text has {len(ids)} tokens, fewer than {2 * context}")
    step = (len(ids) - context) // batch  # windows may overlap: a step's cost does not depend on the tokens
    prompts = [tuple(ids[i * step:i * step + context]) for i in range(batch + 1)]
    gen.allocate(batch + 1, context + 32 + gen.block, gen.block)
    with torch.inference_mode():
        gen.admit([Request(p, 16, ignore_eos=True) for p in prompts])
    return gen, torch


def forward_ms(gen, torch, slots: list[int], context: int) -> float:
    from trtllm_dflash.models.attention import ForwardContext

    n = len(slots)
    index = None if slots == list(range(n)) else torch.tensor(slots)
    tokens = gen.slots.anchors[slots][:, None]
    positions = torch.full((n, 1), context)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(CALLS):
            ctx = ForwardContext.cached(positions, gen.cache, context + 1, slots=index,
                                        capture_layer_ids=gen.proposer.capture_layer_ids)
            gen.target(tokens, ctx)
        return (time.perf_counter() - t0) / CALLS * 1e3


def move_ms(gen, torch, src: int, dst: int, context: int) -> float:
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(CALLS):
            gen.cache.move(src, dst, context + 1)
            gen.proposer.move(src, dst, context + 1)
        return (time.perf_counter() - t0) / CALLS * 1e3


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    gen, torch = setup(args.batch, args.context)
    b = args.batch
    cases = {"in place": lambda: forward_ms(gen, torch, list(range(b)), args.context),
             "gathered": lambda: forward_ms(gen, torch, list(range(b - 1)) + [b], args.context),
             "move": lambda: move_ms(gen, torch, b, b - 1, args.context)}
    samples = {name: [] for name in cases}
    for r in range(args.repeats):
        for name in (list(cases) if r % 2 == 0 else list(cases)[::-1]):
            samples[name].append(cases[name]())
    base = samples["in place"]
    rows = [{"case": name, "ms": spread(ms), "ratio_to_in_place": spread([x / y for x, y in zip(ms, base)]),
             "ms_per_repeat": ms} for name, ms in samples.items()]
    for row in rows:
        print(f"{row['case']:9}  {row['ms']['median']:7.2f} ms  x{row['ratio_to_in_place']['median']:.2f} "
              f"({row['ratio_to_in_place']['min']:.2f}-{row['ratio_to_in_place']['max']:.2f}) of in place")
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "torch": torch.__version__, "threads": args.threads},
              "settings": vars(args), "rows": rows}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
