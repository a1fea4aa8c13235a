"""dflash-generate: one generation with a target and, optionally, its DFlash drafter."""

from __future__ import annotations

import json
import sys

from ..checkpoint.loader import DTYPES, parse_dtype
from ..compilation.step_mode import StepMode
from ..config.runtime import AUTO, STEP_MODES, RuntimeConfig
from ..engine.draft_len import make_policy
from ..engine.pipeline import load_pipeline
from ..engine.request import Request
from ..sample.sampling import SamplingParams
from ..utils.cli import Parser, run_cli
from ..utils.errors import DFlashError
from ..utils.threads import set_threads
from .common import model_path

PROG = "dflash-generate"


def parser() -> Parser:
    p = Parser(prog=PROG, description="Generate with a target model, speculatively with a DFlash drafter.")
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--target", help="target model directory, hub id, or 'builtin'")
    model.add_argument("--engine", help="a torch engine directory from dflash-build (any tensor-parallel size)")
    p.add_argument("--drafter", help="DFlash or DFlash2 drafter directory, hub id, 'builtin' (the built-in pair's "
                   "DFlash drafter) or 'builtin-dflash2' (its DFlash2 drafter); omit for plain decoding")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (needs the target's tokenizer)")
    prompt.add_argument("--prompt-ids", help="prompt token ids, comma-separated: 5,6,7")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--seed", type=int)
    p.add_argument("--block-size", type=int, help="tokens per draft block (default: the drafter's trained size)")
    p.add_argument("--draft-len", default=AUTO, help="draft tokens per step: auto (default: chosen every step "
                   "from the step times and acceptance this run measures), N (fixed), or a draft_len_schedule FILE")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at stop tokens")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default float32 (an engine uses its own dtype)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, help="torch threads per rank (default: the cores this process may use, "
                   "divided among an engine's ranks, at most 8)")
    p.add_argument("--step-mode", choices=(AUTO, *STEP_MODES), default=AUTO,
                   help="how decode steps run: eager, compile (torch.compile) or cuda-graphs (compiled into CUDA "
                   "graphs, padded to batch buckets); auto (default): cuda-graphs on CUDA, eager on a CPU")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return p


def prompt_ids(args, tokenizer, where) -> tuple[int, ...]:
    if args.prompt_ids is not None:
        try:
            return tuple(int(x) for x in args.prompt_ids.split(",") if x.strip())
        except ValueError:
            raise DFlashError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}") from None
    if tokenizer is None:
        raise DFlashError(f"the target in {where} has no tokenizer: use --prompt-ids")
    return tuple(tokenizer.encode(args.prompt, add_special_tokens=False))


def generate_from_checkpoints(args, runtime: RuntimeConfig, sampling: SamplingParams):
    args.threads = set_threads(runtime.threads)
    pipeline = load_pipeline(model_path(args.target, "target"), model_path(args.drafter, "drafter"),
                             parse_dtype(args.dtype or "float32"), args.device, runtime.step_mode)
    request = Request(prompt_ids(args, pipeline.tokenizer, pipeline.target.path), args.max_new_tokens, sampling,
                      ignore_eos=args.ignore_eos)
    generator = pipeline.generator
    generator.configure(runtime, make_policy(runtime.draft_len, generator.block - 1))
    return generator.generate([request], args.block_size)[0], pipeline.tokenizer


def generate_from_engine(args, runtime: RuntimeConfig, sampling: SamplingParams):
    from pathlib import Path

    from ..checkpoint.hf import load_tokenizer
    from ..engine.loader import generate_with_engine, init_from_torchrun, read_torch_manifest

    if args.drafter or args.dtype:
        raise DFlashError("--engine already fixes the drafter and the dtype: drop --drafter/--dtype")
    init_from_torchrun(args.device)
    engine = Path(args.engine)
    manifest = read_torch_manifest(engine)
    args.threads = set_threads(runtime.threads, manifest.tp_size)  # the ranks share this process's cores
    tokenizer = load_tokenizer(engine / manifest.tokenizer) if manifest.tokenizer else None
    request = Request(prompt_ids(args, tokenizer, engine), args.max_new_tokens, sampling, ignore_eos=args.ignore_eos)
    return generate_with_engine(engine, [request], args.block_size, args.device, runtime.draft_len,
                                args.threads, runtime.step_mode)[0], tokenizer


def run(argv: list[str] | None = None) -> int:
    import torch.distributed as dist

    args = parser().parse_args(argv)
    if args.max_new_tokens < 1:  # before anything loads or calibrates
        raise DFlashError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    runtime = RuntimeConfig.from_flags(args)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    run_one = generate_from_engine if args.engine else generate_from_checkpoints
    result, tokenizer = run_one(args, runtime, sampling)
    if dist.is_initialized() and dist.get_rank() != 0:
        return 0  # under torchrun, rank 0 reports
    out = {**result.summary(), "threads": args.threads,
           "step_mode": StepMode.resolve(runtime.step_mode, args.device).mode}
    if tokenizer is not None:
        out["text"] = tokenizer.decode(result.output_ids)
    if args.json:
        print(json.dumps(out))
    else:
        print(out.get("text", " ".join(map(str, result.output_ids))))
        steps = result.draft_lengths
        drafts = f"draft length mean {sum(steps) / len(steps):.1f}, " if steps else ""
        print(f"[{len(result.output_ids)} tokens, tau {result.tau:.2f}, {drafts}{result.tokens_per_s:.1f} tok/s, "
              f"TTFT {result.ttft_s * 1e3:.1f} ms, TPOT {result.tpot_s * 1e3:.2f} ms, {result.finish_reason}]",
              file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
