"""The measured cost of one decode step: seconds as a function of (running batch, draft length, context).

A grid of medians measured on the serving machine (`calibrate.py`), interpolated piecewise-linearly:
in the draft length between measured lengths, in the batch size and the context length with linear
extrapolation past the largest measured (the cost of a dense step grows linearly in tokens there).
Draft length 0 is a plain step: the target alone on each request's last token.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import DFlashError

FORMAT = "dflash-step-cost/1"


def interpolate(xs: tuple[int, ...], ys, x: float):
    """Piecewise-linear through (xs, ys); flat below the first point (a step never gets cheaper than the
    smallest one measured), extended past the last along the last segment's slope when it rises (dense
    work grows linearly in tokens), flat when it falls. ys: numbers, or arrays interpolated elementwise."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if x > x1:  # past the end: never falling (a noisy last segment must not predict a free step)
        return y1 + np.maximum(0.0, y1 - y0) * (x - x1) / (x1 - x0)
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def monotone(values: list[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators): more work never costs less, so a
    dip in the measurements is noise; pooling keeps the level instead of taking the noisy maximum."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1), (m2, w2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2]
    return [m for m, w in blocks for _ in range(int(w))]


@dataclass
class CostModel:
    """seconds[c][b][k]: median seconds of one step at contexts[c], batch_sizes[b], draft_lens[k]."""

    batch_sizes: tuple[int, ...]
    draft_lens: tuple[int, ...]
    contexts: tuple[int, ...]
    seconds: list[list[list[float]]]
    meta: dict[str, Any] = field(default_factory=dict)  # device, threads, spread, how it was measured

    def __post_init__(self):
        self.batch_sizes, self.draft_lens, self.contexts = map(tuple, (self.batch_sizes, self.draft_lens,
                                                                       self.contexts))
        for name, axis, low in (("batch_sizes", self.batch_sizes, 1), ("draft_lens", self.draft_lens, 0),
                                ("contexts", self.contexts, 1)):
            if not axis or list(axis) != sorted(set(axis)) or axis[0] < low:
                raise DFlashError(f"step cost model: {name} must be increasing integers >= {low}, got {list(axis)}")
        if self.draft_lens[0] != 0:
            raise DFlashError(f"step cost model: draft_lens must start at 0 (a plain step), got {list(self.draft_lens)}")
        shape = (len(self.contexts), len(self.batch_sizes), len(self.draft_lens))
        if _shape(self.seconds) != shape or not all(math.isfinite(v) and v > 0 for v in _flat(self.seconds)):
            raise DFlashError(f"step cost model: seconds must be positive numbers of shape {shape} "
                              "(contexts x batch sizes x draft lengths)")
        self._tables: dict[tuple[int, int], np.ndarray] = {}  # step_seconds' per-(batch, max_draft_len) tables

    @property
    def max_draft_len(self) -> int:
        return self.draft_lens[-1]

    def step_seconds(self, batch: int, context: int, max_draft_len: int) -> np.ndarray:
        """-> [top + 1] seconds of one step at draft length 0, 1, ..., top = min(max_draft_len, the measured
        maximum). Asked every step: the batch and draft-length axes are interpolated once per (batch,
        max_draft_len) and kept, the context (which moves every step) last, as one array operation."""
        table = self._tables.get((batch, max_draft_len))
        if table is None:
            table = self._tables[batch, max_draft_len] = self.context_table(batch, max_draft_len)
        return interpolate(self.contexts, table, context)

    def context_table(self, batch: int, max_draft_len: int) -> np.ndarray:
        """[contexts, top + 1]: seconds at each measured context for draft length 0..top at this batch."""
        top, rows = min(max_draft_len, self.max_draft_len), []
        for grid in self.seconds:  # [batch sizes][draft lengths] at one context
            per_k = [interpolate(self.batch_sizes, [row[k] for row in grid], batch) for k in range(len(self.draft_lens))]
            rows.append([interpolate(self.draft_lens, per_k, k) for k in range(top + 1)])
        return np.asarray(rows, dtype=float)

    def covers(self, batch: int, max_draft_len: int) -> bool:
        """Measured up to this batch size and draft length (contexts are extrapolated)."""
        return self.batch_sizes[-1] >= batch and self.max_draft_len >= max_draft_len

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> CostModel:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise DFlashError(f"{where}: not a step cost model (expected format {FORMAT})")
        try:
            return cls(data["batch_sizes"], data["draft_lens"], data["contexts"], data["seconds"],
                       data.get("meta", {}))
        except (KeyError, TypeError) as exc:
            raise DFlashError(f"{where}: malformed step cost model ({exc})") from None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)  # atomic: a concurrent reader sees the old file or the new one

    @classmethod
    def load(cls, path: Path) -> CostModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DFlashError(f"cannot read step cost model {path}: {exc}") from None
        return cls.from_json(data, str(path))


def _shape(nested) -> tuple[int, ...]:
    if not isinstance(nested, list):
        return ()
    if not nested:
        return (0,)
    inner = {_shape(x) for x in nested}
    return (len(nested), *inner.pop()) if len(inner) == 1 else (-1,)


def _flat(nested):
    for x in nested:
        if isinstance(x, list):
            yield from _flat(x)
        else:
            yield x if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan
