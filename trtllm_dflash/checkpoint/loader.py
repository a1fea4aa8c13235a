"""Load a target or a drafter from a Hugging Face directory (or hub id) into the project's models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..config.model import DrafterConfig, TargetConfig, read_config_json
from ..distributed.parallel import SINGLE, Parallel
from ..models.drafter import DFlashDrafter
from ..models.registry import build_drafter, parse_target_config
from ..models.target import TargetModel, build_target
from ..utils.errors import DFlashError
from .drafter import read_drafter
from .hf import load_tensors, load_tokenizer, resolve_model_dir, stop_token_ids
from .layout import target_tensors, tied_weights  # noqa: F401 (tied_weights: re-exported)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedTarget:
    model: TargetModel
    config: TargetConfig
    path: Path
    tokenizer: object | None
    stop_ids: tuple[int, ...]


@dataclass
class LoadedDrafter:
    model: DFlashDrafter  # or a subclass its config names (models/registry.py build_drafter)
    config: DrafterConfig
    path: Path


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise DFlashError(f"unknown dtype {name!r} (choose from {', '.join(DTYPES)})")
    return DTYPES[name]


def load_target(name: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedTarget:
    path = resolve_model_dir(name)
    cfg = parse_target_config(read_config_json(path), str(path / "config.json"))
    model = target_from_tensors(cfg, load_tensors(path), path, SINGLE, dtype, device)
    tokenizer = load_tokenizer(path)
    return LoadedTarget(model, cfg, path, tokenizer, stop_token_ids(path, cfg.eos_token_ids, tokenizer))


def load_drafter(name: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedDrafter:
    """A drafter in z-lab's or the speculators library's format (drafter_checkpoint.py)."""
    ckpt = read_drafter(resolve_model_dir(name))
    model = drafter_from_tensors(ckpt.config, ckpt.tensors(), ckpt.path, SINGLE, dtype, device)
    return LoadedDrafter(model, ckpt.config, ckpt.path)


def target_from_tensors(cfg: TargetConfig, tensors: dict, path: Path, tp: Parallel, dtype, device) -> TargetModel:
    """A target (or one rank's shard of it) from checked tensors; tied embeddings re-tied."""
    tensors = target_tensors(cfg, tensors, path)
    skip = tied_weights(cfg)
    with torch.device("meta"):
        model = build_target(cfg, tp)
    assign_weights(model, tensors, path, skip=skip)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device=device, dtype=dtype).eval()


def drafter_from_tensors(cfg: DrafterConfig, tensors: dict, path: Path, tp: Parallel, dtype, device) -> DFlashDrafter:
    with torch.device("meta"):
        model = build_drafter(cfg, tp)
    assign_weights(model, tensors, path)
    return model.to(device=device, dtype=dtype).eval()


def check_weights(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path, skip: set[str] = frozenset()) -> None:
    """Every name and shape against the model built from the config; one-line error on the first problem."""
    expected = {k: v.shape for k, v in model.state_dict().items() if k not in skip}
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise DFlashError(f"weight '{missing[0]}' missing from {path} ({len(missing)} missing in all)")
    unexpected = sorted(set(tensors) - set(expected) - skip)
    if unexpected:
        raise DFlashError(f"unexpected weight '{unexpected[0]}' in {path} ({len(unexpected)} unexpected in all): "
                          "checkpoint and config.json disagree on the architecture")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != tuple(shape):
            raise DFlashError(f"weight shape mismatch for '{name}' in {path}: checkpoint "
                              f"{list(tensors[name].shape)}, config.json implies {list(shape)}")


def assign_weights(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path, skip: set[str] = frozenset()) -> None:
    check_weights(model, tensors, path, skip)
    names = [k for k in model.state_dict() if k not in skip]
    model.load_state_dict({k: aligned(tensors[k]) for k in names}, strict=False, assign=True)


def aligned(t: torch.Tensor) -> torch.Tensor:
    """t, copied when its data is not 16-byte aligned: safetensors' memory map places tensors at 8-byte
    offsets, and grouped GEMM kernels need 16-byte aligned bases (models/moe.py grouped_mm_ok)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()
