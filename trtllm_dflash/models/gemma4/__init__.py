"""Gemma 4: config.py (its own config fields and the registry hooks), layers.py, model.py (Gemma4Target)."""

from __future__ import annotations


def build(cfg, tp):
    """The registry's model hook; model.py (torch) is imported when a model is built, not when a config is read."""
    from .model import Gemma4Target

    return Gemma4Target(cfg, tp)
