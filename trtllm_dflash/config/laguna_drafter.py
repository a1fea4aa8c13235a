"""Laguna's own DFlash drafter (poolside): which config names it, and the fields its math depends on.

As TensorRT-LLM computes it (NVIDIA/TensorRT-LLM@009d8fa4, PR #15666, `tensorrt_llm/_torch/models/modeling_dflash.py`
`DFlashLagunaForCausalLM`): a drafter is Laguna's when any of its architectures contains "Laguna"
(`_build_dflash_draft`; the published checkpoints say `DFlashLagunaForCausalLM`, vLLM's name, with model_type
"llama"). Over DFlash it adds one RMSNorm per captured target layer before `fc` (`aux_hidden_norms.<i>`), each
layer's `input_layernorm` on the context features before their K/V projection, a per-head softplus gate
(`self_attn.g_proj`) on the attention output before `o_proj`, and causal sliding layers (full layers stay
non-causal: `_get_attention_mask_args`). Upstream refuses any gating but per-head, and builds its fused context
K/V on one head count for every layer; its drafter MLP is dense (`_normalize_config`).
"""

from __future__ import annotations

from typing import Any

from ..utils.errors import DFlashError

ARCHITECTURE = "DFlashLagunaForCausalLM"


def is_laguna_drafter(architectures: list[str]) -> bool:
    return any("Laguna" in str(a) for a in architectures)


def check_laguna_drafter(data: dict[str, Any], dflash: dict[str, Any], source: str) -> None:
    """One line for a Laguna drafter field whose math neither upstream nor this runtime implements."""
    gating = data.get("gating", True)
    if gating not in (True, "per-head"):
        raise DFlashError(f"{source}: unsupported gating {gating!r} for a Laguna drafter (per-head only, as "
                          "TensorRT-LLM's DFlashLagunaForCausalLM)")
    for key in ("num_attention_heads_per_layer", "num_key_value_heads_per_layer"):
        per_layer = data.get(key)
        if per_layer is not None and (not isinstance(per_layer, list) or any(h != per_layer[0] for h in per_layer)):
            raise DFlashError(f"{source}: field '{key}' must be one head count for every drafter layer, got "
                              f"{per_layer!r}")
    mlp = data.get("mlp_layer_types")
    if data.get("num_experts") or (mlp is not None and (not isinstance(mlp, list) or set(map(str, mlp)) != {"dense"})):
        raise DFlashError(f"{source}: a Laguna drafter with experts (num_experts {data.get('num_experts')!r}, "
                          f"mlp_layer_types {mlp!r}) is not supported: its layers are dense")
    causal = dflash.get("causal", dflash.get("is_causal", data.get("is_causal")))
    if causal:
        raise DFlashError(f"{source}: unsupported is_causal {causal!r} for a Laguna drafter (its sliding layers are "
                          "causal, its full layers not)")
