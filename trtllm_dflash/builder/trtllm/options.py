"""The LLM-API options of a `trtllm` engine: derived from the build spec, the target and the GPU, then the
user's pass-through options (`llm_options:` in the build YAML, `--llm-option key.sub=value`) merged over them.

Every key and value is checked against TensorRT-LLM's field table (fields.py) before it is written.
Choices and their sources (NVIDIA/TensorRT-LLM@58ae162a unless named otherwise):
- speculative_config.attention_backend: TRTLLM on SM100/SM103 (TRTLLM-Gen FMHA over a paged context cache;
  tensorrt_llm/_torch/speculative/dflash_attention.py refuses other SMs), VANILLA elsewhere. FA4 is validated on
  SM90 only and needs flash-attn's CuTe DSL build (dflash_attention.py, validate_dflash_fa4_runtime), which an
  image may lack, so it is never chosen for you: --dflash-attention-backend FA4 asks for it.
- moe_config.backend for gpt-oss: TRTLLM on Blackwell, TRITON on Hopper (TensorRT-LLM's "Deployment Guide for
  GPT-OSS", MoE backend support matrix); AUTO (upstream's default) for other MoE targets and unknown GPUs.
- kv_cache_config.enable_block_reuse: off unless --prefix-reuse asks for it (reuse.py).
- The token budget: every running request's verify step (1 + max_draft_len tokens) fits one forward of
  max_num_tokens (check_token_budget).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml

from ...utils.errors import DFlashError

GPU_SM = {"b200": 100, "gb200": 100, "b300": 103, "gb300": 103, "h100": 90, "h200": 90, "gh200": 90,
          "a100": 80, "l40s": 89}
ATTENTION_BACKENDS = ("VANILLA", "TRTLLM", "FA4")
KV_CACHE_DTYPES = {"auto": None, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16}  # bytes per element; nvfp4: one fp8 scale per 16
BLACKWELL = (100, 103)
# keys the build sets from its own flags (the memory estimate and the checks depend on them)
OWNED = {
    "model": "the engine's target", "tensor_parallel_size": "--tp", "dtype": "--dtype",
    "max_batch_size": "--max-batch-size", "max_seq_len": "--max-seq-len", "max_num_tokens": "--max-num-tokens",
    "speculative_config.decoding_type": "the engine (DFlash)", "speculative_config.max_draft_len": "--block-size",
    "speculative_config.speculative_model": "the engine's drafter",
    "speculative_config.mask_token_id": "the drafter's config", "speculative_config.target_layer_ids":
    "the drafter's config", "speculative_config.draft_len_schedule": "--draft-len-schedule",
    "speculative_config.attention_backend": "--dflash-attention-backend", "kv_cache_config.dtype": "--kv-cache-dtype",
    "moe_config.backend": "--moe-backend", "cuda_graph_config.batch_sizes": "--cuda-graph-batch-sizes",
}


@dataclass(frozen=True)
class Choice:
    value: str | None
    reason: str


def gpu_sm(gpu: str | None) -> tuple[int | None, str]:
    """-> (SM version, where it came from): --gpu, else the build host's GPU, else unknown."""
    if gpu:
        return GPU_SM[gpu], f"--gpu {gpu}"
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor, f"the build host's {torch.cuda.get_device_name()}"
    return None, "no --gpu and no GPU on the build host"


def attention_backend(requested: str | None, sm: int | None, where: str) -> Choice:
    if requested:
        return Choice(requested, "--dflash-attention-backend")
    if sm in BLACKWELL:
        return Choice("TRTLLM", f"{where}: SM{sm} runs TRTLLM-Gen FMHA over a paged context cache")
    return Choice("VANILLA", f"{where}: VANILLA (FlashAttention) runs on any GPU; TRTLLM needs SM100/SM103; FA4 "
                             "(SM90 only, flash-attn CuTe DSL build) only on request")


def moe_backend(requested: str | None, model_type: str, moe: bool, sm: int | None, where: str) -> Choice:
    if requested:
        return Choice(requested, "--moe-backend")
    if not moe:
        return Choice(None, "dense target")
    if model_type == "gpt_oss" and sm in BLACKWELL:
        return Choice("TRTLLM", f"{where}: TensorRT-LLM's GPT-OSS guide names TRTLLM for Blackwell")
    if model_type == "gpt_oss" and sm == 90:
        return Choice("TRITON", f"{where}: TensorRT-LLM's GPT-OSS guide names TRITON for Hopper")
    return Choice("AUTO", f"{where}: AUTO, upstream's default, picks per model")


