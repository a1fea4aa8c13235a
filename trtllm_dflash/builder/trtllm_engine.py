"""The `trtllm` backend: what `trtllm-serve --config` and Triton's `llmapi` model need.

Layout: target/ (a Hugging Face checkpoint, Model Optimizer-quantized with --quant), drafter/
(the published DFlash layout), llm_options.yaml (LLM API options, DFlash speculative config).
Nothing here imports tensorrt_llm; `dflash-build verify` parses the YAML with it where present.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from ..checkpoint import weight_files
from ..drafter_checkpoint import write_drafter
from ..errors import DFlashError
from .builder import BuildPlan, copy_tokenizer
from .trtllm_drafter import trtllm_drafter_config
from .trtllm_fields import MIN_TENSORRT_LLM, check_options

OPTIONS = "llm_options.yaml"


def write_trtllm_engine(plan: BuildPlan, tmp: Path) -> dict:
    spec = plan.spec
    if plan.block_size < 2:
        raise DFlashError("block size must be at least 2 for the trtllm backend (max_draft_len = block size - 1 > 0)")
    details: dict = {}
    target = tmp / "target"
    if spec.quant == "none":
        copy_checkpoint(plan.target_dir, target)
    else:
        from .quantize import quantize_target

        details.update(quantize_target(plan.target_dir, target, spec.quant, spec.dtype, spec.calib))
    copy_tokenizer(plan.target_dir, target)
    write_drafter_copy(plan, tmp / "drafter")
    options = llm_options(plan)
    check_options(options)
    final = plan.final_dir
    header = (f"# TensorRT-LLM LLM API options for this engine (TensorRT-LLM >= {MIN_TENSORRT_LLM}).\n"
              f"# trtllm-serve {final / 'target'} --backend pytorch --config {final / OPTIONS}\n")
    (tmp / OPTIONS).write_text(header + yaml.safe_dump(options, sort_keys=False))
    return {**details, "tokenizer": "target", "options": OPTIONS, "min_tensorrt_llm": MIN_TENSORRT_LLM,
            "serve": f"trtllm-serve {final / 'target'} --backend pytorch --config {final / OPTIONS}"}


def llm_options(plan: BuildPlan) -> dict:
    spec = plan.spec
    return {
        "tensor_parallel_size": spec.tp,
        "dtype": spec.dtype,
        "max_batch_size": spec.max_batch_size,
        "max_num_tokens": spec.max_num_tokens,
        "max_seq_len": plan.max_seq_len,  # DFlash's draft-context arena is dense in it
        "speculative_config": {"decoding_type": "DFlash", "max_draft_len": plan.block_size - 1,
                               "speculative_model": str(plan.final_dir / "drafter")},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.85},
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": spec.max_batch_size},
    }


def write_drafter_copy(plan: BuildPlan, dst: Path) -> None:
    """The drafter in z-lab's layout, which TensorRT-LLM reads, whatever the input's format: a z-lab directory is
    copied file by file; a speculators one is rewritten with its own tensors only (no verifier copies)."""
    config = trtllm_drafter_config(plan.drafter, plan.drafter_json)
    if plan.drafter_checkpoint.format == "zlab":
        copy_checkpoint(plan.drafter_dir, dst, config)
    else:
        write_drafter(dst, config, plan.drafter_checkpoint.tensors())


def copy_checkpoint(src: Path, dst: Path, config: dict | None = None) -> None:
    """config (or `config` written in its place), generation config, every weight file and the shard index
    of a HF directory."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors.index.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    if config is not None:
        (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in weight_files(src):
        shutil.copy2(f, dst / f.name)
