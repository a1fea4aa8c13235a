"""The sweep specification: flags and/or a YAML preset, validated once; errors name the setting and the value.

Setting names are the flag names (`--prompts-per-point` is `prompts_per_point` in a preset), so a
preset and a command line read the same. Explicit flags win over the preset.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..utils.errors import DFlashError
from ..utils.settings_file import read_settings

APIS = ("triton-http", "triton-grpc", "openai")
DEFAULT_LADDER = (1, 2, 4, 8, 16, 32, 64)
PROMPTS_PER_LOAD = 10  # prompts per point = 10 x concurrency (or x request rate)
WARMUP_PER_LOAD = 2


@dataclass(frozen=True)
class LoadPoint:
    """One point of the sweep: N requests in flight, or Poisson arrivals at `rate` (capped at N when set)."""

    concurrency: int | None
    rate: float | None = None  # requests/s

    @property
    def name(self) -> str:
        if self.rate is None:
            return f"c{self.concurrency}"
        return f"r{self.rate:g}" + (f"-c{self.concurrency}" if self.concurrency else "")

    @property
    def load(self) -> float:
        """The x of 'against load' plots: concurrency, or the request rate."""
        return float(self.concurrency if self.rate is None else self.rate)


@dataclass(frozen=True)
class SweepSpec:
    url: str
    model: str
    api: str = "triton-http"
    concurrency: tuple[int, ...] | None = None  # default: 1..64 doubling; with request_rate: the in-flight cap
    request_rate: tuple[float, ...] = ()  # requests/s, one point each (Poisson arrivals)
    prompts_per_point: int | None = None  # default: 10 x load
    duration: float | None = None  # seconds per point, instead of prompts_per_point
    warmup: int | None = None  # requests before each point, excluded; default 2 x load
    isl: int = 1024  # input tokens (random prompts: lengths drawn in [isl_range x isl, isl])
    osl: int = 1024  # output tokens, EOS ignored
    isl_range: float = 0.8
    dataset: str | None = None  # JSONL of {"prompt": ...} or {"messages": [...]}
    tokenizer: str | None = None  # model directory, engine directory, or hub id
    num_gpus: int | None = None  # GPUs serving (TP x PP x replicas); default: the engine's TP, else 1
    label: str | None = None  # default: the model name
    output: str | None = None  # run directory; default bench_runs/<label>-<UTC time>
    seed: int = 0
    timeout: float = 600.0  # seconds per request before it counts as stuck
    temperature: float = 0.0
    metrics_url: str | None = None  # Prometheus endpoint; default: sweep.metrics_urls; 'none' disables

    def __post_init__(self):
        for name in ("url", "model"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise DFlashError(f"--{name} is required")
        if self.api not in APIS:
            raise DFlashError(f"--api: unknown API {self.api!r} (choose from {', '.join(APIS)})")
        object.__setattr__(self, "concurrency", _ints("concurrency", self.concurrency))
        object.__setattr__(self, "request_rate", _floats("request_rate", self.request_rate) or ())
        if self.request_rate and self.concurrency and len(self.concurrency) > 1:
            raise DFlashError(f"--concurrency with --request-rate is one in-flight cap, got "
                              f"{','.join(map(str, self.concurrency))}")
        if self.prompts_per_point is not None and self.duration is not None:
            raise DFlashError("--prompts-per-point and --duration exclude each other; give one")
        for name in ("prompts_per_point", "isl", "osl", "num_gpus"):
            _positive_int(name, getattr(self, name))
        for name in ("warmup", "seed"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise DFlashError(f"--{_flag(name)} must be a non-negative integer, got {value!r}")
        for name in ("duration", "timeout"):
            _positive_number(name, getattr(self, name))
        if not _is_number(self.isl_range) or not 0 < self.isl_range <= 1:
            raise DFlashError(f"--isl-range must be in (0, 1], got {self.isl_range!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise DFlashError(f"--temperature must be >= 0, got {self.temperature!r}")
        for name in ("dataset", "tokenizer", "label", "output", "metrics_url"):  # a preset may hold any YAML type
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise DFlashError(f"--{_flag(name)} must be a non-empty string, got {value!r}")
        if self.dataset is not None and not Path(self.dataset).is_file():
            raise DFlashError(f"--dataset: no such file: {self.dataset}")

    @property
    def points(self) -> list[LoadPoint]:
        if self.request_rate:
            cap = self.concurrency[0] if self.concurrency else None
            return [LoadPoint(cap, rate) for rate in self.request_rate]
        return [LoadPoint(c) for c in (self.concurrency or DEFAULT_LADDER)]

    def requests_for(self, point: LoadPoint) -> int | None:
        """Measured requests of a point (None: run for `duration` seconds)."""
        if self.duration is not None:
            return None
        return self.prompts_per_point or max(1, math.ceil(PROMPTS_PER_LOAD * point.load))

    def warmup_for(self, point: LoadPoint) -> int:
        return self.warmup if self.warmup is not None else max(1, math.ceil(WARMUP_PER_LOAD * point.load))

    @property
    def run_label(self) -> str:
        return self.label or self.model

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_sources(cls, preset: str | None, flags: dict[str, Any]) -> SweepSpec:
        """A preset's settings, then the flags that were given (not None) on top; unknown keys are errors."""
        data = read_settings(preset, f"--preset: no such file: {preset}", f"preset {preset}",
                             "sweep settings") if preset else {}
        data.update({k: v for k, v in flags.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            where = f"preset {preset}" if preset else "sweep settings"
            raise DFlashError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        for name in ("url", "model"):
            if name not in data:
                raise DFlashError(f"--{name} is required (a flag, or the preset key {name!r})")
        return cls(**data)


def parse_list(name: str, value: Any) -> list[str]:
    """'1,2,4' or [1, 2, 4] -> ['1', '2', '4']; an empty item is an error naming the whole value."""
    items = [s.strip() for s in value.split(",")] if isinstance(value, str) else [str(v).strip() for v in value]
    if not items or any(not s for s in items):
        raise DFlashError(f"--{_flag(name)}: empty item in {_show(value)!r}")
    return items


def _ints(name: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if _is_int(value):
        value = [value]
    out = []
    for item in parse_list(name, value):
        if not item.isdigit() or int(item) < 1:
            raise DFlashError(f"--{_flag(name)}: {item!r} is not a positive integer (in {_show(value)!r})")
        out.append(int(item))
    if len(set(out)) != len(out):
        raise DFlashError(f"--{_flag(name)}: repeated value in {_show(value)!r}")
    return tuple(out)


def _floats(name: str, value: Any) -> tuple[float, ...] | None:
    if value is None or value == ():
        return None
    if _is_number(value):
        value = [value]
    out = []
    for item in parse_list(name, value):
        try:
            number = float(item)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            raise DFlashError(f"--{_flag(name)}: {item!r} is not a positive number (in {_show(value)!r})")
        out.append(number)
    return tuple(out)


def _positive_int(name: str, value: Any) -> None:
    if value is not None and (not _is_int(value) or value < 1):
        raise DFlashError(f"--{_flag(name)} must be a positive integer, got {value!r}")


def _positive_number(name: str, value: Any) -> None:
    if value is not None and (not _is_number(value) or not math.isfinite(value) or value <= 0):
        raise DFlashError(f"--{_flag(name)} must be a positive number, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _show(value: Any) -> str:
    return value if isinstance(value, str) else ",".join(map(str, value))


DEFAULT_LEVELS = (50.0, 100.0, 200.0, 500.0)


@dataclass(frozen=True)
class ReportSpec:
    runs: tuple[str, ...]  # run directories
    output: str = "bench_report"
    baseline: str | None = None  # a run's label; default: the first run
    interactivity: tuple[float, ...] = DEFAULT_LEVELS  # tok/s/user levels of the headline table
    interpolation: str = "pchip"  # or 'linear'
    plan: str | None = None  # a dflash-bench plan directory (or its plan.json) to overlay

    def __post_init__(self):
        if not self.runs:
            raise DFlashError("report: give at least one run directory")
        object.__setattr__(self, "runs", tuple(str(r) for r in self.runs))
        object.__setattr__(self, "interactivity", _floats("interactivity", self.interactivity))
        if not self.interactivity:
            raise DFlashError("--interactivity: give at least one level")
        if self.interpolation not in ("pchip", "linear"):
            raise DFlashError(f"--interpolation: unknown method {self.interpolation!r} (choose from pchip, linear)")
