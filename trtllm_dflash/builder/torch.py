"""The `torch` backend: configs, tokenizer and weights pre-sharded per tensor-parallel rank.

Layout: target/{config.json, generation_config.json, rank<r>.safetensors}, drafter/{config.json,
rank<r>.safetensors}, tokenizer/. Each rank memory-maps only its own files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..checkpoint.hf import load_tensors
from ..checkpoint.layout import target_tensors
from ..checkpoint.loader import DTYPES, check_weights, tied_weights
from ..checkpoint.sharding import shard_state
from ..models.drafter import DFlashDrafter
from ..models.target import build_target
from .builder import BuildPlan, copy_tokenizer


def write_torch_engine(plan: BuildPlan, tmp: Path) -> dict:
    dtype, tp = DTYPES[plan.spec.dtype], plan.spec.tp
    roles = (("target", plan.target_dir, plan.target, build_target),
             ("drafter", plan.drafter_dir, plan.drafter, DFlashDrafter))
    for role, src, cfg, cls in roles:
        state = target_tensors(cfg, load_tensors(src), src) if role == "target" else plan.drafter_checkpoint.tensors()
        skip = tied_weights(cfg)
        for name in skip:
            state.pop(name, None)
        with torch.device("meta"):
            check_weights(cls(cfg), state, src, skip)
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        out = tmp / role
        out.mkdir()
        for name in ("config.json", "generation_config.json"):
            if (src / name).is_file():
                shutil.copy2(src / name, out / name)
        if role == "drafter":  # z-lab's layout whatever the input format
            (out / "config.json").write_text(json.dumps(plan.drafter_json, indent=2) + "\n")
        for rank in range(tp):
            save_file(shard_state(state, cfg, rank, tp), str(out / f"rank{rank}.safetensors"), metadata={"format": "pt"})
    copy_tokenizer(plan.target_dir, tmp / "tokenizer")
    return {"tokenizer": "tokenizer", "weights": "<role>/rank<r>.safetensors, one file per tensor-parallel rank"}
