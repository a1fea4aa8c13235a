"""The target families this runtime serves: one entry per `model_type`, and the entry points that read a
config.json through its entry.

An entry (config/family.py Family) says what the family is: hybrid or not, multimodal (`text_config`) or not,
MoE or not (its `moe` reader), its attention layout and config-class defaults, its checkpoint layout
(checkpoint/layout.py LAYOUTS) and the hooks of a family with its own folder (`own` config fields, `model`
class). Adding a family: its folder under models/ (when the shared layers do not cover it) and one entry here.
"""

from __future__ import annotations

from typing import Any

from ..config import moe
from ..config.dflash2 import is_dflash2
from ..config.family import (
    GPT_OSS_DEFAULTS,
    Family,
    as_stored_window_flag,
    gpt_oss_fill,
    gpt_oss_layout,
    no_sliding,
    qwen3_layout,
    qwen3_moe_layout,
)
from ..config.family import read_as_transformers as _read_as_transformers
from ..config.laguna_drafter import ARCHITECTURE as LAGUNA_DRAFTER_ARCHITECTURE
from ..config.model import DRAFTER_ARCHITECTURE, DrafterConfig, TargetConfig
from ..utils.errors import DFlashError
from . import deepseek_v3, deepseek_v4, gemma4, laguna, minimax_m2
from .deepseek_v3 import config as deepseek_v3_config
from .deepseek_v4 import config as deepseek_v4_config
from .gemma4 import config as gemma4_config
from .laguna import config as laguna_config
from .minimax_m2 import config as minimax_m2_config

# Qwen3.5 / Qwen3-Next (transformers 5.23 models/qwen3_next/modeling_qwen3_next.py, models/qwen3_5/modular_qwen3_5.py)
_HYBRID = dict(qk_norm=True, layout=no_sliding, hybrid=True, partial_rotary=True, checkpoint="qwen3_5")
# Gemma 4 (models/gemma4/): text-only, and the multimodal checkpoint's text_config
_GEMMA4 = dict(qk_norm=True, layout=gemma4_config.layout, defaults=gemma4_config.TEXT_DEFAULTS,
               moe=gemma4_config.moe_config, own=gemma4_config.own_fields, model=gemma4.build, checkpoint="gemma4")
# DeepSeek-V3 (models/deepseek_v3/): text-only, and Kimi-K2.5's text_config
_DEEPSEEK_V3 = dict(qk_norm=False, layout=deepseek_v3_config.layout, moe=deepseek_v3_config.moe_config,
                    own=deepseek_v3_config.own_fields, model=deepseek_v3.build, checkpoint="deepseek_v3")

