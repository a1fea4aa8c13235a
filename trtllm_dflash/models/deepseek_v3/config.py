"""DeepSeek-V3's own fields of a target config (also Kimi-K2.5's `text_config`, model_type deepseek_v3): multi-head
latent attention and group-limited sigmoid routing.

Read as transformers 5.24 `models/deepseek_v3/configuration_deepseek_v3.py` (`DeepseekV3Config`) reads them:
`__post_init__` sets head_dim = qk_rope_head_dim (the rotary dim, what DecoderConfig.head_dim holds here) and
qk_head_dim = qk_nope_head_dim + qk_rope_head_dim; `num_local_experts` is an alias of n_routed_experts;
q_lora_rank None means a plain q_proj. The softmax scale is qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2
under a scaled RoPE (modeling_deepseek_v3.py yarn_apply_mscale). Kimi-K2.5 (models/kimi_k25/configuration_kimi_k25.py)
wraps this config as its text_config beside a vision tower; the multimodal registry entry reads it there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...config.moe import MoeConfig, number, positive_int, top_k
from ...config.rope import rope_params
from ...utils.errors import DFlashError
from ..deepseek_v4.config import fp8_block


@dataclass(frozen=True)
class DeepseekV3Config:
    q_lora_rank: int | None  # None: q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
    kv_lora_rank: int  # the latent each position caches (with its roped shared key)
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # RoPE over channel pairs (0, 1), (2, 3), ... (DeepSeek's layout)
    softmax_scale: float
    fp8_block: tuple[int, int] = (128, 128)  # quantization_config.weight_block_size of an FP8 checkpoint

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def layout(data: dict[str, Any], layers: int) -> tuple[list[str], None]:
    return ["full_attention"] * layers, None  # DeepseekV3Attention has no sliding window


def moe_config(data: dict[str, Any], source: str, layers: int) -> MoeConfig | None:
    """DeepseekV3MoE from layer first_k_dense_replace on (dense MLPs before): DeepseekV3TopkRouter (sigmoid, the
    top k of scores + e_score_correction_bias within the topk_group best of n_group groups, unbiased scores
    renormalised when norm_topk_prob, times routed_scaling_factor) and n_shared_experts ungated shared experts."""
    first = count(data, source, "first_k_dense_replace", 0)
    if first >= layers:
        return None
    experts = positive_int(data, source, "n_routed_experts", "num_local_experts")
    groups, kept = count(data, source, "n_group", 1) or 1, count(data, source, "topk_group", 1) or 1
    if experts % groups or kept > groups or (groups > 1 and experts // groups < 2):
        raise DFlashError(f"{source}: n_group {groups} must divide n_routed_experts {experts} into groups of at "
                          f"least 2 (a group scores by its top 2) and topk_group {kept} be at most n_group")
    norm = data.get("norm_topk_prob", True)
    if not isinstance(norm, bool):
        raise DFlashError(f"{source}: field 'norm_topk_prob' must be bool, got {norm!r}")
    width = positive_int(data, source, "moe_intermediate_size")
    shared = width * count(data, source, "n_shared_experts", 0)
    return MoeConfig(num_experts=experts, top_k=top_k(data, source, experts, "num_experts_per_tok"),
                     intermediate_size=width, routing="sigmoid_topk", norm_topk_prob=norm,
                     routed_scaling_factor=number(data, source, "routed_scaling_factor", 1.0), n_group=groups,
                     topk_group=kept, shared_expert_intermediate_size=shared,
                     layers=tuple(range(first, layers)))


def count(data: dict[str, Any], source: str, key: str, default: int) -> int:
    """A non-negative int field, `default` when absent or null."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise DFlashError(f"{source}: field '{key}' must be a non-negative int, got {value!r}")
    return value


def own_fields(data: dict[str, Any], base: dict[str, Any], source: str) -> dict[str, Any]:
    return {"deepseek_v3": deepseek_v3_config(data, base, source)}


def deepseek_v3_config(data: dict[str, Any], base: dict[str, Any], source: str) -> DeepseekV3Config:
    q_rank = data.get("q_lora_rank")
    if q_rank is not None:
        q_rank = positive_int(data, source, "q_lora_rank")
    rope_dim = positive_int(data, source, "qk_rope_head_dim")
    if base["head_dim"] != rope_dim:  # DeepseekV3Config.__post_init__ writes head_dim = qk_rope_head_dim
        raise DFlashError(f"{source}: head_dim {base['head_dim']} must equal qk_rope_head_dim {rope_dim} "
                          "(the rotary dim of multi-head latent attention)")
    cfg = DeepseekV3Config(q_lora_rank=q_rank, kv_lora_rank=positive_int(data, source, "kv_lora_rank"),
                           qk_nope_head_dim=positive_int(data, source, "qk_nope_head_dim"),
                           qk_rope_head_dim=rope_dim, v_head_dim=positive_int(data, source, "v_head_dim"),
                           rope_interleave=bool(data.get("rope_interleave", True)), softmax_scale=0.0)
    check_quantization(data.get("quantization_config"), source)
    return DeepseekV3Config(**{**cfg.__dict__, "softmax_scale": softmax_scale(data, cfg.qk_head_dim),
                               "fp8_block": fp8_block(data, source)})


def check_quantization(quant: Any, source: str) -> None:
    """FP8 block-scaled weights (quant_method "fp8", DeepSeek-V3's published format) are dequantized at load
    (checkpoint.py); any other scheme is refused naming it. Kimi-K2.5 publishes its routed experts as compressed-tensors
    pack-quantized int4 in groups of 32 (`weight_packed` / `weight_scale` / `weight_shape` per expert projection: the
    byte-identical slice huggingface.co/eatang/Kimi-K2.5-2layer keeps moonshotai/Kimi-K2.5's quantization_config).
    TensorRT-LLM's DFlash does not run either family (builder/trtllm/targets.py), so no backend here serves them."""
    if not isinstance(quant, dict) or quant.get("quant_method") in (None, "fp8"):
        return
    raise DFlashError(f"{source}: quantization_config {scheme(quant)} is not read: the torch runtime loads unquantized "
                      "or FP8 block-scaled (quant_method 'fp8') weights; dequantize the checkpoint first")


def scheme(quant: dict[str, Any]) -> str:
    """quantization_config in words: its method, a compressed-tensors format and each group's weights
    ("'compressed-tensors' pack-quantized, int4 weights in groups of 32")."""
    words = [repr(quant.get("quant_method"))]
    if quant.get("format"):
        words[0] += f" {quant['format']}"
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict):
            words.append(f"{weights.get('type')}{weights.get('num_bits')} weights in groups of "
                         f"{weights.get('group_size')}")
    return ", ".join(words)


def softmax_scale(data: dict[str, Any], qk_head_dim: int) -> float:
    """yarn_apply_mscale: qk_head_dim^-0.5, times (0.1 * mscale_all_dim * ln(factor) + 1)^2 under a scaled RoPE with
    mscale_all_dim set (and factor > 1)."""
    scale, params = qk_head_dim ** -0.5, rope_params(data)
    all_dim = params.get("mscale_all_dim") or 0
    if params.get("rope_type", params.get("type", "default")) != "default" and all_dim:
        factor = params["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale
