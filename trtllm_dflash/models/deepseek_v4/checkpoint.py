"""DeepSeek-V4 checkpoints -> the tensors model.py holds.

Published checkpoints (and what transformers 5.24 `save_pretrained` writes) name weights DeepSeek's way
(`layers.0.attn.wq_a.weight`, `ffn.experts.3.w1.weight`, `hc_attn_fn`, ...); transformers renames them on load with
the ordered rules of `conversion_mapping.py` ("deepseek_v4"), repeated in `RENAMES` below, applied here to the part of
a name after `layers.<i>.` so that top-level names (`model.norm.weight`) stay put. Names already in transformers'
in-memory form pass unchanged.

FP8 (quantization_config.quant_method "fp8", as DeepSeek-V3 publishes: float8_e4m3fn `<w>.weight` beside fp32
`<w>.weight_scale_inv` [ceil(out / b0), ceil(in / b1)], `weight_block_size` [b0, b1], default 128 x 128): dequantized
at load, weight * scale of its block. Multi-token-prediction layers (`mtp.*`, and layers at or past
num_hidden_layers, where DeepSeek-V3 keeps its MTP layer) are dropped, as transformers ignores them (`(^|.)mtp.`).
"""

from __future__ import annotations

import re

import torch

from ...utils.errors import DFlashError

# transformers 5.24 conversion_mapping.py "deepseek_v4", in order (WeightRenaming source -> target)
RENAMES = [
    (r"\.attn\.", ".self_attn."), (r"\.ffn\.", ".mlp."), (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"\.attn_norm\.", ".input_layernorm."), (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_attn_fn", ".attn_hc.fn"), (r"\.hc_attn_base", ".attn_hc.base"), (r"\.hc_attn_scale", ".attn_hc.scale"),
    (r"\.hc_ffn_fn", ".ffn_hc.fn"), (r"\.hc_ffn_base", ".ffn_hc.base"), (r"\.hc_ffn_scale", ".ffn_hc.scale"),
    (r"\.attn_sink", ".sinks"), (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."), (r"\.norm\.", ".kv_norm."), (r"\.ape", ".position_bias"),
    (r"\.wq_a\.", ".q_a_proj."), (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."), (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."), (r"\.wo_a\.", ".o_a_proj."), (r"\.wo_b\.", ".o_b_proj."),
    (r"\.q_norm\.", ".q_a_norm."), (r"\.gate\.bias", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."),
    (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
]
TOP_LEVEL = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
             "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
             "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
LAYER = re.compile(r"^(?:model\.)?layers\.(?P<layer>\d+)(?P<rest>\..+)$")
MTP = re.compile(r"(^|\.)mtp\.")  # DeepseekV4PreTrainedModel._keys_to_ignore_on_load_unexpected
EXPERT = re.compile(r"^(?P<prefix>.+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>w1|w2|w3)\.weight$")


def rename(name: str) -> str:
    """A published name -> transformers' (layer names: `model.layers.<i>.` + the renamed rest)."""
    m = LAYER.match(name)
    if m is None:
        return TOP_LEVEL.get(name, name)
    rest = m["rest"]
    for source, target in RENAMES:
        rest = re.sub(source, target, rest, count=1)
    return f"model.layers.{m['layer']}{rest}"


def dequantize_fp8(tensors: dict[str, torch.Tensor], block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """float8 `<w>.weight` with `<w>.weight_scale_inv` -> fp32 `<w>.weight` (each block x its scale)."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(".weight_scale_inv"):
            if name[: -len("_scale_inv")] not in tensors:
                raise DFlashError(f"FP8 scales '{name}' have no '{name[: -len('_scale_inv')]}' beside them")
            continue
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            scales = tensors.get(name + "_scale_inv")
            if scales is None:
                raise DFlashError(f"FP8 weight '{name}' has no '{name}_scale_inv' beside it")
            t = blockwise(t, scales, block, name)
        out[name] = t
    return out


def blockwise(weight: torch.Tensor, scales: torch.Tensor, block: tuple[int, int], name: str) -> torch.Tensor:
    """weight [O, I] (fp8) * scales [ceil(O / b0), ceil(I / b1)] repeated over their blocks -> fp32 [O, I]."""
    (o, i), (b0, b1) = weight.shape, block
    if tuple(scales.shape) != (-(-o // b0), -(-i // b1)):
        raise DFlashError(f"FP8 scales of '{name}' have shape {list(scales.shape)}, a {o}x{i} weight in {b0}x{b1} "
                          f"blocks needs {[-(-o // b0), -(-i // b1)]}")
    full = scales.float().repeat_interleave(b0, dim=0)[:o].repeat_interleave(b1, dim=1)[:, :i]
    return weight.float() * full


def stack_experts(tensors: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """Per-expert w1 (gate), w3 (up), w2 (down) [nn.Linear layout] -> `experts.w13` [E, H, 2I] (gate | up) and
    `experts.w2` [E, I, H] (models/moe.py); stacked transformers ones (`gate_up_proj` [E, 2I, H], `down_proj`
    [E, H, I]) likewise."""
    out, groups = {}, {}
    for name, t in tensors.items():
        m = EXPERT.match(name)
        if m is not None:
            groups.setdefault(m["prefix"], {})[(int(m["expert"]), m["proj"])] = t
        elif name.endswith(".experts.gate_up_proj"):
            out[name[: -len("gate_up_proj")] + "w13"] = t.transpose(1, 2).contiguous()
        elif name.endswith(".experts.down_proj"):
            out[name[: -len("down_proj")] + "w2"] = t.transpose(1, 2).contiguous()
        else:
            out[name] = t
    for prefix, parts in groups.items():
        missing = [(e, p) for e in range(num_experts) for p in ("w1", "w2", "w3") if (e, p) not in parts]
        if missing or len(parts) != 3 * num_experts:
            e, p = missing[0] if missing else (num_experts, "w1")
            raise DFlashError(f"expert weight '{prefix}.{e}.{p}.weight' {'missing' if missing else 'unexpected'}: "
                              f"config.json has {num_experts} experts")
        out[prefix + ".w13"] = torch.stack([torch.cat((parts[(e, "w1")], parts[(e, "w3")])).T for e in
                                            range(num_experts)]).contiguous()
        out[prefix + ".w2"] = torch.stack([parts[(e, "w2")].T for e in range(num_experts)]).contiguous()
    return out


def deepseek_v4_tensors(cfg, tensors: dict[str, torch.Tensor], block: tuple[int, int] = (128, 128)
                        ) -> dict[str, torch.Tensor]:
    """A DeepSeek-V4 checkpoint's tensors under the model's names (see the module docstring)."""
    if cfg.quant_method == "fp8":
        tensors = dequantize_fp8(tensors, block)
    kept = {}
    for name, t in tensors.items():
        m = LAYER.match(name)
        if MTP.search(name) or (m is not None and int(m["layer"]) >= cfg.num_hidden_layers):
            continue
        kept[rename(name)] = t
    return stack_experts(kept, cfg.moe.num_experts)
