"""The build specification: flags and/or a YAML file, validated once, errors naming the field."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..errors import DFlashError
from ..settings_file import read_settings
from ..loading import DTYPES

BACKENDS = ("torch", "trtllm")
QUANTS = ("none", "fp8", "nvfp4")


@dataclass(frozen=True)
class BuildSpec:
    target: str
    drafter: str
    output: str
    backend: str = "torch"
    tp: int = 1
    dtype: str = "bfloat16"
    quant: str = "none"
    calib: str | None = None  # JSONL of prompts for quantization; default: a small built-in set
    block_size: int | None = None  # default: the drafter's trained block_size
    max_batch_size: int = 64
    max_seq_len: int | None = None  # default: the target's max_position_embeddings
    max_num_tokens: int = 8192
    force: bool = False

    def __post_init__(self):
        for name in ("target", "drafter", "output"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise DFlashError(f"build spec: '{name}' is required (a path or hub id)")
        _choice("backend", self.backend, BACKENDS)
        _choice("dtype", self.dtype, tuple(DTYPES))
        _choice("quant", self.quant, QUANTS)
        for name in ("tp", "max_batch_size", "max_num_tokens", "block_size", "max_seq_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise DFlashError(f"build spec: '{name}' must be a positive integer, got {value!r}")
        if not isinstance(self.force, bool):  # YAML `force: "no"` is a string, not false
            raise DFlashError(f"build spec: 'force' must be true or false, got {self.force!r}")
        if self.calib is not None and (not isinstance(self.calib, str) or not self.calib):
            raise DFlashError(f"build spec: 'calib' must be a file path, got {self.calib!r}")
        if self.quant != "none" and self.backend == "torch":
            raise DFlashError(f"build spec: quant {self.quant!r} needs backend 'trtllm' (the torch backend runs "
                              "unquantized weights)")
        if self.calib is not None and self.quant == "none":
            raise DFlashError("build spec: 'calib' is only used with quant fp8 or nvfp4")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_sources(cls, yaml_path: str | None, overrides: dict[str, Any]) -> BuildSpec:
        """Settings from a YAML file, then flags (flags win); unknown keys are errors."""
        data = read_settings(yaml_path, f"no such build config file: {yaml_path}", yaml_path,
                             "build settings") if yaml_path else {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DFlashError(f"build spec: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        missing = [k for k in ("target", "drafter", "output") if k not in data]
        if missing:
            raise DFlashError(f"build spec: '{missing[0]}' is required (flag --{missing[0]} or the YAML key)")
        return cls(**data)


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise DFlashError(f"build spec: unknown {name} {value!r} (choose from {', '.join(options)})")
