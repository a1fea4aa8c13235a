"""Memory per GPU that DFlash adds to AIConfigurator's plain-decoding footprint, and the batch limit it sets.

Plain decoding's footprint (weights, KV cache of batch x (isl + osl) tokens, activations, NCCL, runtime) is
AIConfigurator's (inference_summary.get_memory, GiB). DFlash adds, per GPU:
- the drafter's weights, bfloat16, split over the TP ranks (its embedding and lm_head are the target's);
- the DFlash context arena, as `dflash-build`'s memory plan sizes it for the TensorRT-LLM release
  (its ctx_arena_bytes and context_rules: the release's paged/managed rules);
- the hidden-state capture buffer, [max_num_tokens, hidden x len(target_layer_ids)] in bfloat16.
A point whose total exceeds the GPU's capacity is out of memory and leaves the frontier.
"""

from __future__ import annotations

import math

from ...builder.trtllm.memory import GIB, MemoryInputs, context_rules, ctx_arena_bytes
from ...config.model import DrafterConfig

BF16 = 2
MAX_NUM_TOKENS = 8192  # dflash-build's default max_num_tokens (builder.spec.BuildSpec)


def attention_backend(sm_version: int) -> str:
    """The DFlash attention backend dflash-build picks: TRTLLM on SM100/SM103, FA4 on SM90 (cli/build.py)."""
    return "TRTLLM" if sm_version >= 100 else "FA4"


def drafter_params(d: DrafterConfig) -> int:
    """Layers' attention + MLP + norms, fc and the final norms (no embedding, no lm_head)."""
    h, hd = d.hidden_size, d.head_dim
    attn = h * d.num_attention_heads * hd * 2 + h * d.num_key_value_heads * hd * 2
    mlp = 3 * h * d.intermediate_size
    return d.num_hidden_layers * (attn + mlp + 2 * h + 2 * hd) + len(d.target_layer_ids) * h * h + 2 * h


def dflash_extra_gib(d: DrafterConfig, target_hidden: int, tp: int, batch: int, max_seq_len: int,
                     version: str, sm_version: int, extra_params: int = 0) -> dict:
    """GiB per GPU: {"drafter_weights", "context_arena", "capture", "total"}; `extra_params`: weights a variant
    adds (DFlash2's convolutions and selector, dflash2.Dflash2Shape.extra_params), bfloat16, split as the rest."""
    m = MemoryInputs(
        tp=tp, max_batch_size=batch, max_seq_len=max_seq_len, max_num_tokens=MAX_NUM_TOKENS,
        max_draft_len=d.block_size - 1, attention_backend=attention_backend(sm_version), weight_bytes=0,
        target_kv_layers=0, target_kv_heads=1, target_head_dim=1, kv_itemsize=BF16, hidden_size=target_hidden,
        num_capture_layers=len(d.target_layer_ids), drafter_layers=d.num_hidden_layers,
        drafter_kv_heads=d.num_key_value_heads, drafter_head_dim=d.head_dim,
        drafter_max_positions=d.max_position_embeddings, itemsize=BF16, drafter_itemsize=BF16, budget_gib=0.0,
        rules=context_rules(version))
    parts = {"drafter_weights": math.ceil((drafter_params(d) + extra_params) * BF16 / tp) / GIB,
             "context_arena": 0.0 if m.managed else ctx_arena_bytes(m, m.attention_backend in m.rules.paged) / GIB,
             "capture": MAX_NUM_TOKENS * target_hidden * len(d.target_layer_ids) * BF16 / GIB}
    return {**{k: round(v, 4) for k, v in parts.items()}, "total": round(sum(parts.values()), 4)}
