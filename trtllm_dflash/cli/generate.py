"""dflash-generate: one generation with a target and, optionally, its DFlash drafter."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import DFlashError
from ..loading import DTYPES, parse_dtype
from ..pipeline import Pipeline, load_pipeline
from ..request import Request
from ..sampling import SamplingParams
from .common import model_path, run_cli

PROG = "dflash-generate"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Generate with a target model, speculatively with a DFlash drafter.")
    p.add_argument("--target", required=True, help="target model directory, hub id, or 'builtin'")
    p.add_argument("--drafter", help="DFlash drafter directory, hub id, or 'builtin'; omit for plain decoding")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (needs the target's tokenizer)")
    prompt.add_argument("--prompt-ids", help="prompt token ids, comma-separated: 5,6,7")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--seed", type=int)
    p.add_argument("--block-size", type=int, help="tokens per draft block (default: the drafter's trained size)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at stop tokens")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return p


def prompt_ids(args, pipeline: Pipeline) -> tuple[int, ...]:
    if args.prompt_ids is not None:
        try:
            return tuple(int(x) for x in args.prompt_ids.split(",") if x.strip())
        except ValueError:
            raise DFlashError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}") from None
    if pipeline.tokenizer is None:
        raise DFlashError(f"the target in {pipeline.target.path} has no tokenizer: use --prompt-ids")
    return tuple(pipeline.tokenizer.encode(args.prompt, add_special_tokens=False))


def run(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    pipeline = load_pipeline(model_path(args.target, "target"), model_path(args.drafter, "drafter"),
                             parse_dtype(args.dtype), args.device)
    request = Request(prompt_ids(args, pipeline), args.max_new_tokens, sampling, ignore_eos=args.ignore_eos)
    result = pipeline.generator.generate([request], args.block_size)[0]
    out = result.summary()
    if pipeline.tokenizer is not None:
        out["text"] = pipeline.tokenizer.decode(result.output_ids)
    if args.json:
        print(json.dumps(out))
    else:
        print(out.get("text", " ".join(map(str, result.output_ids))))
        print(f"[{len(result.output_ids)} tokens, tau {result.tau:.2f}, {result.tokens_per_s:.1f} tok/s, "
              f"TTFT {result.ttft_s * 1e3:.1f} ms, TPOT {result.tpot_s * 1e3:.2f} ms, {result.finish_reason}]",
              file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
