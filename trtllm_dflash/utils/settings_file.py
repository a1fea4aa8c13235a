"""Reading the files users hand the tools: YAML settings (a build config, a sweep preset: one mapping, keys as
flag names) and UTF-8 line files (datasets, calibration prompts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import DFlashError


def load_yaml(path: str | Path, missing: str, name: str) -> Any:
    """-> the parsed document (None when empty). missing: the error for an absent file; name: how errors
    call the file."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise DFlashError(missing)
    try:
        return yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise DFlashError(f"{name} is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None


def read_settings(path: str, missing: str, name: str, kind: str) -> dict[str, Any]:
    """-> {setting: value} with '-' in keys read as '_'. missing: the error for an absent file;
    name: how errors call the file; kind: what the mapping holds (e.g. 'build settings')."""
    data = load_yaml(path, missing, name)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DFlashError(f"{name} must hold a YAML mapping of {kind}, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def utf8_lines(path: str | Path, name: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file (a dataset, prompts); a line that is not UTF-8 is one
    error naming `name`, the line and the byte. OSError (a missing file) propagates to the caller."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DFlashError(f"{name}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                                  f"{exc.start + 1})") from None
