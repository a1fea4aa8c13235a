"""Typed reads of config.json fields: every error names the file and the key."""

from __future__ import annotations

from typing import Any

from ..utils.errors import DFlashError


class Fields:
    """Reads typed fields from a config dict; errors name the source and the key."""

    def __init__(self, data: dict[str, Any], source: str):
        self.data, self.source = data, source

    def get(self, key: str | tuple[str, ...], kind: type, default: Any = ..., positive: bool = False,
            expect: str | None = None) -> Any:
        """data[key] as `kind` (an int is a float; a bool is no int), `default` when absent (`...`: required).

        key: a tuple reads the first spelling present (configs spell some fields two ways); positive: > 0;
        expect: one phrase for both refusals ("a positive int"), else "must be <kind>" / "must be positive"."""
        if isinstance(key, tuple):
            key = next((k for k in key if k in self.data), key[0])
        value = self.data.get(key, default)
        if value is ...:
            raise DFlashError(f"{self.source}: missing required field '{key}'")
        if value is None and default is None:
            return None
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok or (positive and value <= 0):
            phrase = expect or (kind.__name__ if not ok else "positive")
            raise DFlashError(f"{self.source}: field '{key}' must be {phrase}, got {value!r}")
        return value


def token_ids(value: Any, source: str, key: str, allow_empty: bool = True) -> tuple[int, ...]:
    """An int or a list of ints (eos_token_id, target_layer_ids) as a tuple."""
    if value is None:
        value = []
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise DFlashError(f"{source}: field '{key}' must be an int or a list of ints, got {value!r}")
    if not value and not allow_empty:
        raise DFlashError(f"{source}: field '{key}' must not be empty")
    return tuple(value)
