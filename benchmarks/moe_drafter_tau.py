"""A DFlash drafter trained with dflash-train against a tiny MoE target: held-out acceptance (tau).

    python benchmarks/moe_drafter_tau.py --out /tmp/moe-pair [--family gpt_oss] [--target-steps 300]
        [--drafter-steps 400] [--threads 1]

1. Target: a tiny transformers MoE model of `--family` (gpt-oss: experts with the clamped SwiGLU,
   attention sinks, sliding-window layers shorter than the prompts, YaRN; or Qwen3-MoE), shape below,
   pre-trained on the training files of this Python's stdlib with the shipped pair's BPE tokenizer
   (trtllm_dflash/train/target_lm.py, the built-in pair's recipe, fewer steps), seed 0.
2. Drafter: `dflash-train` against that target (2 layers, block 8, prompts cut from training files).
3. tau on held-out stdlib files (never seen by the tokenizer, the target or the drafter), greedy,
   block 8, one request at a time, for the trained drafter and an untrained one of the same shape,
   with a token-for-token check against plain decoding.
Writes benchmarks/results/moe_drafter_tau.json (and <out>/recipe.json); nothing is asserted.
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

from trtllm_dflash import __version__
from trtllm_dflash.compare import compare, run_one_by_one
from trtllm_dflash.generator import Generator
from trtllm_dflash.models.drafter import DFlashDrafter
from trtllm_dflash.pairs import held_out_texts, stdlib_pair
from trtllm_dflash.pipeline import load_pipeline
from trtllm_dflash.request import Request, pooled_tau
from trtllm_dflash.speculative import DFlashProposer
from trtllm_dflash.train.corpus import split, stdlib_sources
from trtllm_dflash.train.data import stdlib_prompts
from trtllm_dflash.train.target_lm import PretrainConfig, TargetShape, pretrain, save_target, token_stream

OUT = Path(__file__).parent / "results" / "moe_drafter_tau.json"
COMMON = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True)
FAMILIES = {
    "gpt_oss": dict(intermediate_size=128, num_local_experts=8, num_experts_per_tok=2, sliding_window=32,
                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": False, "original_max_position_embeddings": 256,
                                     "rope_theta": 10000.0}),
    "qwen3_moe": dict(intermediate_size=256, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
                      norm_topk_prob=True, rope_theta=10000.0),
}
PROMPTS = 512
BLOCK = 8


def make_target(out: Path, family: str, steps: int) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(stdlib_pair()[0])
    eos = tokenizer.eos_token_id
    cfg = AutoConfig.for_model(family, vocab_size=len(tokenizer), eos_token_id=eos, bos_token_id=eos, pad_token_id=eos,
                               **COMMON, **FAMILIES[family])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    stream = token_stream(split(stdlib_sources())[0], tokenizer)
    pre = PretrainConfig(seq_len=128, batch=8, steps=steps, lr=3e-3, warmup=10, seed=0)
    model, losses = pretrain(stream, TargetShape(), pre, eos, model=model)
    save_target(model, tokenizer, out / "target")
    return {"family": family, "shape": {**COMMON, **FAMILIES[family], "vocab_size": len(tokenizer)},
            "pretrain": pre.__dict__, "final_loss_mean_last_20": sum(losses[-20:]) / 20}


def make_drafter(out: Path, steps: int, threads: int) -> str:
    with (out / "prompts.jsonl").open("w") as f:
        for prompt in stdlib_prompts(PROMPTS, 0):
            f.write(json.dumps({"prompt": prompt}) + "\n")
    cmd = ["dflash-train", "--target", str(out / "target"), "--output", str(out / "drafter"),
           "--data", str(out / "prompts.jsonl"), "--num-layers", "2", "--block-size", str(BLOCK),
           "--max-new-tokens", "64", "--max-prompt-tokens", "128", "--steps", str(steps), "--batch-tokens", "1024",
           "--lr", "2e-3", "--seed", "0", "--eval-every", str(max(steps // 2, 1)), "--quiet"]
    exe = shutil.which("dflash-train") or str(Path(sys.executable).with_name("dflash-train"))
    print("$ " + shlex.join(cmd), flush=True)
    subprocess.run([exe, *cmd[1:]], check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return shlex.join(cmd)


def evaluate(out: Path, prompts: int) -> dict:
    spec, plain = load_pipeline(out / "target", out / "drafter"), load_pipeline(out / "target")
    tok = spec.tokenizer
    requests = [Request(tuple(tok(t, add_special_tokens=False)["input_ids"]), 64) for t in held_out_texts(prompts)]
    trained = compare(spec.generator, plain.generator, requests, BLOCK)
    torch.manual_seed(0)
    untrained = DFlashDrafter(spec.drafter.config).eval()
    gen = Generator(spec.target.model, DFlashProposer(untrained, spec.target.model), spec.target.stop_ids)
    print(trained.table())
    return {"trained": trained.to_dict(), "untrained_tau": pooled_tau(run_one_by_one(gen, requests, BLOCK)),
            "prompts": prompts, "max_new_tokens": 64, "block_size": BLOCK}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--family", choices=sorted(FAMILIES), default="gpt_oss")
    p.add_argument("--target-steps", type=int, default=300)
    p.add_argument("--drafter-steps", type=int, default=400)
    p.add_argument("--eval-prompts", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    target = make_target(args.out, args.family, args.target_steps)
    t1 = time.time()
    command = make_drafter(args.out, args.drafter_steps, args.threads)
    t2 = time.time()
    result = evaluate(args.out, args.eval_prompts)
    print(f"held-out tau at block {BLOCK}: trained {result['trained']['dflash']['tau']:.2f}, "
          f"untrained {result['untrained_tau']:.2f}")
    record = {
        "command": "python " + " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": args.threads,
                    "torch": torch.__version__, "python": platform.python_version()},
        "trtllm_dflash": __version__, "target": target, "drafter_command": command,
        "seconds": {"target": t1 - t0, "drafter": t2 - t1, "evaluation": time.time() - t2},
        "held_out": result,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "recipe.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {OUT}")


if __name__ == "__main__":
    main()
