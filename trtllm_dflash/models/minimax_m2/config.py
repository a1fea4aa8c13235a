"""MiniMax-M2's registry hooks, read as transformers 5.24 `models/minimax_m2/configuration_minimax_m2.py`
(`MiniMaxM2Config`) reads a config.json.

- `intermediate_size` (1536) is one routed expert's width: every layer is a MiniMaxM2SparseMoeBlock, with no dense
  MLP and no shared expert (modeling_minimax_m2.py MiniMaxM2DecoderLayer); `num_experts` is an alias of
  `num_local_experts` (the class's attribute_map).
- Partial RoPE: the released checkpoints give `rotary_dim` (64 of head_dim 128), which the class turns into
  `rope_parameters.partial_rotary_factor = rotary_dim / head_dim` (`convert_rope_params_to_dict`).
- No sliding window (MiniMaxM2Model: "No sliding window opposed to mixtral").
"""

from __future__ import annotations

from typing import Any

from ...config.moe import MoeConfig, positive_int, top_k
from ...config.rope import rope_params
from ...utils.errors import DFlashError

# MiniMaxM2Config's class defaults that change the math (used when transformers is absent)
DEFAULTS = {"vocab_size": 200_064, "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 62,
            "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 196_608, "num_experts_per_tok": 8, "num_local_experts": 256,
            "rope_theta": 5_000_000.0, "tie_word_embeddings": False, "eos_token_id": 200_020}


def fill(filled: dict[str, Any]) -> None:
    if "rotary_dim" in filled and "partial_rotary_factor" not in rope_params(filled, top_level=True):
        filled["partial_rotary_factor"] = filled["rotary_dim"] / filled["head_dim"]


def moe_config(data: dict[str, Any], source: str, layers: int) -> MoeConfig:
    """MiniMaxM2TopKRouter: sigmoid scores, the top k of scores + e_score_correction_bias, their unbiased scores
    always renormalised (no scaling factor, no groups)."""
    experts = positive_int(data, source, "num_local_experts", "num_experts")
    return MoeConfig(num_experts=experts, top_k=top_k(data, source, experts, "num_experts_per_tok"),
                     intermediate_size=positive_int(data, source, "intermediate_size"), routing="sigmoid_topk",
                     norm_topk_prob=True, layers=tuple(range(layers)))


def own_fields(data: dict[str, Any], base: dict[str, Any], source: str) -> dict[str, Any]:
    """The partial RoPE of every layer (TargetConfig.partial_rotary_factor)."""
    factor = rope_params(data, top_level=True).get("partial_rotary_factor", 1.0)
    if not isinstance(factor, int | float) or not 0 < factor <= 1 or int(base["head_dim"] * factor) % 2:
        raise DFlashError(f"{source}: partial_rotary_factor must be in (0, 1] and turn an even number of head_dim "
                          f"{base['head_dim']} channels, got {factor!r}")
    return {"partial_rotary_factor": float(factor)}
