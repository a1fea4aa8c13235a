"""dflash-train: train a DFlash or DFlash2 drafter for a target (the paper's recipe), in the published format."""

from __future__ import annotations

import argparse
import sys

from ..utils.cli import run_cli
from .common import model_path

PROG = "dflash-train"


def layer_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("no layer index given")
    return ids


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Train a DFlash or DFlash2 drafter against a frozen target.")
    p.add_argument("--target", required=True, help="target model directory, hub id, or 'builtin'")
    p.add_argument("--output", required=True, help="drafter directory to write (config.json, model.safetensors)")
    p.add_argument("--save-format", default="zlab", help="zlab (z-lab's DFlash layout, default) or speculators "
                   "(vllm-project/speculators' layout, which vLLM loads); dflash-convert turns one into the other")
    p.add_argument("--method", default="dflash", help="dflash (default) or dflash2 (grouped dynamic convolutions "
                   "and a candidate selector, as speculators 0.9.0 trains them)")
    p.add_argument("--data", help="prompts JSONL ({'prompt': ...} or {'messages': [...]}); default: stdlib snippets")
    p.add_argument("--num-layers", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--target-layer-ids", type=layer_ids, help="e.g. 1,9,17,25,33 (default: spread like the reference)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int)
    length.add_argument("--epochs", type=float, help="passes over the training sequences (default 6)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--batch-tokens", type=int, default=4096, help="drafter query tokens per step")
    p.add_argument("--anchors", type=int, default=8, help="random blocks per sequence and step")
    p.add_argument("--max-new-tokens", type=int, default=256, help="length of the regenerated responses")
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--eval-prompts", type=int, default=16, help="the data's last N prompts, held out for tau")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--mask-token-id", type=int, help="default: the tokenizer's mask token")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue the run saved in OUTPUT/train_state")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def make_progress(quiet: bool):
    from tqdm import tqdm

    from ..train.trainer import Progress

    bar = {"bar": None}

    def stage(name: str, total: int) -> None:
        if bar["bar"] is not None:
            bar["bar"].close()
        bar["bar"] = tqdm(total=total, desc=name, disable=quiet, file=sys.stderr, dynamic_ncols=True)

    def advance(n: int = 1, **info) -> None:
        bar["bar"].update(n)
        if info:
            bar["bar"].set_postfix({k: f"{v:.3f}" for k, v in info.items()}, refresh=False)

    return Progress(stage, advance, lambda msg: print(msg, file=sys.stderr)), bar


def run(argv: list[str] | None) -> int:
    from ..train.spec import TrainSpec

    args = parser().parse_args(argv)
    spec = TrainSpec(str(model_path(args.target, "target")), args.output, args.data, args.num_layers,
                     args.block_size, args.target_layer_ids, args.steps, args.epochs, args.lr, args.batch_tokens,
                     args.anchors, max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                     eval_prompts=args.eval_prompts, eval_every=args.eval_every, save_every=args.save_every,
                     mask_token_id=args.mask_token_id, device=args.device, seed=args.seed, resume=args.resume,
                     save_format=args.save_format, method=args.method)
    from ..engine.pipeline import check_device
    from ..train.trainer import train

    check_device(spec.device)
    progress, bar = make_progress(args.quiet)
    state = train(spec, progress)
    if bar["bar"] is not None:
        bar["bar"].close()
    last = state.evals[-1] if state.evals else {}
    print(f"drafter written to {args.output}: {state.step} steps, final loss "
          f"{sum(state.losses[-20:]) / max(1, len(state.losses[-20:])):.3f}, held-out tau {last.get('tau', float('nan')):.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
