"""What each `model_type` means for the math: defaults, attention layout, sinks, MoE layers.

Rules read from transformers 5.23 `models/<type>/configuration_<type>.py` (defaults, `__post_init__`)
and `modeling_<type>.py` (which layers slide, which carry experts). A field absent from
config.json takes the value the transformers config class gives it, because that is what every
serving stack builds (vLLM and SGLang load configs through `AutoConfig`, and so does the DFlash
reference drafter loaded with `trust_remote_code`).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from ..utils.errors import DFlashError

FULL, SLIDING = "full_attention", "sliding_attention"

# GptOssConfig.__post_init__ (configuration_gpt_oss.py, transformers 5.23): rope_parameters when
# neither rope_parameters nor rope_scaling is given.
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def _qwen3_layout(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # Qwen3Config.__post_init__: the window only exists with use_sliding_window; without layer_types,
    # layers from max_window_layers (default 28) on slide.
    window = data.get("sliding_window") if data.get("use_sliding_window") else None
    types = data.get("layer_types")
    if types is None:
        first = data.get("max_window_layers", 28)
        types = [SLIDING if window is not None and i >= first else FULL for i in range(layers)]
    return types, window


def _qwen3_moe_layout(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # Qwen3MoeModel: one mask for every layer, sliding when config.sliding_window is set
    # (Qwen3MoeConfig nulls it unless use_sliding_window); the config has no layer_types.
    window = data.get("sliding_window") if data.get("use_sliding_window") else None
    return [SLIDING if window is not None else FULL] * layers, window


def _gpt_oss_layout(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # GptOssConfig.__post_init__: layers alternate sliding, full, sliding, ... by default.
    types = data.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
    return types, data.get("sliding_window", 128)


def _gemma4_layout(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # Gemma4TextConfig.__post_init__ (transformers 5.24): five sliding layers, then one full, and the last layer
    # is made full whatever layer_types says.
    types = data.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(layers)]
    if isinstance(types, list) and types:
        types = [*types[:-1], FULL]
    return types, data.get("sliding_window")


def _deepseek_v4_layout(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # DeepseekV4Attention: every layer attends to a sliding window (compressed entries of CSA / HCA layers join
    # it: deepseek_v4_config.py has those kinds)
    return [SLIDING] * layers, data.get("sliding_window")


def _no_sliding(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    return [FULL] * layers, None  # LlamaAttention has no sliding window


def _as_stored(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # A config class without these fields keeps them as plain attributes, which the reference
    # drafter's attention reads (`getattr(config, "layer_types", None)`, `config.sliding_window`).
    return data.get("layer_types") or [FULL] * layers, data.get("sliding_window")


def _as_stored_window_flag(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # Qwen3MoeConfig: no layer_types field, sliding_window nulled unless use_sliding_window.
    types, window = _as_stored(data, layers)
    return types, window if data.get("use_sliding_window") else None


# Gemma4TextConfig's class defaults (transformers 5.24) that change the math; a config.json may omit any of them.
# Its rope_parameters and global_head_dim defaults are gemma4_config.py's.
GEMMA4_TEXT_DEFAULTS = {
    "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "eos_token_id": 1, "tie_word_embeddings": True,
    "attention_bias": False, "sliding_window": 512, "final_logit_softcapping": None,
    "vocab_size_per_layer_input": 262_144, "hidden_size_per_layer_input": 256, "attention_k_eq_v": False,
    "num_kv_shared_layers": 0, "enable_moe_block": False, "use_double_wide_mlp": False,
}


# DeepseekV4Config's class defaults (transformers 5.24); the shared expert's width is moe_intermediate_size
# (its attribute_map reads intermediate_size from it).
DEEPSEEK_V4_DEFAULTS = {
    "vocab_size": 129_280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
    "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 1024,
    "num_experts_per_tok": 6, "n_routed_experts": 256, "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5, "max_position_embeddings": 1_048_576, "rope_theta": 10_000.0,
    "compress_rope_theta": 160_000.0, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0,
    "sliding_window": 128, "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64, "index_head_dim": 128,
    "index_topk": 512, "rms_norm_eps": 1e-6, "eos_token_id": 1, "tie_word_embeddings": False, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False,
}


Layout = Callable[[dict[str, Any], int], tuple[Any, int | None]]


@dataclass(frozen=True)
class Family:
    architecture: str
    qk_norm: bool  # per-head RMSNorm of q and k (Qwen3)
    layout: Layout  # the target model's sliding layers and window
    drafter_layout: Layout  # what a DFlash drafter (Qwen3 layers) configured with this model_type reads
    attention_sinks: bool = False  # a learned per-head logit in every softmax (gpt-oss)
    norm_weight_fp32: bool = False  # RMSNorm: (weight * normed).to(dtype) (GptOssRMSNorm)
    defaults: dict[str, Any] = field(default_factory=dict)  # config-class defaults that change the math


FAMILIES = {
    "qwen3": Family("Qwen3ForCausalLM", qk_norm=True, layout=_qwen3_layout, drafter_layout=_qwen3_layout),
    "llama": Family("LlamaForCausalLM", qk_norm=False, layout=_no_sliding, drafter_layout=_as_stored),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", qk_norm=True, layout=_qwen3_moe_layout,
                        drafter_layout=_as_stored_window_flag),
    "gpt_oss": Family("GptOssForCausalLM", qk_norm=False, layout=_gpt_oss_layout, drafter_layout=_gpt_oss_layout,
                      attention_sinks=True, norm_weight_fp32=True,
                      defaults={"attention_bias": True, "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
                                "sliding_window": 128, "swiglu_alpha": 1.702, "swiglu_limit": 7.0}),
    # Hybrid Gated DeltaNet families (config.py hybrid_fields reads their linear/full layer kinds).
    "qwen3_5": Family("Qwen3_5ForConditionalGeneration", qk_norm=True, layout=_no_sliding, drafter_layout=_as_stored),
    "qwen3_5_text": Family("Qwen3_5ForCausalLM", qk_norm=True, layout=_no_sliding, drafter_layout=_as_stored),
    "qwen3_5_moe": Family("Qwen3_5MoeForConditionalGeneration", qk_norm=True, layout=_no_sliding,
                          drafter_layout=_as_stored),
    "qwen3_5_moe_text": Family("Qwen3_5MoeForCausalLM", qk_norm=True, layout=_no_sliding, drafter_layout=_as_stored),
    "qwen3_next": Family("Qwen3NextForCausalLM", qk_norm=True, layout=_no_sliding, drafter_layout=_as_stored),
    # Gemma 4 (gemma4_config.py, models/gemma4.py): text-only, and the multimodal checkpoint's text_config
    "gemma4_text": Family("Gemma4ForCausalLM", qk_norm=True, layout=_gemma4_layout, drafter_layout=_as_stored,
                          defaults=GEMMA4_TEXT_DEFAULTS),
    "gemma4": Family("Gemma4ForConditionalGeneration", qk_norm=True, layout=_gemma4_layout, drafter_layout=_as_stored,
                     defaults=GEMMA4_TEXT_DEFAULTS),
    # DeepSeek-V4 (deepseek_v4_config.py, models/deepseek_v4.py)
    "deepseek_v4": Family("DeepseekV4ForCausalLM", qk_norm=False, layout=_deepseek_v4_layout,
                          drafter_layout=_as_stored, defaults=DEEPSEEK_V4_DEFAULTS),
}
# A drafter is Qwen3 layers built from the config class its model_type names (vLLM and SGLang load it
# with AutoConfig); an unknown type is read as Qwen3Config, the reference drafter's config_class.
DRAFTER_DEFAULT_FAMILY = "qwen3"


def with_defaults(model_type: str, data: dict[str, Any]) -> dict[str, Any]:
    """config.json with the family's config-class defaults filled in where a key is absent."""
    fam = FAMILIES.get(model_type)
    if fam is None:
        return data
    filled = {**fam.defaults, **data}
    if model_type == "gpt_oss" and "rope_parameters" not in data and "rope_scaling" not in data:
        filled["rope_parameters"] = dict(GPT_OSS_ROPE)
    if model_type == "deepseek_v4":
        filled.setdefault("intermediate_size", filled["moe_intermediate_size"])
    return filled


