"""DFlash against plain decoding on the built-in pair, on the CPU, at batch 1.

Writes benchmarks/results/cpu_dflash_vs_plain.json (every setting, the machine, the numbers) and
prints a short table last. Run: python benchmarks/cpu_dflash_vs_plain.py [--prompts 16] [--max-new-tokens 128]
No assertion is made here: the numbers are recorded, not tested.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from trtllm_dflash import __version__
from trtllm_dflash.builtin import builtin_pair, held_out_prompts
from trtllm_dflash.compare import compare
from trtllm_dflash.pipeline import load_pipeline
from trtllm_dflash.request import Request

OUT = Path(__file__).parent / "results" / "cpu_dflash_vs_plain.json"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--block-sizes", default="8,4")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, drafter = builtin_pair()
    spec, plain = load_pipeline(target, drafter), load_pipeline(target)
    requests = [Request(tuple(x), args.max_new_tokens, ignore_eos=True) for x in held_out_prompts(args.prompts)]
    runs = {}
    for block in map(int, args.block_sizes.split(",")):
        runs[f"block_{block}"] = compare(spec.generator, plain.generator, requests, block)
    record = {
        "command": "python " + " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": args.threads,
                    "torch": torch.__version__, "python": platform.python_version()},
        "trtllm_dflash": __version__, "pair": str(target.parent),
        "settings": {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "greedy": True, "batch": 1},
        "results": {name: c.to_dict() for name, c in runs.items()},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    for name, c in runs.items():
        print(f"\n[{name}]\n{c.table()}")
    print(f"\nwritten: {OUT}")


if __name__ == "__main__":
    main()
