"""MoE (and Gemma 4, DeepSeek-V4) plain-decoding step cost on the CPU: this runtime against transformers at the
same shapes.

    python benchmarks/moe_step_vs_transformers.py [--threads 1] [--repeats 5] [--batch 8]
        [--families gpt_oss,qwen3_moe,gemma4,gemma4_moe,deepseek_v4,minimax_m2,laguna,deepseek_v3]
        [--output results/....json]

For each family (gpt-oss, Qwen3-MoE, Gemma 4 dense and MoE, DeepSeek-V4, MiniMax-M2, Laguna, DeepSeek-V3) a random transformers model of one fixed shape
(below) is saved and loaded by both sides in float32. One measurement: batch-8 greedy plain decoding of
`--new-tokens` tokens after `--prompt-len`-token prompts (longer than the sliding window), timing
only the decode steps after the prefill:
- this runtime: `Generator.generate` with the autoregressive proposer (a step = one target pass over
  B tokens, KV cache in place, sampling); per-step time = (finish - first token) / (tokens - 1);
- transformers: its forward over the last tokens with `DynamicCache` and argmax, in a Python loop
  (the model step `generate()` runs, without its logits-processor overhead), same step count.
Both produce the same tokens (checked). Repeats are interleaved (ours, theirs, ours, ...) and the
spread min/median/max of the per-step times and of the per-repeat ratio is recorded. Writes
benchmarks/results/moe_step_vs_transformers.json (or --output); nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash import __version__

OUT = Path(__file__).parent / "results" / "moe_step_vs_transformers.json"
COMMON = dict(vocab_size=2048, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
              head_dim=32, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False)
# Gemma 4: sliding (window 64) and full layers with their own head_dim and one K/V head, the last two layers
# sharing K/V, per-layer input embeddings, a final soft-cap; "gemma4_moe" adds experts beside every dense MLP
GEMMA4 = dict(intermediate_size=512, sliding_window=64, layer_types=["sliding_attention", "full_attention"] * 2,
              global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2,
              hidden_size_per_layer_input=16, vocab_size_per_layer_input=2048, final_logit_softcapping=30.0)
# DeepSeek-V4: HCA (an entry per 32 tokens) and CSA (per 4, the indexer keeping 8) layers with a 64-token window,
# one K=V head of 64 (16 rope channels), hash-routed experts in layer 0, four hyper-connection streams
DEEPSEEK_V4 = dict(num_key_value_heads=1, head_dim=64, q_lora_rank=64, partial_rotary_factor=0.25,
                   moe_intermediate_size=256, n_routed_experts=16, num_experts_per_tok=4, sliding_window=64,
                   o_groups=4, o_lora_rank=64, index_n_heads=16, index_head_dim=32, index_topk=8,
                   compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
                   layer_types=["heavily_compressed_attention", "compressed_sparse_attention"] * 2,
                   mlp_layer_types=["hash_moe", "moe", "moe", "moe"])
# MiniMax-M2: full-width QK-norm, half of head_dim rotated, experts in every layer (intermediate_size is an expert's)
MINIMAX_M2 = dict(intermediate_size=256, num_local_experts=16, num_experts_per_tok=4, rotary_dim=16)
# Laguna: per-layer heads, softplus output gates, a 64-token window on two layers, a dense first layer
LAGUNA = dict(intermediate_size=512, num_attention_heads_per_layer=[8, 16, 8, 8],
              layer_types=["full_attention", "sliding_attention"] * 2, sliding_window=64, num_experts=16,
              num_experts_per_tok=4, moe_intermediate_size=256, shared_expert_intermediate_size=256)
# DeepSeek-V3: multi-head latent attention (q and kv low-rank, 16 rope channels), one dense layer, 16 experts in 4
# groups keeping 2, a shared expert (K/V heads as many as query heads, as its eager path needs; head_dim is the
# rope dim, as DeepseekV3Config.__post_init__ sets it)
DEEPSEEK_V3 = dict(num_key_value_heads=8, head_dim=16, intermediate_size=512, moe_intermediate_size=256,
                   n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, kv_lora_rank=64, q_lora_rank=96,
                   qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, first_k_dense_replace=1)
SHAPES = {  # family -> (model_type, shape beside COMMON)
    "gpt_oss": ("gpt_oss", dict(intermediate_size=256, num_local_experts=16, num_experts_per_tok=4, sliding_window=64)),
    "qwen3_moe": ("qwen3_moe", dict(intermediate_size=512, moe_intermediate_size=256, num_experts=16,
                                    num_experts_per_tok=4, norm_topk_prob=True, rope_theta=10000.0)),
    "gemma4": ("gemma4_text", GEMMA4),
    "gemma4_moe": ("gemma4_text", dict(GEMMA4, enable_moe_block=True, num_experts=16, top_k_experts=4,
                                       moe_intermediate_size=256)),
    "deepseek_v4": ("deepseek_v4", DEEPSEEK_V4),
    "minimax_m2": ("minimax_m2", MINIMAX_M2),
    "laguna": ("laguna", LAGUNA),
    "deepseek_v3": ("deepseek_v3", DEEPSEEK_V3),
}


def make_model(kind: str, path: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model_type, shape = SHAPES[kind]
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{**COMMON, **shape}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.05)
    model.eval().save_pretrained(path)
    return model


@torch.inference_mode()
def hf_decode(model, prompts: torch.Tensor, new_tokens: int) -> tuple[list[list[int]], float]:
    """-> tokens [B][new_tokens], seconds per decode step (steps after the prefill)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(prompts, past_key_values=cache, use_cache=True)
    tokens = [out.logits[:, -1].argmax(-1)]
    start = time.perf_counter()
    for _ in range(new_tokens - 1):
        out = model(tokens[-1][:, None], past_key_values=cache, use_cache=True)
        tokens.append(out.logits[:, -1].argmax(-1))
    elapsed = time.perf_counter() - start
    return torch.stack(tokens, dim=1).tolist(), elapsed / (new_tokens - 1)


