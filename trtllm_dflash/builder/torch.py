"""The `torch` backend: configs, tokenizer and weights pre-sharded per tensor-parallel rank.

Layout: target/{config.json, generation_config.json, rank<r>.safetensors}, drafter/{config.json,
rank<r>.safetensors}, tokenizer/, and compiled/ once `dflash-build compile` stores step graphs. Each rank
memory-maps only its own files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..checkpoint.hf import load_tensors, read_safetensors
from ..checkpoint.layout import target_tensors
from ..checkpoint.loader import DTYPES, check_weights, tied_weights
from ..checkpoint.sharding import shard_state
from ..config.manifest import Manifest
from ..config.model import DrafterConfig, TargetConfig, read_config_json
from ..config.pairing import validate_pair
from ..distributed.parallel import Parallel, check_divisible, check_divisible_experts, check_linear_heads
from ..models.registry import build_drafter, parse_drafter_config, parse_target_config
from ..models.target import build_target
from ..utils.errors import DFlashError
from .backend import Backend
from .plan import BuildPlan, copy_tokenizer
from .spec import TRTLLM_ONLY, BuildSpec
from .verify import checked


def write_torch_engine(plan: BuildPlan, tmp: Path) -> dict:
    dtype, tp = DTYPES[plan.spec.dtype], plan.spec.tp
    roles = (("target", plan.target_dir, plan.target, build_target),
             ("drafter", plan.drafter_dir, plan.drafter, build_drafter))
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


class TorchBackend(Backend):
    def check_spec(self, spec: BuildSpec) -> None:
        if spec.quant != "none":
            raise DFlashError(f"build spec: quant {spec.quant!r} needs backend 'trtllm' (the torch backend runs "
                              "unquantized weights)")
        changed = [k for k, default in TRTLLM_ONLY.items() if getattr(spec, k) != default]
        if changed:
            raise DFlashError(f"build spec: '{changed[0]}' is only used with backend 'trtllm'")

    def read_target(self, data: dict, source: str) -> TargetConfig:
        return parse_target_config(data, source)

    def default_max_seq_len(self, target: TargetConfig, drafter: DrafterConfig) -> int:
        return target.max_position_embeddings

    def check_plan(self, plan: BuildPlan) -> None:
        target, tp = plan.target, plan.spec.tp
        for kv_heads in sorted({target.kv_heads_and_dim(i)[0] for i in range(target.num_hidden_layers)}):
            check_divisible("target", target.num_attention_heads, kv_heads, target.intermediate_size or 0, tp)
        if target.linear_attention is not None:
            check_linear_heads(target.linear_attention.num_k_heads, target.linear_attention.num_v_heads, tp)
        if target.moe is not None:
            check_divisible_experts(target.moe.intermediate_size, target.moe.shared_expert_intermediate_size, tp)

    def write(self, plan: BuildPlan, tmp: Path) -> dict:
        return write_torch_engine(plan, tmp)

    def verify(self, engine_dir: Path, manifest: Manifest) -> tuple[list[str], list[str]]:
        from ..compilation.graph_store import verify_lines

        lines, problems = checked(lambda: check_weights_per_rank(engine_dir, manifest))
        graph_lines, graph_problems = verify_lines(engine_dir)
        return lines + graph_lines, problems + graph_problems

    def inspect_lines(self, engine_dir: Path) -> list[str]:
        from ..compilation.graph_store import inspect_lines
        from ..engine.loader import kv_pool_lines

        return kv_pool_lines(engine_dir) + inspect_lines(engine_dir)


def check_weights_per_rank(engine_dir: Path, manifest: Manifest) -> list[str]:
    target, drafter = read_configs(engine_dir / "target", engine_dir / "drafter")
    for rank in range(manifest.tp_size):
        tp = Parallel(rank, manifest.tp_size)
        with torch.device("meta"):
            models = (("target", build_target(target, tp)), ("drafter", build_drafter(drafter, tp)))
        for role, model in models:
            path = engine_dir / role / f"rank{rank}.safetensors"
            check_weights(model, read_safetensors(path), path, tied_weights(model.config))
    return [f"pair: configs valid and matched; weights of {manifest.tp_size} rank(s) match their shapes"]


def read_configs(target_dir: Path, drafter_dir: Path) -> tuple[TargetConfig, DrafterConfig]:
    target = parse_target_config(read_config_json(target_dir), str(target_dir / "config.json"))
    drafter = parse_drafter_config(read_config_json(drafter_dir), str(drafter_dir / "config.json"))
    validate_pair(target, drafter)
    return target, drafter


BACKEND = TorchBackend()
