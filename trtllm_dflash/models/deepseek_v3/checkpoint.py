"""DeepSeek-V3 and Kimi-K2.5 checkpoints -> the names of models/target.py's MoE layers and MlaAttention.

Published DeepSeek-V3 (and what transformers 5.24 `save_pretrained` writes back through conversion_mapping.py
"deepseek_v3" = "qwen2_moe"): `mlp.gate.weight`, `mlp.gate.e_score_correction_bias`,
`mlp.experts.<j>.{gate,up,down}_proj.weight`, `mlp.shared_experts.*`; its multi-token-prediction layer sits at
layer index num_hidden_layers and is dropped (transformers' DeepseekV3 builds none). Kimi-K2.5 keeps the language
model under `language_model.model.*` / `language_model.lm_head` (published) or `model.language_model.*` (transformers'
in memory; conversion_mapping.py "kimi_k25"), beside its vision tower and projector, which are dropped.
transformers 5.24's `save_pretrained` writes the language model's layers as `language_model.model.blocks.*` (its
vision tower's `blocks` -> `layers` rule, reversed on every name), read back as layers here as transformers does; its
writer also renames a plain `self_attn.q_proj` (q_lora_rank null) as a vision `wqkv`, which is not read.
FP8 block-scaled weights (DeepSeek-V3's published `<w>.weight` float8_e4m3fn with `<w>.weight_scale_inv`) are
dequantized at load as DeepSeek-V4's are (models/deepseek_v4/checkpoint.py). checkpoint/layout.py stacks the experts.
"""

from __future__ import annotations

import re

import torch

from ..deepseek_v4.checkpoint import dequantize_fp8
from ...utils.names import rename

RENAMES = [
    (re.compile(r"^language_model\.model\.blocks\."), "model.layers."),  # transformers' writer: see the docstring
    (re.compile(r"^language_model\.model\."), "model."),
    (re.compile(r"^language_model\.lm_head\."), "lm_head."),
    (re.compile(r"^model\.language_model\."), "model."),
    (re.compile(r"\.mlp\.gate\.e_score_correction_bias$"), ".mlp.router.e_score_correction_bias"),
    (re.compile(r"\.mlp\.shared_experts\."), ".mlp.shared_expert."),
]
LAYER = re.compile(r"^model\.layers\.(\d+)\.")
LANGUAGE_MODEL = ("model.embed_tokens.", "model.layers.", "model.norm.", "lm_head.")  # the rest: vision, projector


def deepseek_v3_names(cfg, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if cfg.quant_method == "fp8":
        tensors = dequantize_fp8(tensors, cfg.deepseek_v3.fp8_block)
    out = {}
    for name, t in tensors.items():
        name = rename(name, RENAMES)
        layer = LAYER.match(name)
        if name.startswith(LANGUAGE_MODEL) and not (layer and int(layer[1]) >= cfg.num_hidden_layers):
            out[name] = t
    return out
