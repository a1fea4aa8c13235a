"""How many greedy continuations change with the batch a request shares, in float32 and bfloat16.

The built-in pair, 16 held-out prompts, 128 new tokens, greedy, EOS ignored. For each dtype, plain decoding and
DFlash (draft length 15), each request alone and all 16 at once; each output is compared with two references of
the same dtype: transformers' greedy decoding of the prompt alone (an independent oracle) and this runtime's plain
decoding alone. Reported: prompts (of 16) that differ, and the first position where each differs.

    python benchmarks/batch_exactness.py --output benchmarks/results/batch_exactness_cpu.json   # about 3 minutes
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

NEW_TOKENS = 128
PROMPTS = 16
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def transformers_greedy(target: Path, dtype, prompts) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).eval()
    out = []
    with torch.inference_mode():
        for ids in prompts:
            full = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  do_sample=False)
            out.append(full[0, len(ids):].tolist())
    return out


def runtime_outputs(pair, dtype, prompts) -> dict[str, list[list[int]]]:
    from trtllm_dflash.engine.pipeline import load_pipeline
    from trtllm_dflash.engine.request import Request

    from trtllm_dflash.draft_length.policy import FixedDraftLen

    out = {}
    for decoding, drafter in (("plain", None), ("dflash_15", pair[1])):
        generator = load_pipeline(pair[0], drafter, dtype=dtype, step_mode="eager").generator
        generator.policy = FixedDraftLen(0 if drafter is None else 15)
        reqs = [Request(tuple(p), NEW_TOKENS, ignore_eos=True) for p in prompts]
        out[f"{decoding} alone"] = [generator.generate([r])[0].output_ids for r in reqs]
        out[f"{decoding} 16 at once"] = [r.output_ids for r in generator.generate(reqs)]
    return out


def compare(outputs, reference) -> dict:
    firsts = [first_difference(o, r) for o, r in zip(outputs, reference)]
    return {"differ": sum(f is not None for f in firsts), "of": len(firsts),
            "first_difference_at": [f for f in firsts if f is not None]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--output", help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from trtllm_dflash.engine.calibrate import device_name
    from trtllm_dflash.engine.pipeline import load_pipeline

    from trtllm_dflash.pairs import held_out_texts, stdlib_pair

    pair = stdlib_pair()
    tokenizer = load_pipeline(pair[0]).tokenizer
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in held_out_texts(PROMPTS)]
    report = {"command": "python benchmarks/batch_exactness.py " + " ".join(argv or sys.argv[1:]),
              "device": device_name(torch.device("cpu")), "threads": args.threads, "new_tokens": NEW_TOKENS, "dtypes": {}}
    for name, dtype in DTYPES.items():
        hf = transformers_greedy(pair[0], dtype, prompts)
        runs = runtime_outputs(pair, dtype, prompts)
        report["dtypes"][name] = {how: {"vs_transformers": compare(o, hf), "vs_plain_alone": compare(o, runs["plain alone"])}
                                  for how, o in runs.items()}
        for how, row in report["dtypes"][name].items():
            print(f"{name:8} {how:22} differ from transformers {row['vs_transformers']['differ']:2}/{PROMPTS}, "
                  f"from plain alone {row['vs_plain_alone']['differ']:2}/{PROMPTS}", file=sys.stderr)
    text = json.dumps(report, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
