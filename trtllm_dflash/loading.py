"""Load a target or a drafter from a Hugging Face directory (or hub id) into the project's models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .checkpoint import load_tokenizer, load_tensors, resolve_model_dir, stop_token_ids
from .config import DrafterConfig, TargetConfig, read_config_json
from .errors import DFlashError
from .models.drafter import DFlashDrafter
from .models.target import TargetModel

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
    model: DFlashDrafter
    config: DrafterConfig
    path: Path


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise DFlashError(f"unknown dtype {name!r} (choose from {', '.join(DTYPES)})")
    return DTYPES[name]


def load_target(name: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedTarget:
    path = resolve_model_dir(name)
    cfg = TargetConfig.from_dict(read_config_json(path), str(path / "config.json"))
    tensors = load_tensors(path)
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = TargetModel(cfg)
    skip = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    assign_weights(model, tensors, path, skip=skip)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(device=device, dtype=dtype).eval()
    tokenizer = load_tokenizer(path)
    return LoadedTarget(model, cfg, path, tokenizer, stop_token_ids(path, cfg.eos_token_ids, tokenizer))


def load_drafter(name: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedDrafter:
    path = resolve_model_dir(name)
    cfg = DrafterConfig.from_dict(read_config_json(path), str(path / "config.json"))
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    assign_weights(model, load_tensors(path), path)
    return LoadedDrafter(model.to(device=device, dtype=dtype).eval(), cfg, path)


def assign_weights(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path, skip: set[str] = frozenset()) -> None:
    """Check every name and shape against the model built from the config, then assign."""
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
    model.load_state_dict({k: tensors[k] for k in expected}, strict=False, assign=True)
