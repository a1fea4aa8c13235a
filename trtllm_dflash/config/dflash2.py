"""DFlash2's own drafter fields: the grouped dynamic convolutions and the candidate selector.

Read where z-lab's layout keeps them, `dflash_config.{conv_kernel_size, conv_group_size, selector_rank,
selector_top_k}` (TensorRT-LLM reads them there too: `tensorrt_llm/_torch/models/modeling_dflash.py`
DFlashForCausalLM.__init__, PR #18155), with speculators 0.9.0's defaults (`speculators/models/dflash2/config.py:26-45`:
2, 16, 256, 16). A drafter is DFlash2 when an architecture names it: TensorRT-LLM's rule, any architecture whose name
lower-cased without `_`/`-` contains "dflash2" (modeling_dflash.py `_is_dflash2_architecture`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..utils.errors import DFlashError
from .fields import Fields

ARCHITECTURE = "DFlash2DraftModel"
KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}


def is_dflash2(architectures: list[str]) -> bool:
    return any("dflash2" in str(a).lower().replace("_", "").replace("-", "") for a in architectures)


@dataclass(frozen=True)
class DFlash2Config:
    """conv_kernel_size: taps k of each convolution (tap 0 = the token itself); conv_group_size: channels sharing one
    dynamic tap (G = hidden / group groups); selector_rank: r of the bilinear codebooks; selector_top_k: K unary
    candidates the selector rescores. block_size: the drafter's, where the convolutions restart along a row of packed
    blocks (not a DFlash2 field of its own, so not compared)."""

    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16
    block_size: int = field(default=16, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str, hidden: int, block_size: int, vocab: int) -> DFlash2Config:
        """data: dflash_config over the top-level fields (dflash_config wins, as for DFlash's own fields)."""
        f = Fields(data, source)
        cfg = cls(**{key: f.get(key, int, DEFAULTS[key], positive=True, expect="a positive int") for key in KEYS},
                  block_size=block_size)
        k, group, top_k = cfg.conv_kernel_size, cfg.conv_group_size, cfg.selector_top_k
        if hidden % group:  # speculators model_definitions.py:117-121
            raise DFlashError(f"{source}: field 'conv_group_size' {group} does not divide hidden_size {hidden}")
        if k > block_size:  # model_definitions.py:122-125
            raise DFlashError(f"{source}: field 'conv_kernel_size' {k} exceeds block_size {block_size}")
        if not 2 <= top_k <= vocab:  # TensorRT-LLM _validate_dflash2_config (>= 2); dflash2/core.py:44-48 (<= V)
            raise DFlashError(f"{source}: field 'selector_top_k' must be in 2..vocab_size {vocab}, got {top_k}")
        return cfg
