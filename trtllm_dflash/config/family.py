"""What a target family is, as one registry entry reads it (models/registry.py holds the entries), and the
config rules every family shares: class defaults, attention layouts, the `transformers` view of a config.json.

Rules read from transformers 5.23 `models/<type>/configuration_<type>.py` (defaults, `__post_init__`)
and `modeling_<type>.py` (which layers slide, which carry experts). A field absent from
config.json takes the value the transformers config class gives it, because that is what every
serving stack builds (vLLM and SGLang load configs through `AutoConfig`, and so does the DFlash
reference drafter loaded with `trust_remote_code`). Families with their own folder under models/ keep
their layout and defaults there; the ones below are the families built from the shared layers.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from ..utils.errors import DFlashError
from .fields import Fields

FULL, SLIDING = "full_attention", "sliding_attention"

# GptOssConfig.__post_init__ (configuration_gpt_oss.py, transformers 5.23): rope_parameters when
# neither rope_parameters nor rope_scaling is given.
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
GPT_OSS_DEFAULTS = {"attention_bias": True, "rms_norm_eps": 1e-5, "rope_theta": 150000.0, "sliding_window": 128,
                    "swiglu_alpha": 1.702, "swiglu_limit": 7.0}

def qwen3_layout(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # Qwen3Config.__post_init__: the window only exists with use_sliding_window; without layer_types,
    # layers from max_window_layers (default 28) on slide.
    window = data.get("sliding_window") if data.get("use_sliding_window") else None
    types = data.get("layer_types")
    if types is None:
        first = data.get("max_window_layers", 28)
        types = [SLIDING if window is not None and i >= first else FULL for i in range(layers)]
    return types, window


def qwen3_moe_layout(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # Qwen3MoeModel: one mask for every layer, sliding when config.sliding_window is set
    # (Qwen3MoeConfig nulls it unless use_sliding_window); the config has no layer_types.
    window = data.get("sliding_window") if data.get("use_sliding_window") else None
    return [SLIDING if window is not None else FULL] * layers, window


def gpt_oss_layout(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # GptOssConfig.__post_init__: layers alternate sliding, full, sliding, ... by default.
    types = data.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
    return types, data.get("sliding_window", 128)


def no_sliding(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    return [FULL] * layers, None  # LlamaAttention has no sliding window


def as_stored(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # A config class without these fields keeps them as plain attributes, which the reference
    # drafter's attention reads (`getattr(config, "layer_types", None)`, `config.sliding_window`).
    return data.get("layer_types") or [FULL] * layers, data.get("sliding_window")


def as_stored_window_flag(data: dict[str, Any], layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    # Qwen3MoeConfig: no layer_types field, sliding_window nulled unless use_sliding_window.
    types, window = as_stored(data, layers)
    return types, window if data.get("use_sliding_window") else None


Layout = Callable[[dict[str, Any], int], tuple[Any, int | None]]


def gpt_oss_fill(filled: dict[str, Any]) -> None:
    if "rope_parameters" not in filled and "rope_scaling" not in filled:
        filled["rope_parameters"] = dict(GPT_OSS_ROPE)


@dataclass(frozen=True)
class Family:
    """One target family (a `model_type`): what it is and the hooks its config and model need.

    Hooks: `moe(text, source, layers) -> MoeConfig | None`; `own(text, base, source) -> {field: value}`, the
    family's own TargetConfig fields (`gemma4`, `deepseek_v4`); `model`, its model class (TargetModel's
    signature; None: models/target.py TargetModel)."""

    architecture: str
    qk_norm: bool  # per-head RMSNorm of q and k (Qwen3)
    layout: Layout  # the target model's sliding layers and window
    drafter_layout: Layout = as_stored  # what a DFlash drafter (Qwen3 layers) configured with this model_type reads
    attention_sinks: bool = False  # a learned per-head logit in every softmax (gpt-oss)
    norm_weight_fp32: bool = False  # RMSNorm: (weight * normed).to(dtype) (GptOssRMSNorm)
    defaults: dict[str, Any] = field(default_factory=dict)  # config-class defaults that change the math
    fill: Callable[[dict[str, Any]], None] | None = None  # defaults derived from the filled-in fields
    multimodal: bool = False  # the language model's fields sit under `text_config`
    hybrid: bool = False  # Gated DeltaNet layers beside gated full attention (config/model.py hybrid_fields)
    fused_qkvz: bool = False  # hybrid: one in_proj_qkvz / in_proj_ba per layer (Qwen3-Next)
    partial_rotary: bool = False  # RoPE may turn only part of head_dim (partial_rotary_factor < 1)
    dense_mlp_optional: bool = False  # no dense MLP width: experts in every layer (Qwen3_5MoeTextConfig)
    moe: Callable[..., Any] | None = None  # None: a dense family
    own: Callable[..., dict[str, Any]] | None = None
    model: Any = None
    checkpoint: str = "hf"  # its checkpoint layout: a key of checkpoint/layout.py LAYOUTS


def with_defaults(family: Family | None, data: dict[str, Any]) -> dict[str, Any]:
    """config.json with the family's config-class defaults filled in where a key is absent."""
    if family is None:
        return data
    filled = {**family.defaults, **data}
    if family.fill is not None:
        family.fill(filled)
    return filled


def read_as_transformers(model_type: str, data: dict[str, Any], family: Family | None) -> dict[str, Any] | None:
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
                return with_defaults(family, merged)
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


def attention_layout(family: Family, model_type: str, data: dict[str, Any], layers: int, source: str,
                     drafter: bool = False) -> tuple[tuple[str, ...], int | None]:
    """-> (layer_types, sliding_window): which layers slide and the window in tokens (None: none do)."""
    types, window = (family.drafter_layout if drafter else family.layout)(data, layers)
    if not isinstance(types, list | tuple) or len(types) != layers or not set(types) <= {FULL, SLIDING}:
        raise DFlashError(f"{source}: field 'layer_types' must list {layers} of {FULL}/{SLIDING}, got {types!r}")
    if window is not None:
        Fields({"sliding_window": window}, source).get("sliding_window", int, positive=True, expect="a positive int")
    if SLIDING in types and window is None:
        hint = " (use_sliding_window is false)" if "use_sliding_window" in data or model_type != "gpt_oss" else ""
        raise DFlashError(f"{source}: layer_types has {SLIDING} but no sliding_window{hint}")
    return tuple(types), window if SLIDING in types else None
