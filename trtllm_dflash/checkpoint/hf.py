"""Hugging Face model directories: locate them, read their safetensors, tokenizer and stop tokens."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..utils.errors import DFlashError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]


def resolve_model_dir(name: str | Path) -> Path:
    """A local directory, or a hub id fetched (or found in the local cache) by huggingface_hub."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise DFlashError(f"model path is not a directory: {name}")
    if not HUB_ID.match(str(name)):
        raise DFlashError(f"no such model directory: {name}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name), allow_patterns=HUB_FILES))
    except Exception as exc:  # offline, unreachable, gated, unknown repo: all one message
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DFlashError(f"cannot get model '{name}': not a local directory and the Hugging Face hub "
                          f"could not provide it ({type(exc).__name__}: {reason})") from None


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a directory: one file, or the shards named by the index."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DFlashError(f"corrupt safetensors index {index}: {exc!r}") from None
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise DFlashError(f"safetensors shard named by {index.name} is missing: {model_dir / missing[0]}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise DFlashError(f"no safetensors weights in {model_dir} (expected model.safetensors or model.safetensors.index.json)")


def load_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a directory (every shard)."""
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(model_dir):
        tensors.update(read_safetensors(path))
    return tensors


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """One safetensors file; a truncated or garbled file is one clear error."""
    if not path.is_file():
        raise DFlashError(f"missing safetensors file {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise DFlashError(f"corrupt safetensors file {path}: {str(exc).splitlines()[0]}") from None


def tensor_specs(path: Path) -> dict[str, tuple[str, list[int]]]:
    """{name: (safetensors dtype such as 'BF16', shape)} from a file's header alone (no tensor is read)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: (f.get_slice(name).get_dtype(), f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise DFlashError(f"corrupt safetensors file {path}: {str(exc).splitlines()[0]}") from None


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DFlashError(f"{path} is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def load_tokenizer(model_dir: Path):
    """The directory's tokenizer through transformers, or None when it ships none."""
    if not any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:
        raise DFlashError(f"cannot load the tokenizer in {model_dir}: {type(exc).__name__}: {exc}") from None


def stop_token_ids(model_dir: Path, config_eos: tuple[int, ...], tokenizer) -> tuple[int, ...]:
    """Default stop tokens: generation_config.json, else config.json, else the tokenizer's EOS."""
    eos = read_json(model_dir / "generation_config.json").get("eos_token_id")
    if eos is not None:
        return tuple(eos) if isinstance(eos, list) else (int(eos),)
    if config_eos:
        return config_eos
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return (int(tokenizer.eos_token_id),)
    return ()
