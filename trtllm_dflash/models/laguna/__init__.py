"""Laguna (poolside): config.py (its own config fields and the registry hooks), checkpoint.py (its weight names),
model.py (LagunaTarget)."""

from __future__ import annotations


def build(cfg, tp):
    """The registry's model hook; model.py (torch) is imported when a model is built, not when a config is read."""
    from .model import LagunaTarget

    return LagunaTarget(cfg, tp)
