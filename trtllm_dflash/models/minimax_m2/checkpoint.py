"""MiniMax-M2 checkpoints -> the names of models/target.py's MoE layers.

Published (MiniMaxAI/MiniMax-M2, and what transformers 5.24 `save_pretrained` writes back through
conversion_mapping.py "minimax_m2" = "mixtral" + one rename): `block_sparse_moe.gate.weight`,
`block_sparse_moe.e_score_correction_bias`, `block_sparse_moe.experts.<j>.{w1,w3,w2}.weight` (gate, up, down).
transformers' in-memory names (`mlp.gate`, `mlp.e_score_correction_bias`, `mlp.experts.gate_up_proj`) are read too;
checkpoint/layout.py stacks the experts.
"""

from __future__ import annotations

import re

import torch

from ...utils.names import renamed

RENAMES = [
    (re.compile(r"\.block_sparse_moe\."), ".mlp."),
    (re.compile(r"\.mlp\.e_score_correction_bias$"), ".mlp.router.e_score_correction_bias"),
    (re.compile(r"\.experts\.(\d+)\.w1\.weight$"), r".experts.\1.gate_proj.weight"),
    (re.compile(r"\.experts\.(\d+)\.w3\.weight$"), r".experts.\1.up_proj.weight"),
    (re.compile(r"\.experts\.(\d+)\.w2\.weight$"), r".experts.\1.down_proj.weight"),
]


def minimax_m2_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return renamed(tensors, RENAMES)
