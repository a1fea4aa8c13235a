"""The validated mixture-of-experts config of a target, read from its config.json.

One `MoeConfig` describes every MoE block of a model: how tokens are routed, what one expert
computes, and which decoder layers have experts instead of a dense MLP (or beside it: Gemma 4). Field
names and defaults follow transformers 5.23 (`GptOssConfig`, `Qwen3MoeConfig`, `Qwen3_5MoeTextConfig`,
`Qwen3NextConfig`); a family entry's `moe` hook (models/registry.py) is one of the readers below or its
folder's own (models/gemma4/config.py, models/deepseek_v4/config.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..utils.errors import DFlashError
from .fields import Fields

ROUTINGS = ("softmax_topk", "topk_softmax", "sigmoid_topk")
ACTIVATIONS = ("silu", "clamped_swiglu", "gelu_tanh", "limited_silu")


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int
    intermediate_size: int  # of one routed expert
    # "softmax_topk": softmax over all experts in fp32, keep the top k (Qwen3MoeTopKRouter);
    # "topk_softmax": keep the top k logits, softmax over those (GptOssTopKRouter).
    # "sigmoid_topk": sigmoid of the fp32 logits; the top k of sigmoid + e_score_correction_bias [E] (within the
    # topk_group best of n_group expert groups), weighted by their unbiased sigmoids (MiniMaxM2TopKRouter,
    # LagunaTopKRouter, DeepseekV3TopkRouter).
    routing: str = "softmax_topk"
    norm_topk_prob: bool = False  # softmax_topk / sigmoid_topk: renormalise the kept weights to sum to 1
    routed_scaling_factor: float = 1.0  # sigmoid_topk: the kept weights' factor (after renormalising)
    router_softcap: float = 0.0  # sigmoid_topk: logits -> tanh(logits / cap) * cap first (0: none; Laguna)
    n_group: int = 1  # sigmoid_topk: expert groups, a group scored by the sum of its top 2 biased scores
    topk_group: int = 1  # sigmoid_topk: groups whose experts may be chosen (n_group > 1)
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
        if self.num_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
            raise ValueError(f"n_group {self.n_group} must divide num_experts {self.num_experts} and topk_group "
                             f"{self.topk_group} be in 1..n_group")


def positive_int(data: dict[str, Any], source: str, *keys: str, default: Any = ...) -> int:
    """The first of `keys` present (configs spell some fields two ways), a positive int."""
    return Fields(data, source).get(keys, int, default, positive=True, expect="a positive int")


def number(data: dict[str, Any], source: str, key: str, default: Any = ...) -> float:
    return Fields(data, source).get(key, float, default, expect="a number")


def gpt_oss(data: dict[str, Any], source: str, layers: int) -> MoeConfig:
    # GptOssMLP in every layer; intermediate_size is the expert's; router and experts carry biases.
    experts = positive_int(data, source, "num_local_experts", "num_experts")
    return MoeConfig(
        num_experts=experts,
        top_k=top_k(data, source, experts, "num_experts_per_tok", "experts_per_token"),
        intermediate_size=positive_int(data, source, "intermediate_size"),
        routing="topk_softmax", router_bias=True, expert_bias=True, activation="clamped_swiglu",
        swiglu_limit=number(data, source, "swiglu_limit", 7.0),
        swiglu_alpha=number(data, source, "swiglu_alpha", 1.702),
        layers=tuple(range(layers)),
    )


def qwen3_moe(data: dict[str, Any], source: str, layers: int) -> MoeConfig:
    # Qwen3MoeDecoderLayer: experts unless the layer is in mlp_only_layers or
    # (layer + 1) % decoder_sparse_step != 0; dense layers use intermediate_size.
    experts = positive_int(data, source, "num_experts", "num_local_experts")
    step = positive_int(data, source, "decoder_sparse_step", default=1)
    dense = data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and 0 <= i < layers for i in dense):
        raise DFlashError(f"{source}: field 'mlp_only_layers' must list layer ids in 0..{layers - 1}, got {dense!r}")
    norm = data.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise DFlashError(f"{source}: field 'norm_topk_prob' must be bool, got {norm!r}")
    return MoeConfig(
        num_experts=experts,
        top_k=top_k(data, source, experts, "num_experts_per_tok"),
        intermediate_size=positive_int(data, source, "moe_intermediate_size"),
        norm_topk_prob=norm,
        layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0),
    )


def qwen3_5_moe(data: dict[str, Any], source: str, layers: int) -> MoeConfig:
    # Qwen3_5MoeDecoderLayer: a Qwen3_5MoeSparseMoeBlock in every layer; its router always renormalises the
    # kept probabilities (Qwen3_5MoeTopKRouter, no flag); a shared expert scaled by sigmoid(shared_expert_gate).
    experts = positive_int(data, source, "num_experts", default=256)
    return MoeConfig(
        num_experts=experts,
        top_k=top_k(data, source, experts, "num_experts_per_tok", default=8),
        intermediate_size=positive_int(data, source, "moe_intermediate_size", default=512),
        norm_topk_prob=True,
        shared_expert_intermediate_size=positive_int(data, source, "shared_expert_intermediate_size", default=512),
        shared_expert_gate=True,
        layers=tuple(range(layers)),
    )


def qwen3_next(data: dict[str, Any], source: str, layers: int) -> MoeConfig | None:
    # Qwen3NextDecoderLayer: Qwen3-MoE's layer rule (mlp_only_layers, decoder_sparse_step) when num_experts > 0,
    # plus Qwen3NextSparseMoeBlock's gated shared expert; Qwen3NextConfig defaults (num_experts 512, top 10,
    # moe_intermediate_size 512, shared 512, norm_topk_prob true). num_experts 0: the dense variant.
    if data.get("num_experts", 512) == 0:
        return None
    data = {"num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512, "norm_topk_prob": True,
            **data}
    base = qwen3_moe(data, source, layers)
    if not base.layers:
        return None
    shared = positive_int(data, source, "shared_expert_intermediate_size", default=512)
    return replace(base, shared_expert_gate=True, shared_expert_intermediate_size=shared)


def top_k(data: dict[str, Any], source: str, experts: int, *keys: str, default: Any = ...) -> int:
    k = positive_int(data, source, *keys, default=default)
    if k > experts:
        raise DFlashError(f"{source}: field '{keys[0]}' {k} exceeds the number of experts {experts}")
    return k
