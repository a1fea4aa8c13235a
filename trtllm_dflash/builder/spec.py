"""The build specification: flags and/or a YAML file, validated once, errors naming the field."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..checkpoint.loader import DTYPES
from ..utils.errors import DFlashError
from ..utils.settings_file import read_settings
from .backend import BACKENDS, backend_for

QUANTS = ("none", "fp8", "nvfp4")
# settings only a trtllm build reads, with their defaults (the torch backend refuses them rather than ignore them)
TRTLLM_ONLY = {"gpu": None, "gpu_memory_gib": 80.0, "dflash_attention_backend": None, "moe_backend": None,
               "kv_cache_dtype": "auto", "draft_len_schedule": None, "rejection_sampling": False,
               "chunked_prefill": False, "cuda_graph_batch_sizes": None, "llm_options": {}, "trtllm_version": None,
               "prefix_reuse": None}


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
    max_seq_len: int | None = None  # default: torch, the target's max_position_embeddings; trtllm, at most 8192
    max_num_tokens: int = 8192
    force: bool = False
    # trtllm only
    gpu: str | None = None  # b200, b300, h100, h200, ...: picks attention/MoE backends; default: the build host's
    gpu_memory_gib: float = 80.0  # per GPU: weights + DFlash arena must fit
    dflash_attention_backend: str | None = None  # VANILLA | TRTLLM | FA4; default: from the GPU
    moe_backend: str | None = None  # moe_config.backend; default: from the target and GPU
    kv_cache_dtype: str = "auto"  # auto | fp8 | nvfp4
    draft_len_schedule: str | None = None  # a draft-length schedule file (trtllm_dflash/draft_length/schedule.py)
    rejection_sampling: bool = False  # speculative_config.use_rejection_sampling (T > 0; upstream prototype)
    chunked_prefill: bool = False
    cuda_graph_batch_sizes: list[int] | None = None
    llm_options: dict = field(default_factory=dict)  # any other TensorRT-LLM option, checked against its table
    trtllm_version: str | None = None  # the TensorRT-LLM release served on; picks the field table (default: newest)
    prefix_reuse: int | None = None  # KV block reuse, recomputing this many prompt tokens for the drafter (>= 1.4)

    def __post_init__(self):
        for name in ("target", "drafter", "output"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise DFlashError(f"build spec: '{name}' is required (a path or hub id)")
        check_choice("backend", self.backend, tuple(BACKENDS))
        check_choice("dtype", self.dtype, tuple(DTYPES))
        check_choice("quant", self.quant, QUANTS)
        for name in ("tp", "max_batch_size", "max_num_tokens", "block_size", "max_seq_len"):
            check_positive_int(name, getattr(self, name))
        if not isinstance(self.force, bool):  # YAML `force: "no"` is a string, not false
            raise DFlashError(f"build spec: 'force' must be true or false, got {self.force!r}")
        if self.calib is not None and (not isinstance(self.calib, str) or not self.calib):
            raise DFlashError(f"build spec: 'calib' must be a file path, got {self.calib!r}")
        if self.calib is not None and self.quant == "none":
            raise DFlashError("build spec: 'calib' is only used with quant fp8 or nvfp4")
        backend_for(self.backend).check_spec(self)

    @property
    def trtllm_table(self):
        """The field table of the TensorRT-LLM release this engine is built for (builder/trtllm/tables.py)."""
        from .trtllm.tables import table_for

        return table_for(self.trtllm_version)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_sources(cls, yaml_path: str | None, overrides: dict[str, Any]) -> BuildSpec:
        """Settings from a YAML file, then flags (flags win); unknown keys are errors. `overrides` may carry
        `llm_option`: a list of 'key.sub=value' strings merged over the file's `llm_options`."""
        from .trtllm.options import merge, parse_llm_option

        data = read_settings(yaml_path, f"no such build config file: {yaml_path}", yaml_path,
                             "build settings") if yaml_path else {}
        overrides = dict(overrides)
        for text in overrides.pop("llm_option", None) or []:
            data["llm_options"] = merge(data.get("llm_options") or {}, parse_llm_option(text))
        data.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DFlashError(f"build spec: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        missing = [k for k in ("target", "drafter", "output") if k not in data]
        if missing:
            raise DFlashError(f"build spec: '{missing[0]}' is required (flag --{missing[0]} or the YAML key)")
        return cls(**data)


def check_choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise DFlashError(f"build spec: unknown {name} {value!r} (choose from {', '.join(options)})")


def check_positive_int(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise DFlashError(f"build spec: '{name}' must be a positive integer, got {value!r}")
