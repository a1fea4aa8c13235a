"""The `trtllm` backend: what `trtllm-serve --config` and Triton's `llmapi` model need.

Layout: target/ (a Hugging Face checkpoint, Model Optimizer-quantized with --quant), drafter/ (the published
DFlash layout, its config stating what TensorRT-LLM reads: trtllm_drafter.py), llm_options.yaml (LLM-API options,
DFlash speculative config; paths relative to the engine so it can move). No TensorRT engine is built: TensorRT-LLM
runs DFlash only on its PyTorch backend. Nothing here imports tensorrt_llm; `dflash-build verify` parses the YAML
with it where present.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from ..checkpoint import weight_files
from ..draft_len_schedule import read_schedule
from ..drafter_checkpoint import write_drafter
from ..errors import DFlashError
from ..loading import DTYPES
from .builder import BuildPlan, copy_tokenizer
from .trtllm_drafter import trtllm_drafter_config
from .trtllm_fields import MIN_TENSORRT_LLM, PINNED, check_options
from .trtllm_memory import MemoryInputs, checkpoint_bytes, plan_memory
from .trtllm_options import (KV_CACHE_DTYPES, attention_backend, block_reuse_warning, check_cross_fields,
                             check_pass_through, gpu_sm, merge, moe_backend)

OPTIONS = "llm_options.yaml"
QUANT_ITEMSIZE = {"none": None, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16}  # bytes per quantized linear weight
SERVE = f"cd ENGINE_DIR && trtllm-serve target --backend pytorch --config {OPTIONS}"


def write_trtllm_engine(plan: BuildPlan, tmp: Path) -> dict:
    spec = plan.spec
    options, details = trtllm_options(plan)  # every check before the first byte is copied
    target = tmp / "target"
    if spec.quant == "none":
        copy_checkpoint(plan.target_dir, target)
    else:
        from .quantize import quantize_target

        details.update(quantize_target(plan.target_dir, target, spec.quant, spec.dtype, spec.calib))
    copy_tokenizer(plan.target_dir, target)
    write_drafter_copy(plan, tmp / "drafter")
    header = (f"# TensorRT-LLM LLM-API options for this engine: TensorRT-LLM >= {MIN_TENSORRT_LLM}, keys checked "
              f"against {PINNED}.\n# Paths are relative to the engine directory (it can be moved); from there run\n"
              f"#   {SERVE.replace('ENGINE_DIR', '<this directory>')}\n"
              "# dflash-serve and its launch scripts write the same options with absolute paths.\n")
    (tmp / OPTIONS).write_text(header + yaml.safe_dump(options, sort_keys=False))
    return {**details, "tokenizer": "target", "options": OPTIONS, "min_tensorrt_llm": MIN_TENSORRT_LLM,
            "checked_against": PINNED, "serve": SERVE}


def trtllm_options(plan: BuildPlan) -> tuple[dict, dict]:
    """-> (the options, manifest details: choices with reasons, memory estimate, warnings). Raises on anything
    TensorRT-LLM would reject or that cannot fit the GPU."""
    spec, target, drafter = plan.spec, plan.target, plan.drafter
    if plan.block_size < 2:
        raise DFlashError("block size must be at least 2 for the trtllm backend (max_draft_len = block size - 1 > 0)")
    max_draft_len = plan.block_size - 1
    check_pass_through(spec.llm_options)
    schedule = read_schedule(spec.draft_len_schedule) if spec.draft_len_schedule else None
    if schedule:
        schedule.check_for(max_draft_len)
    sm, where = gpu_sm(spec.gpu)
    attention = attention_backend(spec.dflash_attention_backend, sm, where)
    moe = moe_backend(spec.moe_backend, target.model_type, target.moe, sm, where)
    memory = plan_memory(memory_inputs(plan, attention.value))
    speculative = {"decoding_type": "DFlash", "max_draft_len": max_draft_len, "speculative_model": "drafter",
                   "mask_token_id": drafter.mask_token_id, "target_layer_ids": list(drafter.target_layer_ids),
                   "attention_backend": attention.value}
    if schedule:
        speculative["draft_len_schedule"] = schedule.as_option()
    if spec.rejection_sampling:
        speculative["use_rejection_sampling"] = True
    kv_cache = {"free_gpu_memory_fraction": memory.fraction, "enable_block_reuse": False}
    if spec.kv_cache_dtype != "auto":
        kv_cache["dtype"] = spec.kv_cache_dtype
    graphs = {"enable_padding": True, **({"batch_sizes": spec.cuda_graph_batch_sizes} if spec.cuda_graph_batch_sizes
                                         else {"max_batch_size": spec.max_batch_size})}
    base = {"tensor_parallel_size": spec.tp, "dtype": spec.dtype, "max_batch_size": spec.max_batch_size,
            "max_num_tokens": spec.max_num_tokens, "max_seq_len": plan.max_seq_len, "speculative_config": speculative,
            "kv_cache_config": kv_cache, "cuda_graph_config": graphs}
    if moe.value:
        base["moe_config"] = {"backend": moe.value}
    if spec.chunked_prefill:
        base["enable_chunked_prefill"] = True
    options = merge(base, spec.llm_options)
    warnings = check_options(options)
    check_cross_fields(options)
    warnings += [w for w in (memory.warning, block_reuse_warning(options), blackwell_warning(spec, sm),
                             untested_warning(target)) if w]
    choices = {"attention_backend": vars(attention), "moe_backend": vars(moe),
               "max_seq_len": plan.max_seq_len, "target": f"{target.architecture} ({target.status}: {target.source})"}
    if schedule:
        choices["draft_len_schedule"] = {"file": spec.draft_len_schedule, "source": schedule.source}
    return options, {"memory": memory.to_dict(), "choices": choices, "warnings": warnings}


def options_at(engine_dir: Path, options: dict) -> dict:
    """The options with the engine-relative drafter path made absolute for an engine now at `engine_dir`: what
    dflash-serve writes where it runs (a moved or mounted engine still finds its drafter)."""
    out = merge(options, {})
    speculative = out.get("speculative_config") or {}
    model = speculative.get("speculative_model")
    if isinstance(model, str) and not Path(model).is_absolute():
        speculative["speculative_model"] = str(Path(engine_dir).absolute() / model)
    return out


def read_options_at(engine_dir: Path) -> dict:
    """The engine's options file, paths made absolute for where the engine is now."""
    return options_at(engine_dir, yaml.safe_load((Path(engine_dir) / OPTIONS).read_text()))


