"""The drafter config.json a `trtllm` engine ships: what TensorRT-LLM's DFlash reads, stated explicitly.

TensorRT-LLM reads the DFlash fields only from the drafter's `dflash_config` (NVIDIA/TensorRT-LLM@58ae162a):
- `target_layer_ids`: `dflash_config.target_layer_ids`, else None (tensorrt_llm/_torch/models/modeling_dflash.py,
  DFlashForCausalLM.__init__; tensorrt_llm/llmapi/llm_args.py, TorchLlmArgs.validate_speculative_config);
- `mask_token_id`: `dflash_config.mask_token_id`, else a top-level `mask_token_id`, else `vocab_size` (same files);
- `block_size` (the trained block width it checks max_draft_len + 1 against): `dflash_config.block_size`, else a
  top-level `block_size` (modeling_dflash.py; the check is in _torch/speculative/dflash.py, _lazy_init_ctx_buffers).
This project also reads top-level `target_layer_ids` and derives ids from `num_target_layers`; a drafter that
relies on either would reach TensorRT-LLM with `target_layer_ids=None`. So the engine's copy carries the values
this project resolved, under `dflash_config`. The user's files are never edited.
"""

from __future__ import annotations

import copy

from ..config import DrafterConfig


def trtllm_drafter_config(drafter: DrafterConfig, base: dict) -> dict:
    """-> `base` (the drafter's config.json, any format already converted to this layout) with
    `dflash_config.{target_layer_ids, mask_token_id, block_size}` set from the resolved `drafter`."""
    out = copy.deepcopy(base)
    dflash = dict(out.get("dflash_config") or {})
    dflash.update(target_layer_ids=list(drafter.target_layer_ids), mask_token_id=drafter.mask_token_id,
                  block_size=drafter.block_size)
    out["dflash_config"] = dflash
    return out
