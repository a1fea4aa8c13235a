"""DeepSeek-V3 and Kimi-K2.5's text backbone: config.py (multi-head latent attention's fields and the registry
hooks), checkpoint.py (their weight names), model.py (DeepseekV3Target)."""

from __future__ import annotations


def build(cfg, tp):
    """The registry's model hook; model.py (torch) is imported when a model is built, not when a config is read."""
    from .model import DeepseekV3Target

    return DeepseekV3Target(cfg, tp)
