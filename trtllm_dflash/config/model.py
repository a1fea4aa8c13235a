"""Validated model configs parsed from Hugging Face `config.json` files.

One dataclass per model kind, built once by `from_dict` and passed whole. Validation lives
here so that every error names the file and the field. `from_dict` reads a config as its family's
registry entry says (config/family.py Family); models/registry.py looks the entry up by model_type
(`parse_target_config`, `parse_drafter_config`: the entry points).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..utils.errors import DFlashError
from .dflash2 import ARCHITECTURE as DFLASH2_ARCHITECTURE
from .dflash2 import KEYS as DFLASH2_KEYS
from .dflash2 import DFlash2Config, is_dflash2
from .family import Family, attention_layout, read_as_transformers, with_defaults
from .fields import Fields, token_ids
from .laguna_drafter import ARCHITECTURE as LAGUNA_DRAFTER_ARCHITECTURE
from .laguna_drafter import check_laguna_drafter, is_laguna_drafter
from .moe import MoeConfig
from .rope import RopeConfig, rope_params

LAYER_KINDS = ("full_attention", "linear_attention")
DRAFTER_ARCHITECTURE = "DFlashDraftModel"


def read_config_json(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise DFlashError(f"no config.json in {model_dir}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DFlashError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DFlashError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class DecoderConfig:
    """The decoder-stack fields shared by targets and drafters."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int | None  # the dense MLP's; None: every layer has experts (Qwen3.5-MoE defines none)
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = True  # Qwen3 normalises per-head q and k; Llama and gpt-oss do not
    layer_types: tuple[str, ...] = ()  # full_attention / sliding_attention per layer
    sliding_window: int | None = None  # tokens a sliding layer sees (itself included); None: no layer slides

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer` in tokens, or None for a full-attention layer."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def kv_heads_and_dim(self, layer: int) -> tuple[int, int]:
        """`layer`'s key/value heads and head_dim (every layer's alike, except in Gemma 4: TargetConfig)."""
        return self.num_key_value_heads, self.head_dim

    @staticmethod
    def fields_from(data: dict[str, Any], source: str, family: Family, model_type: str, qk_norm: bool,
                    drafter: bool = False, partial_rotary: bool = False) -> dict[str, Any]:
        f = Fields(data, source)
        rope = rope_params(data, top_level=True)
        if not partial_rotary and rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise DFlashError(f"{source}: unsupported partial_rotary_factor {rope['partial_rotary_factor']!r} (only 1.0)")
        heads = f.get("num_attention_heads", int, positive=True)
        hidden = f.get("hidden_size", int, positive=True)
        kv_heads = f.get("num_key_value_heads", int, heads, positive=True)
        if heads % kv_heads:
            raise DFlashError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        head_dim = f.get("head_dim", int, hidden // heads, positive=True)
        if head_dim % 2:
            raise DFlashError(f"{source}: head_dim must be even for RoPE, got {head_dim}")
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise DFlashError(f"{source}: unsupported hidden_act {act!r} (only 'silu')")
        layers = f.get("num_hidden_layers", int, positive=True)
        layer_types, window = attention_layout(family, model_type, data, layers, source, drafter)
        return dict(
            vocab_size=f.get("vocab_size", int, positive=True),
            hidden_size=hidden,
            intermediate_size=f.get("intermediate_size", int, None if family.dense_mlp_optional else ...,
                                    positive=True),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=f.get("rms_norm_eps", float, 1e-6, positive=True),
            rope=RopeConfig.from_dict(data, source),
            max_position_embeddings=f.get("max_position_embeddings", int, 32768, positive=True),
            attention_bias=f.get("attention_bias", bool, False),
            mlp_bias=f.get("mlp_bias", bool, False),
            qk_norm=qk_norm,
            layer_types=layer_types,
            sliding_window=window,
        )


@dataclass(frozen=True)
class GatedDeltaNetConfig:
    """The shapes of a Gated DeltaNet (linear attention) layer: the `linear_*` config fields."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    fused_qkvz: bool = False  # Qwen3-Next: one in_proj_qkvz / in_proj_ba, grouped per key head

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:  # channels of the short convolution: q, k and v
        return 2 * self.key_dim + self.value_dim

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str, fused_qkvz: bool) -> GatedDeltaNetConfig:
        f = Fields(data, source)
        cfg = cls(num_k_heads=f.get("linear_num_key_heads", int, positive=True),
                  num_v_heads=f.get("linear_num_value_heads", int, positive=True),
                  head_k_dim=f.get("linear_key_head_dim", int, positive=True),
                  head_v_dim=f.get("linear_value_head_dim", int, positive=True),
                  conv_kernel=f.get("linear_conv_kernel_dim", int, 4, positive=True), fused_qkvz=fused_qkvz)
        if cfg.num_v_heads % cfg.num_k_heads:
            raise DFlashError(f"{source}: linear_num_value_heads {cfg.num_v_heads} is not a multiple of "
                              f"linear_num_key_heads {cfg.num_k_heads}")
        return cfg


@dataclass(frozen=True)
class TargetConfig(DecoderConfig):
    model_type: str = "qwen3"
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    partial_rotary_factor: float = 1.0  # RoPE turns the first head_dim * factor channels of q and k
    attn_output_gate: bool = False  # q_proj also yields a per-channel sigmoid gate on the attention output
    unit_offset_norms: bool = False  # RMSNorm scales by (1 + weight), in fp32 (Qwen3-Next / Qwen3.5)
    linear_attention: GatedDeltaNetConfig | None = None
    attention_sinks: bool = False  # a learned logit per head joins every softmax (gpt-oss `sinks`)
    norm_weight_fp32: bool = False  # RMSNorm applies its weight before the cast back (gpt-oss)
    moe: MoeConfig | None = None  # experts in the layers moe.layers; None: a dense model
    quant_method: str | None = None  # quantization_config.quant_method of a pre-quantized checkpoint
    # A family's own fields, filled by its entry's `own` hook (None: another family). Typed in their folders,
    # which config/ does not import: models/gemma4/config.py Gemma4Config, models/deepseek_v4/config.py
    # DeepseekV4Config, models/laguna/config.py LagunaConfig, models/deepseek_v3/config.py DeepseekV3Config.
    gemma4: Any = None
    deepseek_v4: Any = None
    laguna: Any = None
    deepseek_v3: Any = None

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_kind(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else "full_attention"

    @property
    def is_hybrid(self) -> bool:
        return "linear_attention" in self.layer_types

    def kv_heads_and_dim(self, layer: int) -> tuple[int, int]:
        if self.gemma4 is None:
            return super().kv_heads_and_dim(layer)
        shape = self.gemma4.attention(self.layer_types[layer])  # full-attention layers have their own
        return shape.num_kv_heads, shape.head_dim

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str, family: Family) -> TargetConfig:
        """data: a target's config.json of `family` (models/registry.py parse_target_config checks the model_type)."""
        model_type = data["model_type"]
        if family.multimodal:
            text_fields(data, source)  # a wrapper without its text_config: refused before the class fills one in
        read = read_as_transformers(model_type, data, family)
        outer = data if read is None else read
        text = text_fields(outer, source) if family.multimodal else outer
        if read is None:
            text = with_defaults(family, text)
        if family.hybrid and text.get("use_sliding_window"):
            raise DFlashError(f"{source}: sliding-window {model_type} targets are not supported (use_sliding_window=true)")
        base = DecoderConfig.fields_from(text, source, family, model_type, qk_norm=family.qk_norm,
                                         partial_rotary=family.partial_rotary)
        if family.hybrid:
            base.update(hybrid_fields(text, source, family.fused_qkvz))
        tie = Fields(outer, source).get("tie_word_embeddings", bool, family.defaults.get("tie_word_embeddings", False))
        eos = token_ids(text.get("eos_token_id"), source, "eos_token_id")
        moe = family.moe(text, source, base["num_hidden_layers"]) if family.moe else None
        quant = _quant_method(text.get("quantization_config"), source)
        own = family.own(text, base, source) if family.own else {}
        return cls(**base, model_type=model_type, tie_word_embeddings=tie, eos_token_ids=eos,
                   attention_sinks=family.attention_sinks, norm_weight_fp32=family.norm_weight_fp32, moe=moe,
                   quant_method=quant, **own)

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.layers


def text_fields(data: dict[str, Any], source: str) -> dict[str, Any]:
    """The language model's fields of a multimodal checkpoint (`text_config`), top-level EOS and quantization_config
    as fallbacks (a wrapper's quantization_config sits on the wrapper: transformers quantizes the whole model)."""
    text = data.get("text_config")
    if not isinstance(text, dict):
        raise DFlashError(f"{source}: model_type {data.get('model_type')!r} needs a 'text_config' object, got {text!r}")
    outer = {k: data.get(k) for k in ("eos_token_id", "quantization_config")}
    return {**outer, **{k: v for k, v in text.items() if v is not None}}


def hybrid_fields(data: dict[str, Any], source: str, fused_qkvz: bool) -> dict[str, Any]:
    """Layer kinds, partial RoPE and the Gated DeltaNet shapes, with transformers' defaults
    (5.23 `Qwen3NextConfig.__post_init__`: partial_rotary_factor 0.25, every 4th layer full attention)."""
    f = Fields(data, source)
    layers = f.get("num_hidden_layers", int, positive=True)
    kinds = data.get("layer_types")
    if kinds is None:
        interval = f.get("full_attention_interval", int, 4, positive=True)
        kinds = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= set(LAYER_KINDS):
        raise DFlashError(f"{source}: field 'layer_types' must list {layers} of {'/'.join(LAYER_KINDS)}, got {kinds!r}")
    factor = Fields(rope_params(data, top_level=True), source).get("partial_rotary_factor", float, 0.25, positive=True)
    if factor > 1:
        raise DFlashError(f"{source}: partial_rotary_factor must be in (0, 1], got {factor}")
    head_dim = f.get("head_dim", int, f.get("hidden_size", int) // f.get("num_attention_heads", int))
    if int(head_dim * factor) % 2:
        raise DFlashError(f"{source}: head_dim {head_dim} x partial_rotary_factor {factor} must be even")
    return dict(layer_types=tuple(kinds), partial_rotary_factor=factor, attn_output_gate=True, unit_offset_norms=True,
                linear_attention=GatedDeltaNetConfig.from_dict(data, source, fused_qkvz=fused_qkvz))


@dataclass(frozen=True)
class DrafterConfig(DecoderConfig):
    """A published DFlash drafter: Qwen3-style layers plus the `dflash_config` fields."""

    block_size: int = 16
    num_target_layers: int | None = None
    target_layer_ids: tuple[int, ...] = ()
    mask_token_id: int = 0
    is_causal: bool | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    dflash2: DFlash2Config | None = None  # DFlash2's convolutions and candidate selector (config/dflash2.py)
    laguna_drafter: bool = False  # aux norms, context input_layernorm, softplus gate (config/laguna_drafter.py)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def method(self) -> str:
        """The drafting method: "dflash" or "dflash2" (speculative/__init__.py drafter_proposer picks its proposer)."""
        return "dflash" if self.dflash2 is None else "dflash2"

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str, family: Family) -> DrafterConfig:
        """family: the entry of the drafter's model_type, or Qwen3's (models/registry.py parse_drafter_config)."""
        archs = data.get("architectures") or []
        dflash = data.get("dflash_config")
        if not known_drafter(archs) and dflash is None:
            raise DFlashError(f"{source}: unknown architecture {archs} for a drafter (expected {DRAFTER_ARCHITECTURE}, "
                              f"{DFLASH2_ARCHITECTURE} or {LAGUNA_DRAFTER_ARCHITECTURE} with dflash_config)")
        if not isinstance(dflash, dict):
            raise DFlashError(f"{source}: field 'dflash_config' must be an object, got {dflash!r}")
        check_drafter_fields(data, dflash, source)
        model_type = data.get("model_type")
        data = with_defaults(family, data)
        base = DecoderConfig.fields_from(data, source, family, model_type, qk_norm=True, drafter=True)
        # dflash_config values win over top-level ones, as in the reference implementation.
        f = Fields({**data, **dflash}, source)
        block = f.get("block_size", int, 16, positive=True)
        second = (DFlash2Config.from_dict({**data, **dflash}, source, base["hidden_size"], block, base["vocab_size"])
                  if is_dflash2(archs) else None)
        layers = base["num_hidden_layers"]
        num_target_layers = f.get("num_target_layers", int, None)
        ids = dflash.get("target_layer_ids", data.get("target_layer_ids"))
        if ids is None:
            if num_target_layers is None:
                raise DFlashError(f"{source}: needs dflash_config.target_layer_ids or num_target_layers")
            ids = default_target_layer_ids(num_target_layers, layers)
        return cls(
            **base,
            block_size=block,
            num_target_layers=num_target_layers,
            target_layer_ids=token_ids(ids, source, "target_layer_ids", allow_empty=False),
            mask_token_id=f.get("mask_token_id", int),
            # vLLM's port spells it dflash_config.causal (qwen3_dflash.py _dflash_layer_causal)
            is_causal=f.get("causal" if "causal" in dflash else "is_causal", bool, None),
            input_embedding_scale=f.get("input_embedding_scale", float, 1.0),
            output_multiplier=f.get("output_multiplier", float, 1.0),
            final_logit_softcapping=f.get("final_logit_softcapping", float, None),
            dflash2=second,
            laguna_drafter=is_laguna_drafter(archs),
        )


# Keys of `dflash_config` this runtime reads. Any other key is refused: the field is DFlash's own
# namespace, and ports use it for switches that change the drafter's math (vLLM qwen3_dflash.py:
# use_swa, swa_window_size, attention_sink_bias).
DFLASH_CONFIG_KEYS = ("mask_token_id", "target_layer_ids", "block_size", "num_target_layers", "is_causal", "causal",
                      "input_embedding_scale", "output_multiplier", "final_logit_softcapping", "use_aux_hidden_state")
# Top-level fields that change a drafter's math in the reference or in vLLM's port, with the value
# at which they change nothing; any other value is refused rather than silently ignored.
NEUTRAL_DRAFTER_FIELDS = {
    "add_swa_attention_sink_bias": False, "is_neox_style": True, "use_aux_hidden_state": True,
    "attn_logit_softcapping": None, "query_pre_attn_scalar": None, "conv_kernel_size": None,
    "conv_group_size": None, "selector_rank": None, "selector_top_k": None, "markov_rank": None,
}


def known_drafter(archs: list[str]) -> bool:
    """A DFlash, DFlash2 or Laguna DFlash drafter by its config's `architectures`, as upstream chooses it."""
    return DRAFTER_ARCHITECTURE in archs or is_dflash2(archs) or is_laguna_drafter(archs)


def check_drafter_fields(data: dict[str, Any], dflash: dict[str, Any], source: str) -> None:
    """One-line refusal of drafter fields that would change the math this runtime computes."""
    archs = data.get("architectures") or []
    second = is_dflash2(archs)
    if archs and not known_drafter(archs):
        raise DFlashError(f"{source}: unsupported drafter architecture {archs} (supported: {DRAFTER_ARCHITECTURE}, "
                          f"{DFLASH2_ARCHITECTURE}, {LAGUNA_DRAFTER_ARCHITECTURE})")
    if is_laguna_drafter(archs):
        check_laguna_drafter(data, dflash, source)
    known = DFLASH_CONFIG_KEYS + (DFLASH2_KEYS if second else ())
    unknown = sorted(set(dflash) - set(known))
    if unknown:
        raise DFlashError(f"{source}: unsupported dflash_config field '{unknown[0]}'={dflash[unknown[0]]!r} "
                          f"(known: {', '.join(known)})")
    # a reduced vocabulary has its own LM head and a d2t map; speculators refuses it for DFlash2 (dflash2/core.py:36-43)
    vocab = data.get("vocab_size")
    if data.get("draft_vocab_size", vocab) != vocab:
        raise DFlashError(f"{source}: field 'draft_vocab_size' {data['draft_vocab_size']!r} != vocab_size {vocab!r}: "
                          "a reduced draft vocabulary (d2t) is not supported; the drafter needs the target's")
    for key, neutral in NEUTRAL_DRAFTER_FIELDS.items():
        if second and key in DFLASH2_KEYS:
            continue
        value = dflash.get(key, data.get(key, neutral))
        if value != neutral:
            raise DFlashError(f"{source}: unsupported drafter field '{key}'={value!r} (this runtime implements {neutral!r})")
    target_hidden = data.get("target_hidden_size")
    if target_hidden is not None and target_hidden != data.get("hidden_size"):
        raise DFlashError(f"{source}: unsupported target_hidden_size {target_hidden!r} != hidden_size "
                          f"{data.get('hidden_size')!r} (fc input must be len(target_layer_ids) * hidden_size)")


def _quant_method(quantization: Any, source: str) -> str | None:
    if quantization is None:
        return None
    if not isinstance(quantization, dict) or not isinstance(quantization.get("quant_method"), str):
        raise DFlashError(f"{source}: field 'quantization_config' must be an object with a 'quant_method' string, "
                          f"got {quantization!r}")
    return quantization["quant_method"]


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference's spread of captured target layers (Qwen3-8B, L=36, n=5 -> [1, 9, 17, 25, 33])."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]
