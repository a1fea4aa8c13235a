"""Laguna's own fields of a target config: per-layer query heads, the softplus output gate, RoPE per layer type,
dense and sparse MLP layers.

Read as transformers 5.24 `models/laguna/configuration_laguna.py` (`LagunaConfig.__post_init__`) reads them:
`layer_types` defaults to full attention everywhere (the 512-token window only bites on layers listed
sliding_attention), `mlp_layer_types` to one dense layer then sparse ones, `num_attention_heads_per_layer` to
num_attention_heads everywhere (K/V heads are global), `rope_parameters` is keyed by layer type (full: theta 5e5,
half of head_dim rotated; sliding: theta 1e4, all of it). The fields every family has stay in
`config.model.DecoderConfig`; models/registry.py's entry holds these hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config.family import FULL, SLIDING
from ...config.moe import MoeConfig, number, positive_int, top_k
from ...config.rope import RopeConfig
from ...utils.errors import DFlashError

DEFAULT_ROPE = {FULL: {"rope_type": "default", "rope_theta": 500_000.0, "partial_rotary_factor": 0.5},
                SLIDING: {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 1.0}}
GATINGS = {True: "per-head", "per-head": "per-head", "per-element": "per-element"}
# LagunaConfig's class defaults that change the math (used when transformers is absent)
DEFAULTS = {"vocab_size": 100_352, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
            "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 131_072, "sliding_window": 512, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256,
            "tie_word_embeddings": False, "attention_bias": False}


@dataclass(frozen=True)
class LagunaConfig:
    heads: tuple[int, ...]  # query heads of each layer (q_proj, g_proj, o_proj sized by them)
    gating: str  # "per-head": one softplus gate per head; "per-element": one per channel
    ropes: dict[str, tuple[RopeConfig, float]]  # layer type -> its RoPE and the share of head_dim it turns


def layout(data: dict[str, Any], layers: int) -> tuple[list[str], int | None]:
    return data.get("layer_types") or [FULL] * layers, data.get("sliding_window", 512)


def mlp_types(data: dict[str, Any], layers: int, source: str) -> list[str]:
    types = data.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {"dense", "sparse"}:
        raise DFlashError(f"{source}: field 'mlp_layer_types' must list {layers} of dense/sparse, got {types!r}")
    return types


def moe_config(data: dict[str, Any], source: str, layers: int) -> MoeConfig | None:
    """LagunaSparseMoeBlock on the sparse layers: LagunaTopKRouter (optional tanh soft-cap of the logits, sigmoid,
    the top k of scores + e_score_correction_bias, unbiased scores renormalised), routed output times
    moe_routed_scaling_factor, plus an ungated shared expert."""
    if data.get("moe_apply_router_weight_on_input"):
        raise DFlashError(f"{source}: unsupported moe_apply_router_weight_on_input true (transformers' Laguna "
                          "refuses it too)")
    sparse = tuple(i for i, kind in enumerate(mlp_types(data, layers, source)) if kind == "sparse")
    if not sparse:
        return None
    experts = positive_int(data, source, "num_experts")
    return MoeConfig(num_experts=experts, top_k=top_k(data, source, experts, "num_experts_per_tok"),
                     intermediate_size=positive_int(data, source, "moe_intermediate_size"), routing="sigmoid_topk",
                     norm_topk_prob=True, routed_scaling_factor=number(data, source, "moe_routed_scaling_factor", 1.0),
                     router_softcap=number(data, source, "moe_router_logit_softcapping", 0.0),
                     shared_expert_intermediate_size=positive_int(data, source, "shared_expert_intermediate_size"),
                     layers=sparse)


def own_fields(data: dict[str, Any], base: dict[str, Any], source: str) -> dict[str, Any]:
    return {"laguna": laguna_config(data, base, source)}


def laguna_config(data: dict[str, Any], base: dict[str, Any], source: str) -> LagunaConfig:
    layers, kv_heads = base["num_hidden_layers"], base["num_key_value_heads"]
    heads = data.get("num_attention_heads_per_layer") or [base["num_attention_heads"]] * layers
    if (not isinstance(heads, list) or len(heads) != layers
            or not all(isinstance(h, int) and h > 0 and h % kv_heads == 0 for h in heads)):
        raise DFlashError(f"{source}: field 'num_attention_heads_per_layer' must list {layers} positive multiples of "
                          f"num_key_value_heads {kv_heads}, got {heads!r}")
    gating = data.get("gating", True)
    if gating not in GATINGS:
        raise DFlashError(f"{source}: unsupported gating {gating!r} (true, 'per-head' or 'per-element')")
    ropes = {kind: rope_of(data, kind, base["head_dim"], source) for kind in set(base["layer_types"])}
    return LagunaConfig(heads=tuple(heads), gating=GATINGS[gating], ropes=ropes)


def rope_of(data: dict[str, Any], kind: str, head_dim: int, source: str) -> tuple[RopeConfig, float]:
    params = (data.get("rope_parameters") or DEFAULT_ROPE).get(kind)
    if not isinstance(params, dict):
        raise DFlashError(f"{source}: field 'rope_parameters' needs an object for {kind!r}, got {params!r}")
    factor = params.get("partial_rotary_factor", 1.0)
    if not isinstance(factor, int | float) or not 0 < factor <= 1 or int(head_dim * factor) % 2:
        raise DFlashError(f"{source}: rope_parameters.{kind}.partial_rotary_factor must be in (0, 1] and turn an even "
                          f"number of head_dim {head_dim} channels, got {factor!r}")
    extra = {k: data[k] for k in ("max_position_embeddings",) if k in data}
    return RopeConfig.from_dict({**extra, "rope_parameters": params}, f"{source} rope_parameters.{kind}"), float(factor)
