"""The `trtllm` backend: what `trtllm-serve --config` and Triton's `llmapi` model need.

Layout: target/ (a Hugging Face checkpoint, Model Optimizer-quantized with --quant), drafter/ (the published
DFlash layout in the build dtype, its config stating what TensorRT-LLM reads: drafter.py), llm_options.yaml
(LLM-API options, DFlash speculative config, checked against the field table of the TensorRT-LLM release chosen
with --trtllm-version). No TensorRT engine is built: TensorRT-LLM runs DFlash only on its PyTorch backend. Nothing
here imports tensorrt_llm; `dflash-build verify` parses the YAML with it where present.

TensorRT-LLM resolves a relative `speculative_model` against the working directory, and takes one that does not
exist there for a Hugging Face Hub id (tensorrt_llm/llmapi/llm_args.py@00043967, _ModelWrapper.__post_init__;
llmapi/llm_utils.py, CachedModelLoader.__call__; trtllm-serve's --config YAML is merged as read,
update_llm_args_with_extra_options). llm_options.yaml keeps the drafter engine-relative so the directory can move;
every file a deployment reads (`dflash-build options`, dflash-serve's model.yaml and launch options) is written
with absolute paths where it runs: options_at.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml

from ...checkpoint.hf import weight_files
from ...checkpoint.loader import DTYPES
from ...draft_length.schedule import read_schedule
from ...utils.errors import DFlashError
from ..plan import BuildPlan, copy_tokenizer
from .drafter import check_drafter_dtypes, dropped_tensors, write_trtllm_drafter
from .fields import check_options
from .memory import MemoryInputs, checkpoint_bytes, context_rules, plan_memory
from .options import (
    KV_CACHE_DTYPES,
    attention_backend,
    check_cross_fields,
    check_pass_through,
    check_token_budget,
    gpu_sm,
    kv_cache_estimation_runs,
    merge,
    moe_backend,
)
from .reuse import reuse_options, reuse_warning
from .tables import FieldTable

OPTIONS = "llm_options.yaml"
QUANT_ITEMSIZE = {"none": None, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16}  # bytes per quantized linear weight
SERVE = ("dflash-build options ENGINE_DIR --output OPTIONS_FILE && "
         "trtllm-serve ENGINE_DIR/target --backend pytorch --config OPTIONS_FILE")


def write_trtllm_engine(plan: BuildPlan, tmp: Path) -> dict:
    spec, table = plan.spec, plan.spec.trtllm_table
    options, details = trtllm_options(plan, table)  # every check before the first byte is copied
    target = tmp / "target"
    if spec.quant == "none":
        copy_checkpoint(plan.target_dir, target)
    else:
        from .quantize import quantize_target

        details.update(quantize_target(plan.target_dir, target, spec.quant, spec.dtype, spec.calib))
    copy_tokenizer(plan.target_dir, target)
    write_trtllm_drafter(plan.drafter_checkpoint, tmp / "drafter", spec.dtype)
    (tmp / OPTIONS).write_text(options_header(table) + yaml.safe_dump(options, sort_keys=False))
    return {**details, "tokenizer": "target", "options": OPTIONS, "min_tensorrt_llm": table.version,
            "tensorrt_llm": table.record(), "serve": SERVE}


def options_header(table: FieldTable) -> str:
    return (f"# TensorRT-LLM LLM-API options for this engine, checked against the {table.label}.\n"
            "# speculative_model is relative to this directory, and TensorRT-LLM resolves it against the working\n"
            "# directory. From any directory, write the options with absolute paths for where the engine is now:\n"
            "#   dflash-build options <this directory> --output opts.yaml\n"
            "#   trtllm-serve <this directory>/target --backend pytorch --config opts.yaml\n"
            "# dflash-serve writes its Triton model.yaml and launch options the same way.\n")


def trtllm_options(plan: BuildPlan, table: FieldTable) -> tuple[dict, dict]:
    """-> (the options, manifest details: choices with reasons, memory estimate, warnings). Raises on anything
    TensorRT-LLM would reject or that cannot fit the GPU."""
    spec, target, user = plan.spec, plan.target, plan.spec.llm_options
    max_draft_len = draft_len(plan)
    check_pass_through(user)
    check_drafter_dtypes(plan.drafter_checkpoint, spec.dtype)
    skip = (user.get("speculative_config") or {}).get("skip_ctx_buffer_budget_check") is True
    warnings = [check_token_budget(spec.max_batch_size, max_draft_len, spec.max_num_tokens, skip)]
    schedule = read_schedule(spec.draft_len_schedule) if spec.draft_len_schedule else None
    if schedule:
        schedule.check_for(max_draft_len)
    sm, where = gpu_sm(spec.gpu)
    attention = attention_backend(spec.dflash_attention_backend, sm, where)
    moe = moe_backend(spec.moe_backend, target.model_type, target.moe, sm, where)
    memory = plan_memory(memory_inputs(plan, attention.value, table, skip))
    base = base_options(plan, memory.fraction, attention.value, moe.value, schedule)
    options = merge(merge(base, reuse_options(spec.prefix_reuse, user)), user)
    warnings += check_options(options, table)
    check_cross_fields(options)
    warnings += [memory.warning, reuse_warning(options, target.windowed), blackwell_warning(spec, sm),
                 untested_warning(target)]
    choices = {"attention_backend": vars(attention), "moe_backend": vars(moe), "max_seq_len": plan.max_seq_len,
               "target": f"{target.architecture} ({target.status}: {target.source})",
               "prefix_reuse": reuse_choice(spec.prefix_reuse)}
    if schedule:
        choices["draft_len_schedule"] = {"file": spec.draft_len_schedule, "source": schedule.source}
    return options, {"memory": memory.to_dict(), "choices": choices, "warnings": [w for w in warnings if w]}


def draft_len(plan: BuildPlan) -> int:
    if plan.block_size < 2:
        raise DFlashError("block size must be at least 2 for the trtllm backend (max_draft_len = block size - 1 > 0)")
    return plan.block_size - 1


def base_options(plan: BuildPlan, fraction: float, attention: str, moe: str | None, schedule) -> dict:
    """The options the build derives from its own flags (the user's pass-through options go over them)."""
    spec, drafter = plan.spec, plan.drafter
    speculative = {"decoding_type": "DFlash", "max_draft_len": plan.block_size - 1, "speculative_model": "drafter",
                   "mask_token_id": drafter.mask_token_id, "target_layer_ids": list(drafter.target_layer_ids),
                   "attention_backend": attention}
    if schedule:
        speculative["draft_len_schedule"] = schedule.as_option()
    if spec.rejection_sampling:
        speculative["use_rejection_sampling"] = True
    kv_cache = {"free_gpu_memory_fraction": fraction}
    if spec.kv_cache_dtype != "auto":
        kv_cache["dtype"] = spec.kv_cache_dtype
    graphs = {"enable_padding": True, **({"batch_sizes": spec.cuda_graph_batch_sizes} if spec.cuda_graph_batch_sizes
                                         else {"max_batch_size": spec.max_batch_size})}
    base = {"tensor_parallel_size": spec.tp, "dtype": spec.dtype, "max_batch_size": spec.max_batch_size,
            "max_num_tokens": spec.max_num_tokens, "max_seq_len": plan.max_seq_len, "speculative_config": speculative,
            "kv_cache_config": kv_cache, "cuda_graph_config": graphs}
    if moe:
        base["moe_config"] = {"backend": moe}
    if spec.chunked_prefill:
        base["enable_chunked_prefill"] = True
    return base


def reuse_choice(tail: int | None) -> str:
    if tail is None:
        return "off: a reused prefix would not reach the drafter (--prefix-reuse TAIL turns it on)"
    return (f"on, the drafter's context recomputed for the last {tail} prompt tokens of a cache hit "
            "(context_recompute_tail; chunked prefill on, as TensorRT-LLM's V1 KV-cache manager needs)")


def options_at(engine_dir: Path, options: dict) -> dict:
    """The options with the engine-relative drafter path made absolute for an engine now at `engine_dir`: what
    dflash-serve writes where it runs (a moved or mounted engine still finds its drafter)."""
    out = merge(options, {})
    speculative = out.get("speculative_config") or {}
    model = speculative.get("speculative_model")
    if isinstance(model, str) and not Path(model).is_absolute():
        speculative["speculative_model"] = os.path.join(os.path.abspath(engine_dir), model)  # no symlink resolved
    return out


def read_options_at(engine_dir: Path) -> dict:
    """The engine's options file, paths made absolute for where the engine is now."""
    return options_at(engine_dir, yaml.safe_load((Path(engine_dir) / OPTIONS).read_text()))


def write_options_at(engine_dir: str | Path, output: str | Path | None) -> str:
    """`dflash-build options`: -> the YAML of read_options_at, also written to `output` when given."""
    from ...config.manifest import Manifest

    if Manifest.read(engine_dir).backend != "trtllm":
        raise DFlashError(f"{engine_dir} is not a trtllm engine: its options are TensorRT-LLM's")
    text = yaml.safe_dump(read_options_at(Path(engine_dir)), sort_keys=False)
    if output is not None:
        try:
            Path(output).write_text(text)
        except OSError as exc:
            raise DFlashError(f"cannot write {output}: {exc.strerror or exc}") from None
    return text


def memory_inputs(plan: BuildPlan, backend: str, table: FieldTable, skip: bool) -> MemoryInputs:
    spec, target, drafter = plan.spec, plan.target, plan.drafter
    itemsize = DTYPES[spec.dtype].itemsize  # the drafter is stored in it too (drafter.py)
    weights = (checkpoint_bytes(plan.target_dir, itemsize, QUANT_ITEMSIZE[spec.quant])
               + checkpoint_bytes(plan.drafter_dir, itemsize, exclude=dropped_tensors(plan.drafter_checkpoint)))
    user_fraction = (spec.llm_options.get("kv_cache_config") or {}).get("free_gpu_memory_fraction")
    return MemoryInputs(
        tp=spec.tp, max_batch_size=spec.max_batch_size, max_seq_len=plan.max_seq_len,
        max_num_tokens=spec.max_num_tokens, max_draft_len=plan.block_size - 1, attention_backend=backend,
        weight_bytes=weights, target_kv_layers=target.kv_layers, target_kv_heads=target.num_key_value_heads,
        target_head_dim=target.head_dim, kv_itemsize=KV_CACHE_DTYPES[spec.kv_cache_dtype] or itemsize,
        hidden_size=target.hidden_size, num_capture_layers=len(drafter.target_layer_ids),
        drafter_layers=drafter.num_hidden_layers, drafter_kv_heads=drafter.num_key_value_heads,
        drafter_head_dim=drafter.head_dim, drafter_max_positions=drafter.max_position_embeddings, itemsize=itemsize,
        drafter_itemsize=itemsize, budget_gib=spec.gpu_memory_gib, rules=context_rules(table.version),
        arena_first=kv_cache_estimation_runs(spec.llm_options), fraction=user_fraction, skip_budget_check=skip)


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


def copy_checkpoint(src: Path, dst: Path) -> None:
    """Every JSON file (config, generation and processor configs, shard index) and weight file of a HF directory."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.glob("*.json")):
        shutil.copy2(path, dst / path.name)
    for f in weight_files(src):
        shutil.copy2(f, dst / f.name)
