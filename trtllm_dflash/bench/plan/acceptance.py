"""Tokens a DFlash step commits, from an acceptance profile.

A profile holds per-position conditional acceptance rates a_1..a_n: a_i is the probability that draft
position i is accepted given that positions 1..i-1 were (the longest-prefix rule of speculative decoding).
A step that drafts k tokens then commits, in expectation (the bonus token included),

    E[tokens | k] = 1 + sum_{i=1..k} prod_{j=1..i} a_j          (1 <= E <= k + 1)

Profile file (JSON; `dflash-bench acceptance` writes it from measured runs, measured.py):

    {"format": "dflash-acceptance-profile/1",
     "per_position": [0.92, 0.88, 0.85, ...],      # a_1..a_n, each in [0, 1]; the plan drafts at most n tokens
     "observations": [412, 380, 335, ...],         # optional: steps that tried position i (a_i's denominator)
     "source": "dflash-generate --json, Qwen3-8B, MT-Bench, T=0"}   # optional free text

`--tau T` instead states the geometric model: one rate a for every position, solved so that drafting
block_size - 1 tokens gives E = T (T = mean acceptance length, bonus token included, as DFlash's papers
report it). It is a model, not a measurement: measured profiles fall faster at deep positions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ...utils.errors import DFlashError

FORMAT = "dflash-acceptance-profile/1"
FILE_KEYS = ("format", "per_position", "observations", "source")


@dataclass(frozen=True)
class AcceptanceProfile:
    """Conditional per-position acceptance rates and where they came from."""

    per_position: tuple[float, ...]
    source: str
    observations: tuple[int, ...] | None = None  # steps that tried position i, where measured

    def __post_init__(self):
        if not self.per_position:
            raise DFlashError(f"acceptance profile ({self.source}): per_position is empty")
        bad = [a for a in self.per_position if not 0.0 <= a <= 1.0]
        if bad:
            raise DFlashError(f"acceptance profile ({self.source}): rates must lie in [0, 1], got {bad[0]!r}")
        if self.observations is not None and len(self.observations) != len(self.per_position):
            raise DFlashError(f"acceptance profile ({self.source}): {len(self.observations)} observations for "
                              f"{len(self.per_position)} rates")

    def tokens_per_step(self, k: int) -> float:
        """E[tokens committed | k drafted], bonus token included."""
        if k > len(self.per_position):
            raise DFlashError(f"acceptance profile ({self.source}) covers {len(self.per_position)} positions; "
                              f"draft length {k} needs more")
        total, reach = 1.0, 1.0
        for a in self.per_position[:k]:
            reach *= a
            total += reach
        return total

    def to_dict(self) -> dict:
        counts = {} if self.observations is None else {"observations": list(self.observations)}
        return {"format": FORMAT, "per_position": list(self.per_position), **counts, "source": self.source}


def geometric(tau: float, block_size: int) -> AcceptanceProfile:
    """The constant rate a with 1 + a + ... + a^(B-1) = tau."""
    if not 1.0 <= tau <= block_size:
        raise DFlashError(f"--tau {tau} must lie in [1, block size {block_size}] (it counts the bonus token)")
    rate = constant_rate(tau, block_size - 1)
    return AcceptanceProfile((rate,) * (block_size - 1), f"--tau {tau:g}: geometric model, rate {rate:.4f} "
                                                          f"at every position (block size {block_size})")


def constant_rate(tokens: float, k: int) -> float:
    """The a in [0, 1] with 1 + a + ... + a^k = tokens (1 <= tokens <= k + 1), by bisection: E grows with a."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(k + 1)) < tokens else (lo, mid)
    return (lo + hi) / 2


def read_profile(path: str | Path) -> AcceptanceProfile:
    """Read and validate a profile file; errors name the file."""
    name = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DFlashError(f"no such acceptance file: {name}") from None
    except (OSError, ValueError) as exc:
        raise DFlashError(f"{name}: not a JSON acceptance profile ({exc})") from None
    if not isinstance(data, dict) or "per_position" not in data:
        raise DFlashError(f"{name}: an acceptance profile is an object with 'per_position' (format {FORMAT})")
    unknown = sorted(str(k) for k in data if k not in FILE_KEYS)
    if unknown:
        raise DFlashError(f"{name}: unknown key {unknown[0]!r} (known: {', '.join(FILE_KEYS)})")
    if data.get("format", FORMAT) != FORMAT:
        raise DFlashError(f"{name}: format {data['format']!r} is not supported (this tool reads {FORMAT})")
    rates = data["per_position"]
    if not isinstance(rates, list) or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in rates):
        raise DFlashError(f"{name}: per_position must be a list of numbers, got {rates!r}")
    counts = data.get("observations")
    if counts is not None and (not isinstance(counts, list) or not all(isinstance(n, int) and n >= 0 for n in counts)):
        raise DFlashError(f"{name}: observations must be a list of step counts, got {counts!r}")
    return AcceptanceProfile(tuple(float(a) for a in rates), f"{name}: {data.get('source') or 'measured profile'}",
                             None if counts is None else tuple(counts))


def write_profile(path: str | Path, profile: AcceptanceProfile) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    return path


def acceptance_from_steps(steps: Iterable[tuple[int, int]], source: str) -> AcceptanceProfile:
    """Per-position rates from verify steps (draft length k, acceptance length n = accepted drafts + the bonus
    token, 1..k + 1). Position i was tried by a step when k >= i and drafts 1..i-1 were accepted (n >= i), and
    accepted when n > i: a_i = #(k >= i, n > i) / #(k >= i, n >= i). Plain steps (k = 0) try nothing; the
    profile ends before the first position no step tried."""
    steps = [(int(k), int(n)) for k, n in steps]
    bad = [(k, n) for k, n in steps if k < 0 or not 1 <= n <= k + 1]
    if bad:
        raise DFlashError(f"{source}: a step with draft length {bad[0][0]} has acceptance length {bad[0][1]} "
                          f"(must be 1..{bad[0][0] + 1}, bonus token included)")
    rates, counts = [], []
    for i in range(1, max((k for k, _ in steps), default=0) + 1):
        tried = [n for k, n in steps if k >= i and n >= i]
        if not tried:
            break
        rates.append(sum(n > i for n in tried) / len(tried))
        counts.append(len(tried))
    if not rates:
        raise DFlashError(f"{source}: no drafted step to measure acceptance from")
    return AcceptanceProfile(tuple(rates), source, tuple(counts))
