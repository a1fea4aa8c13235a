"""The TensorRT-LLM LLM-API keys our options YAML may use, each with where TensorRT-LLM defines it.

TensorRT-LLM's `BaseLlmArgs` forbids unknown keys (pydantic `extra="forbid"`), so a YAML with a
key outside this list would fail inside the container; `check_options` catches that at build time.
Sources (NVIDIA/TensorRT-LLM): `tensorrt_llm/llmapi/llm_args.py` (TorchLlmArgs, KvCacheConfig,
CudaGraphConfig, DFlashDecodingConfig, DecodingBaseConfig); the DFlash runtime check
`tensorrt_llm/_torch/speculative/dflash.py` (block width max_draft_len + 1 <= trained block_size);
docs: tensorrt_llm.llmapi.DFlashDecodingConfig (listed from 1.3.0rc27).
"""

from __future__ import annotations

from typing import Any

from ..errors import DFlashError

LLM_API = "tensorrt_llm/llmapi/llm_args.py"

TOP_LEVEL = {
    "tensor_parallel_size": f"{LLM_API}: BaseLlmArgs.tensor_parallel_size (int, default 1)",
    "pipeline_parallel_size": f"{LLM_API}: BaseLlmArgs.pipeline_parallel_size (int, default 1)",
    "dtype": f"{LLM_API}: BaseLlmArgs.dtype (str, default 'auto')",
    "max_batch_size": f"{LLM_API}: BaseLlmArgs.max_batch_size (int, default 2048)",
    "max_num_tokens": f"{LLM_API}: BaseLlmArgs.max_num_tokens (int, default 8192)",
    "max_seq_len": f"{LLM_API}: BaseLlmArgs.max_seq_len (int, default None); DFlash's draft-context arena is "
                   "dense in max_seq_len, so set it",
    "backend": f"{LLM_API}: TorchLlmArgs.backend (Literal['pytorch'])",
    "speculative_config": f"{LLM_API}: BaseLlmArgs.speculative_config (union keyed by decoding_type)",
    "kv_cache_config": f"{LLM_API}: BaseLlmArgs.kv_cache_config (KvCacheConfig)",
    "cuda_graph_config": f"{LLM_API}: TorchLlmArgs.cuda_graph_config (CudaGraphConfig)",
    "trust_remote_code": f"{LLM_API}: BaseLlmArgs.trust_remote_code (bool)",
    "enable_chunked_prefill": f"{LLM_API}: BaseLlmArgs.enable_chunked_prefill (bool)",
}
SPECULATIVE_DFLASH = {
    "decoding_type": f"{LLM_API}: DFlashDecodingConfig.decoding_type (Literal['DFlash'])",
    "max_draft_len": f"{LLM_API}: DecodingBaseConfig.max_draft_len (must be set and > 0)",
    "speculative_model": f"{LLM_API}: DecodingBaseConfig.speculative_model (alias speculative_model_dir)",
    "mask_token_id": f"{LLM_API}: DFlashDecodingConfig.mask_token_id (default: the drafter config's)",
    "target_layer_ids": f"{LLM_API}: DFlashDecodingConfig.target_layer_ids (default: the drafter config's)",
}
KV_CACHE = {
    "free_gpu_memory_fraction": f"{LLM_API}: KvCacheConfig.free_gpu_memory_fraction (0-1, default 0.9)",
    "enable_block_reuse": f"{LLM_API}: KvCacheConfig.enable_block_reuse (bool)",
    "dtype": f"{LLM_API}: KvCacheConfig.dtype (auto|fp8|nvfp4)",
}
CUDA_GRAPH = {
    "enable_padding": f"{LLM_API}: CudaGraphConfig.enable_padding (bool)",
    "max_batch_size": f"{LLM_API}: CudaGraphConfig.max_batch_size (int; must equal max(batch_sizes) if both)",
    "batch_sizes": f"{LLM_API}: CudaGraphConfig.batch_sizes (list[int])",
}
NESTED = {"speculative_config": SPECULATIVE_DFLASH, "kv_cache_config": KV_CACHE, "cuda_graph_config": CUDA_GRAPH}

#: the first TensorRT-LLM release whose documentation lists DFlashDecodingConfig
MIN_TENSORRT_LLM = "1.3.0rc27"


def check_options(options: dict[str, Any]) -> None:
    """Raise naming the first key TensorRT-LLM's argument classes would reject."""
    for key, value in options.items():
        if key not in TOP_LEVEL:
            raise DFlashError(f"TensorRT-LLM options: key {key!r} is not in the documented LLM API field list")
        allowed = NESTED.get(key)
        if allowed is None:
            continue
        if not isinstance(value, dict):
            raise DFlashError(f"TensorRT-LLM options: {key} must be a mapping, got {value!r}")
        for sub in value:
            if sub not in allowed:
                raise DFlashError(f"TensorRT-LLM options: key {key}.{sub} is not in the documented field list")
    spec = options.get("speculative_config")
    if spec is not None and (spec.get("decoding_type") != "DFlash" or not spec.get("max_draft_len")):
        raise DFlashError("TensorRT-LLM options: speculative_config needs decoding_type DFlash and max_draft_len > 0")
