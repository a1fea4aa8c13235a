"""Tensor names of a published checkpoint mapped onto the runtime's, by ordered regex substitutions."""

from __future__ import annotations

import re


def rename(name: str, renames: list[tuple[re.Pattern, str]]) -> str:
    """`name` with every (pattern, replacement) applied in order."""
    for pattern, target in renames:
        name = pattern.sub(target, name)
    return name


def renamed(tensors: dict, renames: list[tuple[re.Pattern, str]]) -> dict:
    """{rename(name): tensor} for every tensor."""
    return {rename(name, renames): t for name, t in tensors.items()}