def ours_decode(gen, prompts: torch.Tensor, new_tokens: int) -> tuple[list[list[int]], float]:
    requests = [Request(tuple(p), new_tokens, ignore_eos=True) for p in prompts.tolist()]
    results = gen.generate(requests)
    step = max(r.finish_s for r in results) - min(r.first_token_s for r in results)
    return [r.output_ids for r in results], step / (new_tokens - 1)


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def run_family(kind: str, args, root: Path) -> dict:
    hf = make_model(kind, root / kind)
    gen = load_pipeline(root / kind).generator
    prompts = torch.randint(0, COMMON["vocab_size"], (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(1))
    expected, _ = hf_decode(hf, prompts, args.new_tokens)  # warm-up, and the reference tokens
    got, _ = ours_decode(gen, prompts, args.new_tokens)
    if got != expected:
        raise SystemExit(f"{kind}: outputs differ from transformers")
    ours, theirs = [], []
    for _ in range(args.repeats):
        ours.append(ours_decode(gen, prompts, args.new_tokens)[1])
        theirs.append(hf_decode(hf, prompts, args.new_tokens)[1])
    ratios = [t / o for o, t in zip(ours, theirs)]
    print(f"{kind:10s} step ms: ours {1e3 * statistics.median(ours):.2f}  transformers "
          f"{1e3 * statistics.median(theirs):.2f}  speedup x{statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
    return {"model_type": SHAPES[kind][0], "shape": {**COMMON, **SHAPES[kind][1]}, "step_s_ours": spread(ours), "step_s_transformers": spread(theirs),
            "speedup_transformers_over_ours": spread(ratios), "outputs_identical": True}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=96)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--families", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    families = args.families.split(",")
    unknown = sorted(set(families) - set(SHAPES))
    if unknown:
        p.error(f"unknown family {unknown[0]!r} (choose from {', '.join(SHAPES)})")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        results = {kind: run_family(kind, args, Path(tmp)) for kind in families}
    record = {
        "command": "python " + " ".join(sys.argv),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": args.threads,
                    "torch": torch.__version__, "python": platform.python_version(),
                    "load_average_at_end": os.getloadavg()},
        "trtllm_dflash": __version__,
        "settings": {"batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                     "repeats": args.repeats, "dtype": "float32", "greedy": True,
                     "transformers": __import__("transformers").__version__},
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
