"""dflash-demo: the README's main job on the built-in pair (DFlash against plain decoding)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..builtin import builtin_pair, held_out_prompts
from ..compare import compare
from ..pipeline import load_pipeline
from ..request import Request
from .common import run_cli

PROG = "dflash-demo"
NOT_YET = ("dflash-bench (interactivity/throughput sweeps) and dflash-train are not part of this release yet; "
           "dflash-build and dflash-serve are (see the README)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Generate with the built-in pair: DFlash against plain decoding.")
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts, one at a time (batch 1)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    return p


def run(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    t0 = time.perf_counter()
    target, drafter = builtin_pair()
    print(f"built-in pair: {target.parent} (ready in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    spec, plain = load_pipeline(target, drafter), load_pipeline(target)
    requests = [Request(tuple(p), args.max_new_tokens, ignore_eos=True) for p in held_out_prompts(args.prompts)]
    result = compare(spec.generator, plain.generator, requests)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(f"{args.prompts} held-out prompts, {args.max_new_tokens} new tokens each, greedy, batch 1, CPU\n")
        print(result.table())
        sample = spec.tokenizer.decode(requests[0].prompt_ids)
        print(f"\nfirst prompt {sample!r}; the built-in target is random, so its text is not meant to read.")
        print(f"not yet: {NOT_YET}.", file=sys.stderr)
    return 0 if result.identical_outputs else 1


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
