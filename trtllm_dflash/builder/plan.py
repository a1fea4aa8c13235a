"""What a backend writer gets: the build plan, checked before a byte is written, and the tokenizer files."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint.drafter import DrafterCheckpoint
from ..config.model import DrafterConfig

if TYPE_CHECKING:
    from .spec import BuildSpec

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja")


@dataclass
class BuildPlan:
    """Everything a backend writer needs, checked before a byte is written."""

    spec: BuildSpec
    target_dir: Path
    target: Any  # as the backend reads it (Backend.read_target): a TargetConfig or a TrtllmTarget
    target_json: dict
    drafter_checkpoint: DrafterCheckpoint  # either format; its layout is z-lab's
    block_size: int
    max_seq_len: int
    final_dir: Path

    @property
    def drafter_dir(self) -> Path:
        return self.drafter_checkpoint.path

    @property
    def drafter(self) -> DrafterConfig:
        return self.drafter_checkpoint.config

    @property
    def drafter_json(self) -> dict:
        """The drafter's config.json in z-lab's layout, whatever the input format."""
        return self.drafter_checkpoint.layout


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    dst.mkdir(parents=True, exist_ok=True)
    copied = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    for name in copied:
        shutil.copy2(src / name, dst / name)
    return copied
