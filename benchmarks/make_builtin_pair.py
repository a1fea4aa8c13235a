"""Reproduce the shipped built-in pair (trtllm_dflash/pairs/stdlib): tokenizer, target, drafter.

    python benchmarks/make_builtin_pair.py --stage target --out /tmp/pair   # tokenizer + target
    python benchmarks/make_builtin_pair.py --stage drafter --out /tmp/pair  # dflash-train (prints its command)
    python benchmarks/make_builtin_pair.py --stage drafter-dflash2 --out /tmp/pair  # the same, --method dflash2

1. A byte-level BPE tokenizer (2048 tokens, `tokenizers`) on the training files of this Python's
   stdlib sources (trtllm_dflash/train/corpus.py: 1 file in 16 is held out by a path hash).
2. A 6-layer Qwen3 target (transformers' Qwen3ForCausalLM) pre-trained on those files, seed 0.
3. A DFlash drafter trained with `dflash-train` against that target on prompts cut from the
   training files (prompts.jsonl, written here), seed 0.
4. A DFlash2 drafter trained by the same two commands with `--method dflash2` (drafter_dflash2/).
Writes <out>/recipe.json with every setting and the Python version (the corpus is that version's
stdlib). Seeds make each stage deterministic on one machine; BLAS kernels may differ across CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from trtllm_dflash.train.corpus import split, stdlib_sources, train_tokenizer
from trtllm_dflash.train.data import stdlib_prompts
from trtllm_dflash.train.target_lm import PretrainConfig, TargetShape, pretrain, save_target, token_stream

VOCAB = 2048
PRETRAIN = PretrainConfig(seq_len=256, batch=16, steps=500, lr=3e-3, warmup=10, seed=0)
PROMPTS = 1024  # drafter prompts (the last 16 are held out by dflash-train for its periodic tau)


def make_target(out: Path, steps: int) -> None:
    train_files, held_out = split(stdlib_sources())
    tokenizer = train_tokenizer(train_files, VOCAB, out / "target")
    stream = token_stream(train_files, tokenizer)
    print(f"corpus: {len(train_files)} training files ({len(stream)} tokens), {len(held_out)} held out")
    cfg = replace(PRETRAIN, steps=steps)
    model, losses = pretrain(stream, TargetShape(vocab_size=len(tokenizer)), cfg, tokenizer.eos_token_id)
    save_target(model, tokenizer, out / "target")
    write_prompts(out / "prompts.jsonl", seed=0)
    record(out, "target", {"vocab": len(tokenizer), "shape": TargetShape(vocab_size=len(tokenizer)).__dict__,
                           "pretrain": cfg.__dict__, "corpus_tokens": len(stream),
                           "final_loss_mean_last_20": sum(losses[-20:]) / 20})


def write_prompts(path: Path, seed: int) -> None:
    """The drafter's prompts: code snippets of training files (trtllm_dflash/train/data.py)."""
    with path.open("w") as f:
        for prompt in stdlib_prompts(PROMPTS, seed):
            f.write(json.dumps({"prompt": prompt}) + "\n")


DRAFTER_ARGS = ["--num-layers", "2", "--block-size", "16", "--target-layer-ids", "1,3,5", "--max-new-tokens", "128",
                "--steps", "600", "--batch-tokens", "2048", "--lr", "2e-3", "--seed", "0", "--eval-every", "200"]


CONTINUE_TO = 1400  # steps of the second phase (see make_drafter)


def make_drafter(out: Path, threads: int, method: str = "dflash") -> None:
    name = "drafter" if method == "dflash" else "drafter_dflash2"
    cmd = ["dflash-train", "--target", str(out / "target"), "--output", str(out / name),
           "--data", str(out / "prompts.jsonl"), *DRAFTER_ARGS, *(["--method", method] if method != "dflash" else [])]
    # Second phase: --resume with a longer run (a warm restart of the cosine schedule at step 600).
    # The shipped drafter was made this way, in two phases, because the first one was cut to fit the time
    # of the session that made it; both commands together reproduce it exactly.
    steps_at = cmd.index("--steps") + 1
    more = [*cmd[:steps_at], str(CONTINUE_TO), *cmd[steps_at + 1:], "--resume"]
    exe = shutil.which("dflash-train") or str(Path(sys.executable).with_name("dflash-train"))
    start = time.time()
    for command in (cmd, more):
        print("$ " + shlex.join(command), flush=True)
        subprocess.run([exe, *command[1:]], check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    record(out, name, {"commands": [shlex.join(cmd), shlex.join(more)], "wall_s": time.time() - start})


def record(out: Path, stage: str, info: dict) -> None:
    path = out / "recipe.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[stage] = {**info, "python": platform.python_version(), "torch": torch.__version__,
                   "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "script": "python " + " ".join(sys.argv)}
    path.write_text(json.dumps(data, indent=2) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stage", choices=["target", "drafter", "drafter-dflash2"], required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 avoids barrier stalls on busy machines)")
    p.add_argument("--target-steps", type=int, default=PRETRAIN.steps,
                   help="pre-training steps (the shipped target: 500, about 20 minutes on one core)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.stage == "target":
        make_target(args.out, args.target_steps)
    else:
        make_drafter(args.out, args.threads, "dflash2" if args.stage == "drafter-dflash2" else "dflash")


if __name__ == "__main__":
    main()
