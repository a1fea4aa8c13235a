"""Live correction of the calibrated step cost: what steps measure while serving, fed back.

Calibration times steps back to back on an idle engine; a serving process steps between other work (tokenizing,
admissions, the server's threads on the same cores). The grid keeps the shape (how cost grows with batch, draft
length and context); this keeps its level honest: one factor for plain steps (k = 0) and one for drafting steps
(k > 0), each the decayed mean of log(measured / predicted) over the steps of its kind, shrunk toward 1 while
evidence is thin and clipped so a stray step cannot make a kind look free or prohibitive. A padded shape's first
steps since the allocation (CUDA graphs' warm-up and recording) are not fed at all (`Runner.count_shape`).

Only the two factors' ratio moves the policy's choice, and on a shared machine another process's load comes and
goes over a few steps: a run of slow drafting steps would price drafting up and, with no drafting step timed
after, keep it there. So a factor moves only by as much as its mean exceeds `noise` standard errors of that mean,
from the kind's own step-to-step spread (a dead band; one step moves nothing): a steady overrun is still learned,
scatter around the calibration is not. benchmarks/results/draft_len_repeats.json
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CorrectionSettings:
    decay: float = 0.9  # per timed step of a kind: its memory is about 1 / (1 - decay) = 10 steps
    prior_weight: float = 1.0  # pseudo-steps of ratio 1 behind each factor
    bounds: tuple[float, float] = (0.5, 3.0)  # each step's ratio is clipped to this range
    # A factor moves only by as much as its mean log ratio exceeds this many standard errors of that mean (a dead
    # band the size of the kind's own measured step-to-step spread; with fewer than two steps of a kind, no
    # spread is known and the factor stays 1). 0: the plain shrunk mean.
    noise: float = 2.0


class StepCostCorrection:
    def __init__(self, settings: CorrectionSettings = CorrectionSettings()):
        self.settings = settings
        self.log_sum = [0.0, 0.0]  # [plain, drafting]: decayed sums of log(measured / predicted)
        self.square_sum = [0.0, 0.0]  # ... of their squares
        self.weight = [0.0, 0.0]  # decayed step counts
        self.weight_sq = [0.0, 0.0]  # decayed sums of the squared weights (effective steps: weight^2 / weight_sq)

    def observe(self, draft_len: int, measured_s: float, predicted_s: float) -> None:
        if not (measured_s > 0 and predicted_s > 0):
            return
        low, high = self.settings.bounds
        kind, d = int(draft_len > 0), self.settings.decay
        ratio = math.log(min(high, max(low, measured_s / predicted_s)))
        self.log_sum[kind] = d * self.log_sum[kind] + ratio
        self.square_sum[kind] = d * self.square_sum[kind] + ratio * ratio
        self.weight[kind] = d * self.weight[kind] + 1.0
        self.weight_sq[kind] = d * d * self.weight_sq[kind] + 1.0

    def factors(self) -> tuple[float, float]:
        """-> (plain, drafting) multipliers of the calibrated seconds."""
        return tuple(math.exp(self.log_factor(kind)) for kind in (0, 1))

    def log_factor(self, kind: int) -> float:
        """The kind's decayed mean log ratio shrunk toward 0 by `prior_weight` pseudo-steps, then by `noise`
        standard errors of the mean (soft threshold): evidence inside the kind's own step-to-step spread moves
        nothing."""
        s, total, n, n2 = self.settings, self.log_sum[kind], self.weight[kind], self.weight_sq[kind]
        shrunk = total / (n + s.prior_weight) if n > 0 else 0.0
        if s.noise <= 0:
            return shrunk
        effective = n * n / n2 if n2 > 0 else 0.0  # Kish's effective number of steps behind the decayed mean
        if effective < 1.5:  # one step (two steps weigh 1.99)
            return 0.0
        mean = total / n
        variance = max(self.square_sum[kind] / n - mean * mean, 0.0) * effective / (effective - 1.0)
        band = s.noise * math.sqrt(variance / effective)
        return math.copysign(max(abs(shrunk) - band, 0.0), shrunk)

    def apply(self, seconds: np.ndarray) -> np.ndarray:
        """seconds [K + 1] at draft length 0..K -> corrected (a new array)."""
        plain, drafting = self.factors()
        out = np.asarray(seconds, dtype=float) * drafting
        out[0] = seconds[0] * plain
        return out
