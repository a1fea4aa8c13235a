"""TensorRT-LLM's LLM-API field tables, one per upstream version: which options a given release accepts.

Each tables/VERSION.json is written by tools/gen_fields.py, either generated from that release's
tensorrt_llm/llmapi/llm_args.py (`source.commit`, `source.sha256`) or derived from an older table plus the fields
the release's API reference adds (`source.derived_from`, `source.references`). `dflash-build --trtllm-version V`
picks the newest table not newer than V (default: the newest known), so an engine for an older container is not
offered options that release would reject; the manifest records the table's version and sha256.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from packaging.version import InvalidVersion, Version  # a dependency of transformers

from ...utils.errors import DFlashError

TABLES = Path(__file__).with_name("tables")


@dataclass(frozen=True)
class FieldTable:
    """One release's table: `data` is the JSON (source, root, classes, enums, aliases, removed_args)."""

    version: str
    data: dict
    sha256: str  # of the table file

    @property
    def label(self) -> str:
        return f"TensorRT-LLM {self.version} field table"

    def fields_of(self, cls: str) -> dict[str, dict]:
        return self.data["classes"][cls]["fields"]

    def has_field(self, cls: str, name: str) -> bool:
        return name in self.fields_of(cls)

    def record(self) -> dict:
        """What an engine's manifest keeps: the version, this table's hash, and where upstream it came from."""
        source = self.data["source"]
        upstream = (f"{source['repo']}@{source['commit']}" if source.get("commit")
                    else f"{source['repo']} API reference {self.version} over the "
                         f"{source['derived_from']['version']} table")
        return {"version": self.version, "table_sha256": self.sha256, "upstream": upstream}


def known_versions() -> list[str]:
    return sorted((p.stem for p in TABLES.glob("*.json")), key=Version)


@lru_cache(maxsize=None)
def load_table(version: str) -> FieldTable:
    path = TABLES / f"{version}.json"
    raw = path.read_bytes()
    return FieldTable(version, json.loads(raw), hashlib.sha256(raw).hexdigest())


def table_for(requested: str | None = None) -> FieldTable:
    """The newest known table whose version is at most `requested` (None: the newest known). One-line error for
    a version that does not parse or predates DFlash in TensorRT-LLM."""
    versions = known_versions()
    if requested is None:
        return load_table(versions[-1])
    try:
        wanted = Version(requested)
    except InvalidVersion:
        raise DFlashError(f"--trtllm-version {requested!r} is not a version (e.g. {versions[-1]})") from None
    fitting = [v for v in versions if Version(v) <= wanted]
    if not fitting:
        raise DFlashError(f"--trtllm-version {requested}: TensorRT-LLM has DFlash from {versions[0]} "
                          f"(known tables: {', '.join(versions)})")
    return load_table(fitting[-1])


def first_version_with(cls: str, field: str, after: str) -> str | None:
    """The oldest known release newer than `after` whose table has `cls.field`: the hint for an option the chosen
    release lacks."""
    for version in known_versions():
        table = load_table(version)
        if Version(version) > Version(after) and cls in table.data["classes"] and table.has_field(cls, field):
            return version
    return None
