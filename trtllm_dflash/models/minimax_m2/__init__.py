"""MiniMax-M2 / M2.5: config.py (the registry hooks), checkpoint.py (its weight names), model.py (MiniMaxM2Target)."""

from __future__ import annotations


def build(cfg, tp):
    """The registry's model hook; model.py (torch) is imported when a model is built, not when a config is read."""
    from .model import MiniMaxM2Target

    return MiniMaxM2Target(cfg, tp)