def read_as_transformers(model_type: str, data: dict[str, Any]) -> dict[str, Any] | None:
    """config.json as its `transformers` config class reads it (`from_dict`, then `__post_init__`): every field
    the class defines, at the file's value or the class default; fields it lacks are absent unless the file has
    them. A None the class writes does not replace a value the file gives (the layouts above read those flags).
    When the class refuses a value, the file over the class's plain defaults, so that the caller's validation names
    the field and the value in one line. None without the class (an older transformers)."""
    try:
        from transformers import CONFIG_MAPPING

        cls = CONFIG_MAPPING[model_type]
    except (ImportError, KeyError):
        return None
    hf_logger = logging.getLogger("transformers")
    level, hf_logger.level = hf_logger.level, logging.ERROR  # e.g. Gemma 4's "Forcing last layer to full_attention"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                read = cls.from_dict(data).to_dict()
            except Exception:  # noqa: BLE001 - strict dataclass validation, __post_init__'s ValueError/TypeError
                defaults = declared_defaults(cls)
                merged = {**defaults, **data}
                if isinstance(data.get("text_config"), dict) and "text_config" in defaults:
                    merged["text_config"] = {**defaults["text_config"], **data["text_config"]}
                return with_defaults(model_type, merged)
    finally:
        hf_logger.level = level
    out = {**data, **{k: v for k, v in read.items() if v is not None or k not in data}}
    # the class's aliases answer as their targets do (DeepseekV4Config.intermediate_size is moe_intermediate_size)
    for alias, name in getattr(cls, "attribute_map", {}).items():
        if alias not in out and out.get(name) is not None:
            out[alias] = out[name]
    return out


def declared_defaults(cls) -> dict[str, Any]:
    """The non-None defaults a config class declares, its text_config's nested; none of `__post_init__`'s
    derivations (those depend on the values, one of which the class refused)."""
    if not dataclasses.is_dataclass(cls):
        return {}
    found = {f.name: f.default for f in dataclasses.fields(cls) if f.default not in (dataclasses.MISSING, None)}
    text = getattr(cls, "sub_configs", {}).get("text_config")
    return {**found, "text_config": declared_defaults(text)} if text is not None else found


def attention_layout(model_type: str, data: dict[str, Any], layers: int, source: str,
                     drafter: bool = False) -> tuple[tuple[str, ...], int | None]:
    """-> (layer_types, sliding_window): which layers slide and the window in tokens (None: none do)."""
    fam = FAMILIES.get(model_type, FAMILIES[DRAFTER_DEFAULT_FAMILY])
    types, window = (fam.drafter_layout if drafter else fam.layout)(data, layers)
    if not isinstance(types, list | tuple) or len(types) != layers or not set(types) <= {FULL, SLIDING}:
        raise DFlashError(f"{source}: field 'layer_types' must list {layers} of {FULL}/{SLIDING}, got {types!r}")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise DFlashError(f"{source}: field 'sliding_window' must be a positive int, got {window!r}")
    if SLIDING in types and window is None:
        hint = " (use_sliding_window is false)" if "use_sliding_window" in data or model_type != "gpt_oss" else ""
        raise DFlashError(f"{source}: layer_types has {SLIDING} but no sliding_window{hint}")
    return tuple(types), window if SLIDING in types else None