FAMILIES = {
    "qwen3": Family("Qwen3ForCausalLM", qk_norm=True, layout=qwen3_layout, drafter_layout=qwen3_layout),
    "llama": Family("LlamaForCausalLM", qk_norm=False, layout=no_sliding),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", qk_norm=True, layout=qwen3_moe_layout,
                        drafter_layout=as_stored_window_flag, moe=moe.qwen3_moe),
    "gpt_oss": Family("GptOssForCausalLM", qk_norm=False, layout=gpt_oss_layout, drafter_layout=gpt_oss_layout,
                      attention_sinks=True, norm_weight_fp32=True, defaults=GPT_OSS_DEFAULTS, fill=gpt_oss_fill,
                      moe=moe.gpt_oss),
    "qwen3_5": Family("Qwen3_5ForConditionalGeneration", multimodal=True, **_HYBRID),
    "qwen3_5_text": Family("Qwen3_5ForCausalLM", **_HYBRID),
    "qwen3_5_moe": Family("Qwen3_5MoeForConditionalGeneration", multimodal=True, dense_mlp_optional=True,
                          moe=moe.qwen3_5_moe, **_HYBRID),
    "qwen3_5_moe_text": Family("Qwen3_5MoeForCausalLM", dense_mlp_optional=True, moe=moe.qwen3_5_moe, **_HYBRID),
    "qwen3_next": Family("Qwen3NextForCausalLM", fused_qkvz=True, moe=moe.qwen3_next, **_HYBRID),
    "gemma4_text": Family("Gemma4ForCausalLM", **_GEMMA4),
    "gemma4": Family("Gemma4ForConditionalGeneration", multimodal=True, **_GEMMA4),
    "deepseek_v4": Family("DeepseekV4ForCausalLM", qk_norm=False, layout=deepseek_v4_config.layout,
                          defaults=deepseek_v4_config.DEFAULTS, fill=deepseek_v4_config.fill, partial_rotary=True,
                          moe=deepseek_v4_config.moe_config, own=deepseek_v4_config.own_fields,
                          model=deepseek_v4.build, checkpoint="deepseek_v4"),
    # qk_norm False: MiniMax-M2's q/k norms span the whole projection, its folder's attention has them
    "minimax_m2": Family("MiniMaxM2ForCausalLM", qk_norm=False, layout=no_sliding, defaults=minimax_m2_config.DEFAULTS,
                         fill=minimax_m2_config.fill, partial_rotary=True, moe=minimax_m2_config.moe_config,
                         own=minimax_m2_config.own_fields, model=minimax_m2.build, checkpoint="minimax_m2"),
    "deepseek_v3": Family("DeepseekV3ForCausalLM", **_DEEPSEEK_V3),
    "kimi_k25": Family("Kimi_K25ForConditionalGeneration", multimodal=True, defaults={"tie_word_embeddings": True},
                       **_DEEPSEEK_V3),
    "laguna": Family("LagunaForCausalLM", qk_norm=True, layout=laguna_config.layout, defaults=laguna_config.DEFAULTS,
                     moe=laguna_config.moe_config, own=laguna_config.own_fields, model=laguna.build,
                     checkpoint="laguna"),
}
# A drafter is Qwen3 layers built from the config class its model_type names (vLLM and SGLang load it
# with AutoConfig); an unknown type is read as Qwen3Config, the reference drafter's config_class.
DRAFTER_DEFAULT_FAMILY = "qwen3"


def family_of(model_type: str) -> Family | None:
    return FAMILIES.get(model_type)


def parse_target_config(data: dict[str, Any], source: str) -> TargetConfig:
    """A target's config.json, validated as its family reads it; errors name `source` and the field."""
    model_type = data.get("model_type")
    archs = data.get("architectures") or []
    if DRAFTER_ARCHITECTURE in archs or is_dflash2(archs) or LAGUNA_DRAFTER_ARCHITECTURE in archs:
        raise DFlashError(f"{source}: this is a DFlash drafter ({', '.join(archs)}), not a target model")
    if model_type not in FAMILIES:
        raise DFlashError(f"{source}: unknown architecture model_type={model_type!r} architectures={archs} "
                          f"(supported targets: {', '.join(FAMILIES)})")
    return TargetConfig.from_dict(data, source, FAMILIES[model_type])


def parse_drafter_config(data: dict[str, Any], source: str) -> DrafterConfig:
    """A DFlash drafter's config.json, with the defaults and layout of the config class its model_type names."""
    family = FAMILIES.get(data.get("model_type", DRAFTER_DEFAULT_FAMILY), FAMILIES[DRAFTER_DEFAULT_FAMILY])
    return DrafterConfig.from_dict(data, source, family)


def build_drafter(cfg: DrafterConfig, tp=None):
    """The drafter model class its config's architectures name (TensorRT-LLM's `_build_dflash_draft` chooses so too);
    torch is imported here, not when a config is read. tp: distributed.parallel.Parallel, None for one rank."""
    from ..distributed.parallel import SINGLE

    if cfg.laguna_drafter:
        from .laguna_drafter import LagunaDrafter

        return LagunaDrafter(cfg, tp or SINGLE)
    from .drafter import DFlashDrafter

    return DFlashDrafter(cfg, tp or SINGLE)


def read_as_transformers(model_type: str, data: dict[str, Any]) -> dict[str, Any] | None:
    """config.json as its transformers config class reads it (config/family.py read_as_transformers)."""
    return _read_as_transformers(model_type, data, FAMILIES.get(model_type))
