"""The rotary position embedding of a config.json: its type and parameters, validated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..utils.errors import DFlashError
from .fields import Fields

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_params(data: dict[str, Any], top_level: bool = False) -> dict[str, Any]:
    """config.json's RoPE parameters: transformers >= 5 writes `rope_parameters`, published checkpoints
    `rope_scaling`; both are read, `rope_parameters` winning (modeling_rope_utils.py, transformers 5.23).
    top_level: over the file's own fields (`partial_rotary_factor` may sit at either level)."""
    params = {**(data.get("rope_scaling") or {}), **(data.get("rope_parameters") or {})}
    return {**data, **params} if top_level else params


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 8192  # llama3, yarn
    beta_fast: float = 32.0  # yarn: rotations bounding the extrapolated band
    beta_slow: float = 1.0  # yarn: rotations bounding the interpolated band
    truncate: bool = True  # yarn: round the band's bounds to whole dimensions (gpt-oss: false)
    attention_factor: float | None = None  # yarn: cos/sin scale; None = 0.1 * ln(factor) + 1 (or from mscale)
    mscale: float | None = None
    mscale_all_dim: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> RopeConfig:
        params = rope_params(data)
        theta = params.get("rope_theta", data.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise DFlashError(f"{source}: unsupported rope_type {rope_type!r} (supported: {', '.join(ROPE_TYPES)})")
        # A top-level original_max_position_embeddings wins, else max_position_embeddings (standardize_rope_params).
        original = data.get("original_max_position_embeddings",
                            params.get("original_max_position_embeddings", data.get("max_position_embeddings", 8192)))
        f = Fields({**params, "rope_theta": theta, "original_max_position_embeddings": original}, source)
        original = f.get("original_max_position_embeddings", int, positive=True)
        factor = params.get("factor")
        if rope_type == "yarn" and factor is None:  # _compute_yarn_parameters: the context extension ratio
            factor = data.get("max_position_embeddings", original) / original
        return cls(
            theta=f.get("rope_theta", float, positive=True),
            rope_type=rope_type,
            factor=Fields({"factor": 1.0 if factor is None else factor}, source).get("factor", float, positive=True),
            low_freq_factor=f.get("low_freq_factor", float, 1.0, positive=True),
            high_freq_factor=f.get("high_freq_factor", float, 4.0, positive=True),
            original_max_position_embeddings=original,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=f.get("truncate", bool, True),
            attention_factor=f.get("attention_factor", float, None),
            mscale=f.get("mscale", float, None),
            mscale_all_dim=f.get("mscale_all_dim", float, None),
        )
