"""The engine manifest: what an engine directory is, how it was made, and checksums of every file."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..utils.errors import DFlashError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
RUNTIME_CACHE = "calibration"  # step-cost models measured where the engine runs: not part of the build
GRAPH_STORE = "compiled"  # step graphs compiled where the engine runs (graph_store.py): not part of the build


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass
class Manifest:
    backend: str
    target: dict[str, Any]  # source, model_type, config_sha256, layers, hidden, vocab
    drafter: dict[str, Any]
    tp_size: int
    dtype: str
    quantization: str
    block_size: int
    limits: dict[str, int]  # max_batch_size, max_seq_len, max_num_tokens
    tokenizer: str | None  # directory inside the engine
    build_command: str
    tool_version: str
    created_utc: str
    backend_details: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    format_version: int = FORMAT_VERSION

    def write(self, engine_dir: Path) -> None:
        self.files = {str(p.relative_to(engine_dir)): sha256_file(p)
                      for p in sorted(engine_dir.rglob("*")) if p.is_file() and p.name != MANIFEST}
        (engine_dir / MANIFEST).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, engine_dir: Path) -> Manifest:
        path = Path(engine_dir) / MANIFEST
        if not path.is_file():
            raise DFlashError(f"not an engine directory (no {MANIFEST}): {engine_dir}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise DFlashError(f"{path} is not valid JSON: {exc}") from None
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise DFlashError(f"{path}: engine format_version {version!r} is not supported (this tool reads "
                              f"{FORMAT_VERSION})")
        try:
            return cls(**data)
        except TypeError as exc:
            raise DFlashError(f"{path}: malformed manifest ({exc})") from None

    def check_files(self, engine_dir: Path) -> list[str]:
        """Problems found re-hashing every listed file; empty when the engine is intact."""
        problems = []
        for rel, digest in self.files.items():
            path = Path(engine_dir) / rel
            if not path.is_file():
                problems.append(f"missing file {rel}")
            elif sha256_file(path) != digest:
                problems.append(f"checksum mismatch for {rel}")
        extra = {str(p.relative_to(engine_dir)) for p in Path(engine_dir).rglob("*")
                 if p.is_file() and p.relative_to(engine_dir).parts[0] not in (RUNTIME_CACHE, GRAPH_STORE)}
        problems += [f"unlisted file {rel}" for rel in sorted(extra - set(self.files) - {MANIFEST})]
        return problems


def is_engine(path: Path) -> bool:
    try:
        data = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"format_version", "backend", "files"} <= set(data)
