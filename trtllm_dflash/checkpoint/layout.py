"""Published checkpoint layouts -> the tensors `TargetModel` holds.

A family's registry entry names its layout (models/registry.py `checkpoint`, a key of `LAYOUTS`).
Hybrid (Qwen3.5 / Qwen3-Next) checkpoints: see `LANGUAGE_MODEL` and `unfuse_qkvz` below. MoE experts
(names in models/moe.py):

- Qwen3-MoE (Qwen/Qwen3-Coder-30B-A3B, and what transformers 5.23 `save_pretrained` writes):
  `mlp.gate.weight` [E, H]; `mlp.experts.<j>.{gate,up,down}_proj.weight` per expert (nn.Linear
  layout); or fused as transformers holds them in memory: `mlp.experts.gate_up_proj` [E, 2I, H]
  (gate rows first) and `mlp.experts.down_proj` [E, H, I].
- gpt-oss bf16 (transformers 5.23 `GptOssExperts`): `mlp.router.{weight,bias}`;
  `mlp.experts.gate_up_proj` [E, H, 2I] with gate and up interleaved (gate = [..., ::2]),
  `gate_up_proj_bias` [E, 2I] interleaved alike; `down_proj` [E, I, H]; `down_proj_bias` [E, H].
- gpt-oss MXFP4 (openai/gpt-oss-20b/120b): `mlp.experts.{gate_up,down}_proj_{blocks,scales}`
  packing the nn.Linear-shaped [E, 2I, H] / [E, H, I] weights (mxfp4.py); biases unquantised.
The model's names (`mlp.router`, `mlp.experts.w13`/`w2`) differ from every published one, so
tensors already converted (a torch engine's rank files) pass through unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..config.model import TargetConfig
from ..models.deepseek_v3.checkpoint import deepseek_v3_names
from ..models.deepseek_v4.checkpoint import deepseek_v4_tensors
from ..models.laguna.checkpoint import laguna_names
from ..models.minimax_m2.checkpoint import minimax_m2_names
from ..models.registry import family_of
from ..utils.errors import DFlashError
from .mxfp4 import dequantize

PER_EXPERT = re.compile(r"^(?P<prefix>.+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
RUNTIME_QUANT_METHODS = (None, "mxfp4")
# Published Qwen3.5 checkpoints keep the language model under `model.language_model.` beside a vision
# tower and multi-token-prediction weights (transformers 5.23 conversion_mapping.py: qwen3_5_text
# drops the `language_model` prefix; Qwen3_5ForCausalLM ignores `mtp.*` and `model.visual.*`).
LANGUAGE_MODEL = "model.language_model."
NOT_THE_LANGUAGE_MODEL = ("model.visual.", "mtp.")
# Gemma 4's multimodal checkpoint (transformers 5.24 Gemma4Model): the language model under the same prefix,
# beside vision and audio towers and their embedders
GEMMA4_NOT_THE_LANGUAGE_MODEL = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.",
                                 "model.embed_audio.")


def tied_weights(cfg) -> set[str]:
    """Weights a checkpoint may carry but the model does not load (the LM head tied to the embedding)."""
    return {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()


def target_tensors(cfg: TargetConfig, tensors: dict[str, torch.Tensor], source: Path | str = "checkpoint"
                   ) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under the target model's names, as its family's layout maps them; tied LM
    head dropped."""
    block_fp8 = (cfg.deepseek_v4 or cfg.deepseek_v3) and cfg.quant_method == "fp8"  # dequantized at load
    if cfg.quant_method not in RUNTIME_QUANT_METHODS and not block_fp8:
        raise DFlashError(f"{source}: the torch runtime loads unquantized or MXFP4 checkpoints, this one is quantized "
                          f"with {cfg.quant_method!r} (serve it with --backend trtllm)")
    family = family_of(cfg.model_type)
    tensors = LAYOUTS[family.checkpoint if family is not None else "hf"](cfg, tensors)
    skip = tied_weights(cfg)
    return {k: v for k, v in tensors.items() if k not in skip}


