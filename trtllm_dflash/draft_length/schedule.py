"""The draft-length schedule: how many tokens to draft at each running batch size.

This is TensorRT-LLM's `speculative_config.draft_len_schedule`, stored in a small YAML file that
`dflash-bench tune` writes and `dflash-build --backend trtllm --draft-len-schedule FILE` reads.

File (YAML; JSON is valid YAML, and its string keys "8" are read as 8):

    format: dflash-draft-len-schedule/1   # optional
    max_draft_len: 15                     # optional; when present it must equal the engine's
    schedule:                             # required: batch-size threshold -> draft length
      1: 15                               #   running batch 1       -> 15 draft tokens
      8: 7                                #   running batch 2..8    -> 7
      32: 3                               #   running batch 9..32   -> 3; above 32 -> 0
    source: dflash-bench tune ...         # optional free text: what produced it

A bare mapping (`{1: 15, 8: 7}`, the value TensorRT-LLM itself takes) is read too.

Rules, from TensorRT-LLM's validator (NVIDIA/TensorRT-LLM@58ae162a, tensorrt_llm/llmapi/llm_args.py,
DecodingBaseConfig.validate_draft_len_schedule_and_sort and the draft_len_schedule field):
thresholds >= 1; draft lengths >= 0; the smallest threshold maps to max_draft_len; no draft length
exceeds max_draft_len; a batch size above the largest threshold drafts 0 tokens (speculation off);
draft_len_schedule and max_concurrency are mutually exclusive. DFlash follows a runtime draft length
of 0 by skipping the drafter (tensorrt_llm/_torch/speculative/dflash.py @58ae162a, `K == 0`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.errors import DFlashError
from ..utils.settings_file import load_yaml

FORMAT = "dflash-draft-len-schedule/1"
FILE_KEYS = ("format", "max_draft_len", "schedule", "source")


@dataclass(frozen=True)
class DraftLenSchedule:
    """Sorted (largest batch size, draft length) steps; validated when built."""

    steps: tuple[tuple[int, int], ...]
    source: str = ""

    def __post_init__(self):
        if not self.steps:
            raise DFlashError("draft_len_schedule: the schedule is empty (give at least one batch size)")
        batches = [batch for batch, _ in self.steps]
        if len(set(batches)) != len(batches):
            raise DFlashError(f"draft_len_schedule: a batch-size threshold appears twice in {batches}")
        for batch, length in self.steps:
            if batch < 1:
                raise DFlashError(f"draft_len_schedule: batch-size threshold must be >= 1, got {batch}")
            if length < 0:
                raise DFlashError(f"draft_len_schedule: draft length must be >= 0, got {length} at batch {batch}")

    @classmethod
    def from_mapping(cls, mapping: dict, source: str = "", where: str = "draft_len_schedule") -> DraftLenSchedule:
        steps = sorted((_as_int(k, where, "batch-size threshold"), _as_int(v, where, f"draft length at {k}"))
                       for k, v in mapping.items())
        return cls(tuple(steps), source)

    @property
    def max_draft_len(self) -> int:
        """The draft length at the smallest threshold (TensorRT-LLM requires it to be max_draft_len)."""
        return self.steps[0][1]

    def draft_len(self, batch_size: int) -> int:
        """Draft tokens at a running batch size: the step of the smallest threshold >= it, else 0."""
        return next((length for limit, length in self.steps if batch_size <= limit), 0)

    def check_for(self, max_draft_len: int) -> None:
        """Raise unless TensorRT-LLM accepts this schedule beside `max_draft_len`."""
        first_batch, first_len = self.steps[0]
        if first_len != max_draft_len:
            raise DFlashError(f"draft_len_schedule: the smallest batch size {first_batch} must map to max_draft_len "
                              f"{max_draft_len} (TensorRT-LLM requires it), got {first_len}")
        too_long = [(b, n) for b, n in self.steps if n > max_draft_len]
        if too_long:
            raise DFlashError(f"draft_len_schedule: draft length {too_long[0][1]} at batch {too_long[0][0]} exceeds "
                              f"max_draft_len {max_draft_len}")

    def as_option(self) -> dict[int, int]:
        """The value of `speculative_config.draft_len_schedule`."""
        return dict(self.steps)

    def to_text(self) -> str:
        lines = [f"# draft-length schedule: running batch size <= threshold -> draft tokens; above the last "
                 f"threshold, 0", f"format: {FORMAT}", f"max_draft_len: {self.max_draft_len}", "schedule:"]
        lines += [f"  {batch}: {length}" for batch, length in self.steps]
        if self.source:
            import json

            lines.append(f"source: {json.dumps(self.source)}")  # a JSON string is a valid YAML scalar
        return "\n".join(lines) + "\n"


def read_schedule(path: str | Path) -> DraftLenSchedule:
    """Read and validate a schedule file; errors name the file."""
    name = str(path)
    data = load_yaml(path, f"no such draft-length schedule file: {name}", name)
    if not isinstance(data, dict) or not data:
        raise DFlashError(f"{name}: a draft-length schedule must be a mapping (schedule: {{batch size: draft "
                          f"length}}), got {data!r}")
    if "schedule" not in data:  # the bare form: the upstream value itself
        return DraftLenSchedule.from_mapping(data, where=name)
    unknown = sorted(str(k) for k in data if k not in FILE_KEYS)
    if unknown:
        raise DFlashError(f"{name}: unknown key {unknown[0]!r} (known: {', '.join(FILE_KEYS)})")
    if data.get("format", FORMAT) != FORMAT:
        raise DFlashError(f"{name}: format {data['format']!r} is not supported (this tool reads {FORMAT})")
    if not isinstance(data["schedule"], dict):
        raise DFlashError(f"{name}: 'schedule' must be a mapping of batch size to draft length, got "
                          f"{data['schedule']!r}")
    schedule = DraftLenSchedule.from_mapping(data["schedule"], str(data.get("source") or ""), name)
    if "max_draft_len" in data:
        declared = _as_int(data["max_draft_len"], name, "max_draft_len")
        if declared != schedule.max_draft_len:
            raise DFlashError(f"{name}: max_draft_len {declared} disagrees with the schedule's first step "
                              f"{schedule.steps[0][0]}: {schedule.max_draft_len}")
    return schedule


def write_schedule(path: str | Path, schedule: DraftLenSchedule) -> Path:
    """Write atomically (a temporary sibling renamed into place): a reader never sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(schedule.to_text())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _as_int(value: Any, where: str, what: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise DFlashError(f"{where}: {what} must be an integer, got {value!r}")