def parse_llm_option(text: str) -> dict:
    """'kv_cache_config.enable_partial_reuse=false' -> {'kv_cache_config': {'enable_partial_reuse': False}};
    the value is read as YAML (numbers, booleans, lists)."""
    key, sep, raw = text.partition("=")
    path = key.strip().split(".")
    if not sep or not all(path):
        raise DFlashError(f"--llm-option must be KEY[.SUB...]=VALUE, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    for part in reversed(path):
        value = {part: value}
    return value


def merge(base: dict, extra: dict) -> dict:
    """`extra` over `base`, recursing into mappings; neither is modified."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def check_pass_through(options: dict) -> None:
    """Refuse a pass-through key the build sets from a flag, naming the flag."""
    if not isinstance(options, dict):
        raise DFlashError(f"build spec: 'llm_options' must be a mapping of TensorRT-LLM options, got {options!r}")
    for key, value in options.items():
        subs = value.keys() if isinstance(value, dict) else ()
        for name in (key, *(f"{key}.{s}" for s in subs)):
            if name in OWNED:
                raise DFlashError(f"llm_options: '{name}' is set by the build ({OWNED[name]}), not by a pass-through "
                                  "option")


def check_cross_fields(options: dict) -> None:
    """Rules across fields that TensorRT-LLM's validators enforce and a per-field table cannot
    (tensorrt_llm/llmapi/llm_args.py@58ae162a): refused here so a DGX does not find them at start-up."""
    speculative = options.get("speculative_config") or {}
    if speculative.get("max_concurrency") is not None and speculative.get("draft_len_schedule") is not None:
        # DecodingBaseConfig.validate_max_concurrency_and_draft_len_schedule_mutually_exclusive
        raise DFlashError("speculative_config.max_concurrency and --draft-len-schedule are mutually exclusive in "
                          "TensorRT-LLM (a schedule already stops speculation above its largest batch size)")
    graphs = options.get("cuda_graph_config") or {}
    sizes, graph_max = graphs.get("batch_sizes"), graphs.get("max_batch_size")
    if sizes and graph_max and graph_max != max(sizes):
        # BaseCudaGraphConfig.validate_base_cuda_graph_config
        raise DFlashError(f"cuda_graph_config.max_batch_size {graph_max} must equal max(batch_sizes) {max(sizes)} "
                          "when both are given")
    largest = max(sizes) if sizes else graph_max
    if largest and largest > options["max_batch_size"]:  # graphs past the running batch are captured, never used
        raise DFlashError(f"cuda_graph_config goes up to batch {largest}, above max_batch_size "
                          f"{options['max_batch_size']}")


def check_token_budget(max_batch_size: int, max_draft_len: int, max_num_tokens: int, skip: bool) -> str:
    """TensorRT-LLM refuses at start an explicit max_batch_size x (1 + max_draft_len) above max_num_tokens
    (validate_dflash_ctx_buffer_budget; tests/unittest/_torch/speculative/hw_agnostic/
    test_dflash_config_budget.py@414ba69f, which also records that releases without the check corrupt memory at
    engine init instead). The build writes max_batch_size, so it is always explicit. -> a warning when the user set
    speculative_config.skip_ctx_buffer_budget_check, else "" or a refusal naming the flags that fix it."""
    needed = max_batch_size * (1 + max_draft_len)
    if needed <= max_num_tokens:
        return ""
    text = (f"max_batch_size {max_batch_size} x (1 + max_draft_len {max_draft_len}) = {needed} tokens exceeds "
            f"max_num_tokens {max_num_tokens} (TensorRT-LLM refuses this at start): raise --max-num-tokens to "
            f"{needed}, lower --max-batch-size to {max_num_tokens // (1 + max_draft_len)}, or lower --block-size")
    if skip:
        return f"{text} (speculative_config.skip_ctx_buffer_budget_check is set: upstream will not check)"
    raise DFlashError(text)


def kv_cache_estimation_runs(options: dict) -> bool:
    """Whether TensorRT-LLM sizes the KV pool by an estimation forward (and so allocates the DFlash arena before
    it): not for a VANILLA target attention backend nor with context parallelism (TorchLlmArgs.
    _kv_cache_estimation_runs as test_dflash_config_budget.py@414ba69f pins it; TRTLLM_SKIP_KV_CACHE_ESTIMATION=1
    skips it too, which a build cannot see)."""
    return options.get("attn_backend", "TRTLLM") != "VANILLA" and not options.get("cp_config")