def hf_tensors(cfg: TargetConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face names as the model's; MoE experts stacked (and MXFP4 ones dequantised)."""
    return moe_tensors(cfg, tensors) if cfg.moe is not None else tensors


def qwen3_5_tensors(cfg: TargetConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hybrid checkpoints: the multimodal one's language model taken alone, Qwen3-Next's fused projections
    in Qwen3.5's layout."""
    tensors = language_model(tensors, NOT_THE_LANGUAGE_MODEL)
    if cfg.linear_attention is not None and cfg.linear_attention.fused_qkvz:
        tensors = unfuse_qkvz(cfg, tensors)
    return hf_tensors(cfg, tensors)


def language_model(tensors: dict[str, torch.Tensor], others: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """`model.language_model.*` as `model.*`, the tensors under `others` dropped (names already so pass)."""
    return {"model." + k[len(LANGUAGE_MODEL):] if k.startswith(LANGUAGE_MODEL) else k: v
            for k, v in tensors.items() if not k.startswith(others)}


def gemma4_tensors(cfg: TargetConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Gemma 4: the multimodal checkpoint's language model taken alone; layers that share another's K/V have no
    K/V weights of their own (a checkpoint's are dropped, as transformers 5.24 ignores them:
    Gemma4TextModel._keys_to_ignore_on_load_unexpected); experts stored as transformers holds them
    (`experts.gate_up_proj` [E, 2I, H], gate rows first; `experts.down_proj` [E, H, I]) become `experts.w13` / `w2`
    (models/moe.py)."""
    tensors = language_model(tensors, GEMMA4_NOT_THE_LANGUAGE_MODEL)
    layers = cfg.num_hidden_layers
    unused = tuple(f"model.layers.{i}.self_attn.{p}." for i in range(layers) if cfg.gemma4.shares_kv(i, layers)
                   for p in ("k_proj", "v_proj", "k_norm", "v_norm"))
    out = {}
    for name, t in tensors.items():
        if name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            name, t = _expert_tensor(name, t, interleaved=False)
        if not name.startswith(unused):
            out[name] = t
    return hf_tensors(cfg, out)


def moe_tensors(cfg: TargetConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Experts stacked as `mlp.experts.w13` / `w2`, routers as `mlp.router`."""
    tensors = _stack_experts(dequantize_mxfp4(tensors), cfg.moe.num_experts)
    interleaved = cfg.model_type == "gpt_oss"
    out = {}
    for name, t in tensors.items():
        if name.endswith(".mlp.gate.weight"):
            name = name[: -len("gate.weight")] + "router.weight"
        elif ".mlp.experts." in name:
            name, t = _expert_tensor(name, t, interleaved)
        out[name] = t
    return out


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


def _expert_tensor(name: str, t: torch.Tensor, interleaved: bool) -> tuple[str, torch.Tensor]:
    prefix, kind = name.rsplit(".", 1)
    if kind in ("gate_up_proj", "gate_up_proj_bias"):
        if interleaved:  # gpt-oss: [..., 2I] alternating gate, up -> [gate | up]
            t = torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)
        elif kind == "gate_up_proj":  # transformers' fused Qwen layout [E, 2I, H] -> [E, H, 2I]
            t = t.transpose(1, 2).contiguous()
        return f"{prefix}.{kind.replace('gate_up_proj', 'w13')}", t
    if kind in ("down_proj", "down_proj_bias"):
        if kind == "down_proj" and not interleaved:  # [E, H, I] -> [E, I, H]
            t = t.transpose(1, 2).contiguous()
        return f"{prefix}.{kind.replace('down_proj', 'w2')}", t
    return name, t


def dequantize_mxfp4(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace every `<w>_blocks` / `<w>_scales` pair by `<w>`, transposed to gpt-oss's bf16 layout
    ([E, 2I, H] -> gate_up_proj [E, H, 2I]; [E, H, I] -> down_proj [E, I, H])."""
    out = {}
    for name, t in tensors.items():
        base = name.removesuffix("_blocks").removesuffix("_scales")
        if base == name:
            out[name] = t
        elif name.endswith("_blocks"):
            if base + "_scales" not in tensors:
                raise DFlashError(f"MXFP4 weight '{name}' has no '{base}_scales' beside it")
            try:
                out[base] = dequantize(t, tensors[base + "_scales"]).transpose(1, 2).contiguous()
            except ValueError as exc:
                raise DFlashError(f"MXFP4 weight '{base}': {exc}") from None
        elif base + "_blocks" not in tensors:
            raise DFlashError(f"MXFP4 scales '{name}' have no '{base}_blocks' beside them")
    return out


LAYOUTS = {"hf": hf_tensors, "qwen3_5": qwen3_5_tensors, "gemma4": gemma4_tensors,
           "deepseek_v4": lambda cfg, tensors: deepseek_v4_tensors(cfg, tensors, cfg.deepseek_v4.fp8_block),
           "minimax_m2": lambda cfg, tensors: hf_tensors(cfg, minimax_m2_names(tensors)),
           "laguna": lambda cfg, tensors: hf_tensors(cfg, laguna_names(tensors)),
           "deepseek_v3": lambda cfg, tensors: hf_tensors(cfg, deepseek_v3_names(cfg, tensors))}


def _stack_experts(tensors: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """Per-expert nn.Linear weights -> the fused transformers layout (gate_up_proj [E, 2I, H],
    down_proj [E, H, I]); other tensors unchanged."""
    out, groups = {}, {}
    for name, t in tensors.items():
        m = PER_EXPERT.match(name)
        if m is None:
            out[name] = t
        else:
            groups.setdefault(m["prefix"], {})[(int(m["expert"]), m["proj"])] = t
    for prefix, parts in groups.items():
        extra = sorted(e for e, _ in parts if e >= num_experts)
        if extra:
            raise DFlashError(f"unexpected weight '{prefix}.{extra[0]}.gate_proj.weight': config.json has {num_experts} experts")
        missing = [(e, p) for e in range(num_experts) for p in ("gate_proj", "up_proj", "down_proj") if (e, p) not in parts]
        if missing:
            e, p = missing[0]
            raise DFlashError(f"weight '{prefix}.{e}.{p}.weight' missing ({len(missing)} expert weights missing in all)")
        out[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat((parts[(e, "gate_proj")], parts[(e, "up_proj")])) for e in range(num_experts)])
        out[prefix + ".down_proj"] = torch.stack([parts[(e, "down_proj")] for e in range(num_experts)])
    return out
