"""Load a target or a drafter from a Hugging Face directory (or hub id) into the project's models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .checkpoint import load_tokenizer, load_tensors, resolve_model_dir, stop_token_ids
from .config import HYBRID_TARGETS, DrafterConfig, TargetConfig, read_config_json
from .drafter_checkpoint import read_drafter
from .errors import DFlashError
from .models.drafter import DFlashDrafter
from .models.target import TargetModel
from .parallel import SINGLE, Parallel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedTarget:
    model: TargetModel
    config: TargetConfig
    path: Path
    tokenizer: object | None
    stop_ids: tuple[int, ...]


@dataclass
class LoadedDrafter:
    model: DFlashDrafter
    config: DrafterConfig
    path: Path


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise DFlashError(f"unknown dtype {name!r} (choose from {', '.join(DTYPES)})")
    return DTYPES[name]


def load_target(name: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedTarget:
    path = resolve_model_dir(name)
    cfg = TargetConfig.from_dict(read_config_json(path), str(path / "config.json"))
    model = target_from_tensors(cfg, load_tensors(path), path, SINGLE, dtype, device)
    tokenizer = load_tokenizer(path)
    return LoadedTarget(model, cfg, path, tokenizer, stop_token_ids(path, cfg.eos_token_ids, tokenizer))


def load_drafter(name: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedDrafter:
    """A drafter in z-lab's or the speculators library's format (drafter_checkpoint.py)."""
    ckpt = read_drafter(resolve_model_dir(name))
    model = drafter_from_tensors(ckpt.config, ckpt.tensors(), ckpt.path, SINGLE, dtype, device)
    return LoadedDrafter(model, ckpt.config, ckpt.path)


def tied_weights(cfg) -> set[str]:
    """Weights a checkpoint may carry but the model does not load (the LM head tied to the embedding)."""
    return {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()


# Published Qwen3.5 checkpoints keep the language model under `model.language_model.` beside a vision
# tower and multi-token-prediction weights (transformers 5.23 conversion_mapping.py: qwen3_5_text
# drops the `language_model` prefix; Qwen3_5ForCausalLM ignores `mtp.*` and `model.visual.*`).
LANGUAGE_MODEL = "model.language_model."
NOT_THE_LANGUAGE_MODEL = ("model.visual.", "mtp.")


def target_tensors(cfg: TargetConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under the target model's names: tied LM head dropped, a multimodal
    checkpoint's language model taken alone, Qwen3-Next's fused projections in Qwen3.5's layout."""
    skip = tied_weights(cfg)
    if cfg.model_type in HYBRID_TARGETS:
        tensors = {"model." + k[len(LANGUAGE_MODEL):] if k.startswith(LANGUAGE_MODEL) else k: v
                   for k, v in tensors.items() if not k.startswith(NOT_THE_LANGUAGE_MODEL)}
    if cfg.linear_attention is not None and cfg.linear_attention.fused_qkvz:
        tensors = unfuse_qkvz(cfg, tensors)
    return {k: v for k, v in tensors.items() if k not in skip}


def unfuse_qkvz(cfg: TargetConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Qwen3-Next's in_proj_qkvz / in_proj_ba hold, per key head g, [q_g | k_g | v_g | z_g] and [b_g | a_g]
    (r = H_v / H_k value heads per group; transformers 5.23 `Qwen3NextGatedDeltaNet.fix_query_key_value_ordering`);
    -> Qwen3.5's in_proj_qkv (all q, all k, all v heads), in_proj_z, in_proj_b, in_proj_a."""
    lin = cfg.linear_attention
    r = lin.num_v_heads // lin.num_k_heads
    out = {}
    for name, t in tensors.items():
        if name.endswith(".in_proj_qkvz.weight"):
            group = t.view(lin.num_k_heads, -1, t.shape[-1])  # [H_k, 2 D_k + 2 r D_v, hidden]
            q, k, v, z = group.split([lin.head_k_dim, lin.head_k_dim, r * lin.head_v_dim, r * lin.head_v_dim], dim=1)
            prefix = name[: -len("in_proj_qkvz.weight")]
            out[prefix + "in_proj_qkv.weight"] = torch.cat([x.reshape(-1, t.shape[-1]) for x in (q, k, v)])
            out[prefix + "in_proj_z.weight"] = z.reshape(-1, t.shape[-1])
        elif name.endswith(".in_proj_ba.weight"):
            b, a = t.view(lin.num_k_heads, 2 * r, t.shape[-1]).split([r, r], dim=1)
            prefix = name[: -len("in_proj_ba.weight")]
            out[prefix + "in_proj_b.weight"] = b.reshape(-1, t.shape[-1])
            out[prefix + "in_proj_a.weight"] = a.reshape(-1, t.shape[-1])
        else:
            out[name] = t
    return out


def target_from_tensors(cfg: TargetConfig, tensors: dict, path: Path, tp: Parallel, dtype, device) -> TargetModel:
    """A target (or one rank's shard of it) from checked tensors; tied embeddings re-tied."""
    skip = tied_weights(cfg)
    tensors = target_tensors(cfg, tensors)
    with torch.device("meta"):
        model = TargetModel(cfg, tp)
    assign_weights(model, tensors, path, skip=skip)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device=device, dtype=dtype).eval()


def drafter_from_tensors(cfg: DrafterConfig, tensors: dict, path: Path, tp: Parallel, dtype, device) -> DFlashDrafter:
    with torch.device("meta"):
        model = DFlashDrafter(cfg, tp)
    assign_weights(model, tensors, path)
    return model.to(device=device, dtype=dtype).eval()


def check_weights(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path, skip: set[str] = frozenset()) -> None:
    """Every name and shape against the model built from the config; one-line error on the first problem."""
    expected = {k: v.shape for k, v in model.state_dict().items() if k not in skip}
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise DFlashError(f"weight '{missing[0]}' missing from {path} ({len(missing)} missing in all)")
    unexpected = sorted(set(tensors) - set(expected) - skip)
    if unexpected:
        raise DFlashError(f"unexpected weight '{unexpected[0]}' in {path} ({len(unexpected)} unexpected in all): "
                          "checkpoint and config.json disagree on the architecture")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != tuple(shape):
            raise DFlashError(f"weight shape mismatch for '{name}' in {path}: checkpoint "
                              f"{list(tensors[name].shape)}, config.json implies {list(shape)}")


def assign_weights(model: nn.Module, tensors: dict[str, torch.Tensor], path: Path, skip: set[str] = frozenset()) -> None:
    check_weights(model, tensors, path, skip)
    names = [k for k in model.state_dict() if k not in skip]
    model.load_state_dict({k: tensors[k] for k in names}, strict=False, assign=True)
