"""The build specification: flags and/or a YAML file, validated once, errors naming the field."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..checkpoint.loader import DTYPES
from ..utils.errors import DFlashError
from ..utils.settings_file import read_settings

BACKENDS = ("torch", "trtllm")
QUANTS = ("none", "fp8", "nvfp4")
# settings only a trtllm build reads, with their defaults (a torch build refuses them rather than ignore them)
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
        _choice("backend", self.backend, BACKENDS)
        _choice("dtype", self.dtype, tuple(DTYPES))
        _choice("quant", self.quant, QUANTS)
        for name in ("tp", "max_batch_size", "max_num_tokens", "block_size", "max_seq_len"):
            _positive_int(name, getattr(self, name))
        if not isinstance(self.force, bool):  # YAML `force: "no"` is a string, not false
            raise DFlashError(f"build spec: 'force' must be true or false, got {self.force!r}")
        if self.calib is not None and (not isinstance(self.calib, str) or not self.calib):
            raise DFlashError(f"build spec: 'calib' must be a file path, got {self.calib!r}")
        if self.quant != "none" and self.backend == "torch":
            raise DFlashError(f"build spec: quant {self.quant!r} needs backend 'trtllm' (the torch backend runs "
                              "unquantized weights)")
        if self.calib is not None and self.quant == "none":
            raise DFlashError("build spec: 'calib' is only used with quant fp8 or nvfp4")
        if self.backend == "trtllm":
            self._check_trtllm()
        else:
            changed = [k for k, default in TRTLLM_ONLY.items() if getattr(self, k) != default]
            if changed:
                raise DFlashError(f"build spec: '{changed[0]}' is only used with backend 'trtllm'")

    @property
    def trtllm_table(self):
        """The field table of the TensorRT-LLM release this engine is built for (trtllm/tables.py)."""
        from .trtllm.tables import table_for

        return table_for(self.trtllm_version)

    def _check_trtllm(self) -> None:
        from .trtllm.fields import literal_choices
        from .trtllm.options import ATTENTION_BACKENDS, GPU_SM, KV_CACHE_DTYPES, check_pass_through
        from .trtllm.reuse import check_prefix_reuse

        if self.trtllm_version is not None and (not isinstance(self.trtllm_version, str) or not self.trtllm_version):
            raise DFlashError(f"build spec: 'trtllm_version' must be a version string, got {self.trtllm_version!r}")
        table = self.trtllm_table
        if self.gpu is not None:
            _choice("gpu", self.gpu, tuple(GPU_SM))
        if self.dflash_attention_backend is not None:
            _choice("dflash_attention_backend", self.dflash_attention_backend, ATTENTION_BACKENDS)
        if self.moe_backend is not None:
            _choice("moe_backend", self.moe_backend, literal_choices(table, "MoeConfig", "backend"))
        check_prefix_reuse(self.prefix_reuse, table)
        _choice("kv_cache_dtype", self.kv_cache_dtype, tuple(KV_CACHE_DTYPES))
        for name in ("rejection_sampling", "chunked_prefill"):  # YAML `"no"` is a string, not false
            if not isinstance(getattr(self, name), bool):
                raise DFlashError(f"build spec: '{name}' must be true or false, got {getattr(self, name)!r}")
        if self.draft_len_schedule is not None and (not isinstance(self.draft_len_schedule, str)
                                                    or not self.draft_len_schedule):
            raise DFlashError(f"build spec: 'draft_len_schedule' must be a file path, got {self.draft_len_schedule!r}")
        gib = self.gpu_memory_gib
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or gib <= 0:
            raise DFlashError(f"build spec: 'gpu_memory_gib' must be a positive number, got {gib!r}")
        sizes = self.cuda_graph_batch_sizes
        if sizes is not None:
            if not isinstance(sizes, list) or not sizes:
                raise DFlashError(f"build spec: 'cuda_graph_batch_sizes' must be a list of batch sizes, got {sizes!r}")
            for size in sizes:
                _positive_int("cuda_graph_batch_sizes", size)
            if max(sizes) > self.max_batch_size:
                raise DFlashError(f"build spec: cuda_graph_batch_sizes {sizes} go above max_batch_size "
                                  f"{self.max_batch_size}")
        check_pass_through(self.llm_options)

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


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise DFlashError(f"build spec: unknown {name} {value!r} (choose from {', '.join(options)})")


def _positive_int(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise DFlashError(f"build spec: '{name}' must be a positive integer, got {value!r}")
