"""The drafter a `trtllm` engine ships: its config stating what TensorRT-LLM's DFlash reads, its tensors in the
build dtype.

TensorRT-LLM reads the DFlash fields only from the drafter's `dflash_config` (NVIDIA/TensorRT-LLM@58ae162a):
- `target_layer_ids`: `dflash_config.target_layer_ids`, else None (tensorrt_llm/_torch/models/modeling_dflash.py,
  DFlashForCausalLM.__init__; tensorrt_llm/llmapi/llm_args.py, TorchLlmArgs.validate_speculative_config);
- `mask_token_id`: `dflash_config.mask_token_id`, else a top-level `mask_token_id`, else `vocab_size` (same files);
- `block_size` (the trained block width it checks max_draft_len + 1 against): `dflash_config.block_size`, else a
  top-level `block_size` (modeling_dflash.py; the check is in _torch/speculative/dflash.py, _lazy_init_ctx_buffers).
This project also reads top-level `target_layer_ids` and derives ids from `num_target_layers`; a drafter that
relies on either would reach TensorRT-LLM with `target_layer_ids=None`. So the engine's copy carries the values
this project resolved, under `dflash_config`. The user's files are never edited.

TensorRT-LLM allocates the drafter's context in the dtype of the stored `fc` weight, and the TRTLLM attention
backend checks the drafter's dtype against its kernels (dflash.py@00679c66, _lazy_init_ctx_buffers,
validate_dflash_trtllm_gen_runtime): a float32 drafter beside `dtype: bfloat16` doubles the arena or fails there.
So every floating-point drafter tensor is cast to the build dtype and the config says so; a drafter holding other
tensors (quantized weights) is refused.
"""

from __future__ import annotations

import copy
from pathlib import Path

from ...checkpoint.drafter import DrafterCheckpoint, write_drafter
from ...checkpoint.hf import tensor_specs, weight_files
from ...checkpoint.loader import DTYPES
from ...config.model import DrafterConfig
from ...utils.errors import DFlashError
from .memory import FLOAT_DTYPES


def trtllm_drafter_config(drafter: DrafterConfig, base: dict, dtype: str) -> dict:
    """-> `base` (the drafter's config.json, any format already converted to this layout) with
    `dflash_config.{target_layer_ids, mask_token_id, block_size}` set from the resolved `drafter`, and its dtype."""
    out = copy.deepcopy(base)
    dflash = dict(out.get("dflash_config") or {})
    dflash.update(target_layer_ids=list(drafter.target_layer_ids), mask_token_id=drafter.mask_token_id,
                  block_size=drafter.block_size)
    out["dflash_config"] = dflash
    out["torch_dtype"] = dtype
    if "dtype" in out:  # transformers 5 writes `dtype`; TensorRT-LLM reads either
        out["dtype"] = dtype
    return out


def dropped_tensors(checkpoint: DrafterCheckpoint) -> tuple[str, ...]:
    """Tensors of the input drafter the engine's copy leaves out: a speculators file's copies of its verifier's
    embedding and head (DrafterCheckpoint.tensors)."""
    if checkpoint.format != "speculators":
        return ()
    from ...checkpoint.speculators import VERIFIER_OWNED

    return VERIFIER_OWNED


def check_drafter_dtypes(checkpoint: DrafterCheckpoint, dtype: str) -> None:
    """Before anything is written: one line naming the first drafter tensor that is not floating point (read from
    the safetensors headers)."""
    for path in weight_files(checkpoint.path):
        for name, (stored, _) in tensor_specs(path).items():
            if stored not in FLOAT_DTYPES and name not in dropped_tensors(checkpoint):
                raise DFlashError(f"drafter tensor '{name}' in {path} is {stored}: a trtllm engine's drafter is stored "
                                  f"in the build dtype ({dtype}); give an unquantized drafter")


def write_trtllm_drafter(checkpoint: DrafterCheckpoint, dst: Path, dtype: str) -> None:
    """The drafter in z-lab's layout, which TensorRT-LLM reads, whatever the input's format: its own tensors (a
    speculators file's verifier copies left out) cast to `dtype` (check_drafter_dtypes ran first), and the config
    stating what TensorRT-LLM reads."""
    tensors = {name: tensor.to(DTYPES[dtype]) for name, tensor in checkpoint.tensors().items()}
    write_drafter(dst, trtllm_drafter_config(checkpoint.config, checkpoint.layout, dtype), tensors)