def memory_inputs(plan: BuildPlan, backend: str) -> MemoryInputs:
    spec, target, drafter = plan.spec, plan.target, plan.drafter
    itemsize = DTYPES[spec.dtype].itemsize
    weights = (checkpoint_bytes(plan.target_dir, itemsize, QUANT_ITEMSIZE[spec.quant])
               + checkpoint_bytes(plan.drafter_dir, itemsize, exclude=drafter_copies_dropped(plan)))
    user_fraction = (spec.llm_options.get("kv_cache_config") or {}).get("free_gpu_memory_fraction")
    return MemoryInputs(
        tp=spec.tp, max_batch_size=spec.max_batch_size, max_seq_len=plan.max_seq_len,
        max_num_tokens=spec.max_num_tokens, max_draft_len=plan.block_size - 1, attention_backend=backend,
        weight_bytes=weights, target_kv_layers=target.kv_layers, target_kv_heads=target.num_key_value_heads,
        target_head_dim=target.head_dim, kv_itemsize=KV_CACHE_DTYPES[spec.kv_cache_dtype] or itemsize,
        hidden_size=target.hidden_size, num_capture_layers=len(drafter.target_layer_ids),
        drafter_layers=drafter.num_hidden_layers, drafter_kv_heads=drafter.num_key_value_heads,
        drafter_head_dim=drafter.head_dim, drafter_max_positions=drafter.max_position_embeddings, itemsize=itemsize,
        budget_gib=spec.gpu_memory_gib, fraction=user_fraction)


def drafter_copies_dropped(plan: BuildPlan) -> tuple[str, ...]:
    """Tensors of the input drafter that the engine's copy leaves out (write_drafter_copy)."""
    if plan.drafter_checkpoint.format != "speculators":
        return ()
    from ..speculators_format import VERIFIER_OWNED

    return VERIFIER_OWNED


def blackwell_warning(spec, sm: int | None) -> str:
    wants = [what for what, on in (("--quant nvfp4", spec.quant == "nvfp4"),
                                   ("--kv-cache-dtype nvfp4", spec.kv_cache_dtype == "nvfp4")) if on]
    if not wants or (sm is not None and sm >= 100):
        return ""
    return f"{' and '.join(wants)} need Blackwell (SM100+) GPUs" + (f"; the target GPU is SM{sm}" if sm else "")


def untested_warning(target) -> str:
    if target.status != "untested":
        return ""
    return f"{target.architecture}: upstream has not tested DFlash on it ({target.source})"


def write_drafter_copy(plan: BuildPlan, dst: Path) -> None:
    """The drafter in z-lab's layout, which TensorRT-LLM reads, whatever the input's format: a z-lab directory is
    copied file by file; a speculators one is rewritten with its own tensors only (no verifier copies)."""
    config = trtllm_drafter_config(plan.drafter, plan.drafter_json)
    if plan.drafter_checkpoint.format == "zlab":
        copy_checkpoint(plan.drafter_dir, dst, config)
    else:
        write_drafter(dst, config, plan.drafter_checkpoint.tensors())


def copy_checkpoint(src: Path, dst: Path, config: dict | None = None) -> None:
    """Every JSON file (config, generation and processor configs, shard index) and weight file of a HF directory;
    `config` is written as its config.json when given."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.glob("*.json")):
        shutil.copy2(path, dst / path.name)
    if config is not None:
        (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in weight_files(src):
        shutil.copy2(f, dst / f.name)
