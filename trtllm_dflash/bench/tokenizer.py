"""The tokenizer a sweep counts tokens with, and the engine it came from when it came from one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.hf import load_tokenizer
from ..config.manifest import MANIFEST, Manifest, sha256_file
from ..utils.errors import DFlashError


@dataclass
class TokenizerSource:
    tokenizer: Any
    origin: str  # the directory or hub id it was loaded from
    engine: dict[str, Any] | None = None  # the engine manifest's digest and summary, when an engine was given


def resolve_tokenizer(name: str | None) -> TokenizerSource:
    """An engine directory (its tokenizer/), a model directory, or a hub id."""
    if not name:
        raise DFlashError("--tokenizer is required: a model or engine directory (or hub id) whose tokenizer counts "
                          "input and output tokens")
    path = Path(name)
    if (path / MANIFEST).is_file():
        manifest = Manifest.read(path)
        if not manifest.tokenizer:
            raise DFlashError(f"--tokenizer: the engine {path} ships no tokenizer")
        tok = load_tokenizer(path / manifest.tokenizer)
        return TokenizerSource(_required(tok, path / manifest.tokenizer), str(path / manifest.tokenizer),
                               engine_summary(path, manifest))
    if path.is_dir():
        return TokenizerSource(_required(load_tokenizer(path), path), str(path))
    if path.exists() or name.count("/") != 1 or name.startswith((".", "/")):
        raise DFlashError(f"--tokenizer: no such model or engine directory: {name}")
    return TokenizerSource(from_hub(name), name)


def engine_summary(path: Path, manifest: Manifest) -> dict[str, Any]:
    return {"dir": str(path.absolute()), "manifest_sha256": sha256_file(path / MANIFEST),
            "backend": manifest.backend, "tp_size": manifest.tp_size, "dtype": manifest.dtype,
            "quantization": manifest.quantization, "block_size": manifest.block_size,
            "target": manifest.target.get("source"), "drafter": manifest.drafter.get("source"),
            "tool_version": manifest.tool_version}


def from_hub(name: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:
        raise DFlashError(f"--tokenizer: cannot load {name!r} from the hub: {type(exc).__name__}: {exc}") from None


def _required(tokenizer, path: Path):
    if tokenizer is None:
        raise DFlashError(f"--tokenizer: {path} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
    return tokenizer
