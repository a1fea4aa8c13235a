"""Laguna checkpoints -> the names of models/target.py's MoE layers.

Published (poolside/Laguna-*, and what transformers 5.24 `save_pretrained` writes back through conversion_mapping.py
"laguna" = "qwen2_moe" + two renames): `mlp.gate.weight`, `mlp.experts.e_score_correction_bias`,
`mlp.experts.<j>.{gate,up,down}_proj.weight`, `mlp.shared_expert.*`; transformers' in-memory names
(`mlp.gate.e_score_correction_bias`, `mlp.shared_experts.*`, fused `mlp.experts.gate_up_proj`) are read too.
checkpoint/layout.py stacks the experts.
"""

from __future__ import annotations

import re

import torch

from ...utils.names import renamed

RENAMES = [
    (re.compile(r"\.mlp\.(experts|gate)\.e_score_correction_bias$"), ".mlp.router.e_score_correction_bias"),
    (re.compile(r"\.mlp\.shared_experts\."), ".mlp.shared_expert."),
]


def laguna_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return renamed(tensors, RENAMES)
