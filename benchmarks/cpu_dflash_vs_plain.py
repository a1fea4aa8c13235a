"""The built-in pair on the CPU at batch 1: held-out acceptance (trained vs untrained drafter) and speed.

    python benchmarks/cpu_dflash_vs_plain.py [--prompts 24] [--max-new-tokens 128] [--block-sizes 16,8]

Prompts are snippets of stdlib files held out from every stage of training (trtllm_dflash/pairs).
Greedy. tau = tokens per verify step pooled over all steps (the target's bonus token included).
The untrained drafter has the trained one's exact shape, randomly initialised (seed 0): it shows
what the acceptance owes to training. Speed: each request alone (batch 1), DFlash then plain, one
warm-up request each; outputs are checked identical. Writes benchmarks/results/cpu_dflash_vs_plain.json;
nothing is asserted: the numbers are recorded.
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
from trtllm_dflash.engine.generator import Generator
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request, pooled_tau

from trtllm_dflash import __version__
from trtllm_dflash.bench.compare import compare, run_one_by_one
from trtllm_dflash.models.drafter import DFlashDrafter
from trtllm_dflash.pairs import held_out_texts, stdlib_pair
from trtllm_dflash.speculative import DFlashProposer

OUT = Path(__file__).parent / "results" / "cpu_dflash_vs_plain.json"


def untrained_tau(spec, requests, block: int) -> float:
    torch.manual_seed(0)
    drafter = DFlashDrafter(spec.drafter.config).eval()
    gen = Generator(spec.target.model, DFlashProposer(drafter, spec.target.model), spec.target.stop_ids)
    return pooled_tau(run_one_by_one(gen, requests, block))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--block-sizes", default="16,8")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, drafter = stdlib_pair()
    spec, plain = load_pipeline(target, drafter), load_pipeline(target)
    tok = spec.tokenizer
    requests = [Request(tuple(tok(t, add_special_tokens=False)["input_ids"]), args.max_new_tokens)
                for t in held_out_texts(args.prompts)]
    runs = {}
    for block in map(int, args.block_sizes.split(",")):
        c = compare(spec.generator, plain.generator, requests, block)
        runs[f"block_{block}"] = {**c.to_dict(), "untrained_tau": untrained_tau(spec, requests, block)}
        print(f"\n[block {block}]\n{c.table()}\nuntrained drafter tau {runs[f'block_{block}']['untrained_tau']:.2f}")
    record = {
        "command": "python " + " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": args.threads,
                    "torch": torch.__version__, "python": platform.python_version()},
        "trtllm_dflash": __version__, "pair": "trtllm_dflash/pairs/stdlib",
        "settings": {"prompts": args.prompts, "prompt_source": "held-out stdlib files (pairs.held_out_texts)",
                     "max_new_tokens": args.max_new_tokens, "stops_at_eos": True, "greedy": True, "batch": 1},
        "results": runs,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwritten: {OUT}")


if __name__ == "__main__":
    main()
