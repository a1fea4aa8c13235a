"""The paged KV cache's serving claims (docs/paged-kv.md).

memory: the pool's own accounting at Qwen3-8B shapes with a 5-layer DFlash drafter (bf16) on an 80 GB GPU, on
the meta device (no memory is touched): the generator sizes its pool from the memory left after both models'
weights, and requests of 2,048 positions are admitted by `Generator.admissible` and grown to their full length by
the pool, one after another, until it is full. Compared with today's slot layout, which held max_seq_len positions per slot.

    python benchmarks/prefix_and_chunking.py memory --out benchmarks/results/prefix_and_chunking/memory.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

QWEN3_8B = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "tie_word_embeddings": False}
DRAFTER_5 = {**QWEN3_8B, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 5,
             "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33], "block_size": 16}}


def meta_generator():
    from trtllm_dflash.config import DrafterConfig, TargetConfig
    from trtllm_dflash.generator import Generator
    from trtllm_dflash.models.drafter import DFlashDrafter
    from trtllm_dflash.models.target import TargetModel
    from trtllm_dflash.speculative.dflash import DFlashProposer

    with torch.device("meta"):
        target = TargetModel(TargetConfig.from_dict(QWEN3_8B, "qwen3-8b")).to(torch.bfloat16)
        drafter = DFlashDrafter(DrafterConfig.from_dict(DRAFTER_5, "dflash-5")).to(torch.bfloat16)
    weights = sum(p.numel() * p.element_size() for m in (target, drafter) for p in m.parameters())
    return Generator(target, DFlashProposer(drafter, target, context_kv="unfused")), weights


def memory(gpu_bytes: float, tokens: int, max_seq_len: int, rows: int) -> dict:
    from trtllm_dflash.kv_cache import blocks_for
    from trtllm_dflash.request import Request

    gen, weights = meta_generator()
    gen.kv_cache_bytes = int(gpu_bytes - weights)
    gen.allocate(rows, max_seq_len, 16)
    request = Request(tuple(range(tokens // 2)), tokens // 2, ignore_eos=True)  # prompt + output = tokens
    admitted = 0  # requests admitted one by one, each then grown to its full length: concurrent at full length
    while admitted < rows and gen.admissible([request]):
        gen.pool.admit(admitted, list(request.prompt_ids), gen.first_positions(len(request.prompt_ids)))
        if not gen.pool.grow(admitted, tokens + gen.block + 1):
            gen.pool.release(admitted)
            break
        admitted += 1
    slot_bytes = gen.bytes_per_block * max_seq_len / 16
    return {"gpu_bytes": gpu_bytes, "weights_bytes": weights, "kv_bytes_per_token": gen.bytes_per_block / 16,
            "pool_blocks": gen.pool.num_blocks, "pool_tokens": gen.pool.num_blocks * 16,
            "request_positions": tokens + gen.block + 1, "blocks_per_request": blocks_for(tokens + gen.block + 1),
            "concurrent_requests_at_full_length": admitted,
            "slot_layout_requests": {str(n): int((gpu_bytes - weights) // (gen.bytes_per_block * n / 16))
                                     for n in (max_seq_len, 8192)}, "slot_bytes_at_max_seq_len": slot_bytes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["memory"])
    p.add_argument("--out", type=Path)
    p.add_argument("--gpu-gb", type=float, default=80.0)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--max-seq-len", type=int, default=40960)
    p.add_argument("--rows", type=int, default=256, help="max_batch_size (rows bound the step, not memory)")
    args = p.parse_args(argv)
    result = {"command": " ".join(["python", *sys.argv]), "device": f"meta (accounting only), {platform.machine()}",
              "memory": memory(args.gpu_gb * 1e9, args.tokens, args.max_seq_len, args.rows)}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
