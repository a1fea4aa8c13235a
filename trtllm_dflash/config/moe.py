"""The validated mixture-of-experts config of a target, read from its config.json.

One `MoeConfig` describes every MoE block of a model: how tokens are routed, what one expert
computes, and which decoder layers have experts instead of a dense MLP (or beside it: Gemma 4). Field
names and defaults follow transformers 5.23 (`GptOssConfig`, `Qwen3MoeConfig`, `Qwen3_5MoeTextConfig`,
`Qwen3NextConfig`) and 5.24 (`Gemma4TextConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..utils.errors import DFlashError

ROUTINGS = ("softmax_topk", "topk_softmax")
ACTIVATIONS = ("silu", "clamped_swiglu", "gelu_tanh", "limited_silu")


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int
    intermediate_size: int  # of one routed expert
    # "softmax_topk": softmax over all experts in fp32, keep the top k (Qwen3MoeTopKRouter);
    # "topk_softmax": keep the top k logits, softmax over those (GptOssTopKRouter).
    routing: str = "softmax_topk"
    norm_topk_prob: bool = False  # softmax_topk: renormalise the kept probabilities to sum to 1
    router_bias: bool = False
    expert_bias: bool = False  # gate_up and down biases per expert (gpt-oss)
    # "silu": silu(gate) * up. "clamped_swiglu" (GptOssExperts._apply_gate): gate clamped above at
    # swiglu_limit, up to [-limit, limit], out = (up + 1) * gate * sigmoid(swiglu_alpha * gate).
    # "gelu_tanh": gelu(gate, approximate="tanh") * up (Gemma 4's experts).
    # "limited_silu" (DeepseekV4Experts._apply_gate): silu(gate clamped above at swiglu_limit) * up in [-limit, limit].
    activation: str = "silu"
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    shared_expert_gate: bool = False  # shared output scaled by sigmoid(Linear(hidden, 1))
    layers: tuple[int, ...] = ()  # decoder layers whose MLP is this block; the others are dense

    def __post_init__(self):
        if self.routing not in ROUTINGS or self.activation not in ACTIVATIONS:
            raise ValueError(f"routing {self.routing!r} / activation {self.activation!r} not in {ROUTINGS} / {ACTIVATIONS}")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"top_k {self.top_k} must be in 1..num_experts {self.num_experts}")


def _int(data: dict[str, Any], source: str, *keys: str, default: Any = ...) -> int:
    """The first of `keys` present (configs spell some fields two ways), a positive int."""
    for key in keys:
        if key in data:
            value = data[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise DFlashError(f"{source}: field '{key}' must be a positive int, got {value!r}")
            return value
    if default is ...:
        raise DFlashError(f"{source}: missing required field '{keys[0]}'")
    return default


def _float(data: dict[str, Any], source: str, key: str, default: float) -> float:
    value = data.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise DFlashError(f"{source}: field '{key}' must be a number, got {value!r}")
    return float(value)


def _gpt_oss(data: dict[str, Any], source: str, layers: int) -> MoeConfig:
    # GptOssMLP in every layer; intermediate_size is the expert's; router and experts carry biases.
    experts = _int(data, source, "num_local_experts", "num_experts")
    return MoeConfig(
        num_experts=experts,
        top_k=_top_k(data, source, experts, "num_experts_per_tok", "experts_per_token"),
        intermediate_size=_int(data, source, "intermediate_size"),
        routing="topk_softmax", router_bias=True, expert_bias=True, activation="clamped_swiglu",
        swiglu_limit=_float(data, source, "swiglu_limit", 7.0), swiglu_alpha=_float(data, source, "swiglu_alpha", 1.702),
        layers=tuple(range(layers)),
    )


def _qwen3_moe(data: dict[str, Any], source: str, layers: int) -> MoeConfig:
    # Qwen3MoeDecoderLayer: experts unless the layer is in mlp_only_layers or
    # (layer + 1) % decoder_sparse_step != 0; dense layers use intermediate_size.
    experts = _int(data, source, "num_experts", "num_local_experts")
    step = _int(data, source, "decoder_sparse_step", default=1)
    dense = data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and 0 <= i < layers for i in dense):
        raise DFlashError(f"{source}: field 'mlp_only_layers' must list layer ids in 0..{layers - 1}, got {dense!r}")
    norm = data.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise DFlashError(f"{source}: field 'norm_topk_prob' must be bool, got {norm!r}")
    return MoeConfig(
        num_experts=experts,
        top_k=_top_k(data, source, experts, "num_experts_per_tok"),
        intermediate_size=_int(data, source, "moe_intermediate_size"),
        norm_topk_prob=norm,
        layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0),
    )


def _qwen3_5_moe(data: dict[str, Any], source: str, layers: int) -> MoeConfig:
    # Qwen3_5MoeDecoderLayer: a Qwen3_5MoeSparseMoeBlock in every layer; its router always renormalises the
    # kept probabilities (Qwen3_5MoeTopKRouter, no flag); a shared expert scaled by sigmoid(shared_expert_gate).
    experts = _int(data, source, "num_experts", default=256)
    return MoeConfig(
        num_experts=experts,
        top_k=_top_k(data, source, experts, "num_experts_per_tok", default=8),
        intermediate_size=_int(data, source, "moe_intermediate_size", default=512),
        norm_topk_prob=True,
        shared_expert_intermediate_size=_int(data, source, "shared_expert_intermediate_size", default=512),
        shared_expert_gate=True,
        layers=tuple(range(layers)),
    )


def _qwen3_next(data: dict[str, Any], source: str, layers: int) -> MoeConfig | None:
    # Qwen3NextDecoderLayer: Qwen3-MoE's layer rule (mlp_only_layers, decoder_sparse_step) when num_experts > 0,
    # plus Qwen3NextSparseMoeBlock's gated shared expert; Qwen3NextConfig defaults (num_experts 512, top 10,
    # moe_intermediate_size 512, shared 512, norm_topk_prob true). num_experts 0: the dense variant.
    if data.get("num_experts", 512) == 0:
        return None
    data = {"num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512, "norm_topk_prob": True,
            **data}
    base = _qwen3_moe(data, source, layers)
    if not base.layers:
        return None
    return replace(base, shared_expert_gate=True,
                   shared_expert_intermediate_size=_int(data, source, "shared_expert_intermediate_size", default=512))


def _gemma4(data: dict[str, Any], source: str, layers: int) -> MoeConfig | None:
    # Gemma4TextDecoderLayer (transformers 5.24): with enable_moe_block every layer adds routed experts beside
    # its dense MLP; Gemma4TextRouter renormalises the top-k probabilities; experts use hidden_activation. The
    # router's own scales and the block's norms are models/gemma4.py's.
    if not data.get("enable_moe_block"):
        return None
    experts = _int(data, source, "num_experts")
    return MoeConfig(num_experts=experts, top_k=_top_k(data, source, experts, "top_k_experts"),
                     intermediate_size=_int(data, source, "moe_intermediate_size"), norm_topk_prob=True,
                     activation="gelu_tanh", layers=tuple(range(layers)))


def _deepseek_v4(data: dict[str, Any], source: str, layers: int) -> MoeConfig:
    # DeepseekV4SparseMoeBlock (transformers 5.24) in every layer: routed experts and one shared expert of
    # moe_intermediate_size, both with limited SwiGLU; its routers (hash and score) are models/deepseek_v4_layers.py's.
    experts = _int(data, source, "n_routed_experts")
    width = _int(data, source, "moe_intermediate_size")
    return MoeConfig(num_experts=experts, top_k=_top_k(data, source, experts, "num_experts_per_tok"),
                     intermediate_size=width, activation="limited_silu",
                     swiglu_limit=_float(data, source, "swiglu_limit", 10.0), shared_expert_intermediate_size=width,
                     layers=tuple(range(layers)))


def _top_k(data: dict[str, Any], source: str, experts: int, *keys: str, default: Any = ...) -> int:
    k = _int(data, source, *keys, default=default)
    if k > experts:
        raise DFlashError(f"{source}: field '{keys[0]}' {k} exceeds the number of experts {experts}")
    return k


MOE_FAMILIES = {"gpt_oss": _gpt_oss, "qwen3_moe": _qwen3_moe, "qwen3_5_moe": _qwen3_5_moe,
                "qwen3_5_moe_text": _qwen3_5_moe, "qwen3_next": _qwen3_next, "gemma4": _gemma4,
                "gemma4_text": _gemma4, "deepseek_v4": _deepseek_v4}


def moe_config(model_type: str, data: dict[str, Any], source: str, layers: int) -> MoeConfig | None:
    """The MoE config of a target's config.json, or None for a dense model type."""
    parse = MOE_FAMILIES.get(model_type)
    return parse(data, source, layers) if parse else None
