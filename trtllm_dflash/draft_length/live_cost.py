"""Live correction of the calibrated step cost: what steps measure while serving, fed back.

Calibration times steps back to back on an idle engine. A serving process steps between other work
(tokenizing and answering requests, admissions, the server's own threads on the same cores), and
its batches have free slots among running ones (the generator then gathers the running rows' cache),
which the grid never measured; in the serving loop on the built-in pair steps ran over the grid,
drafting steps more than plain ones, so the policy drafted where drafting lost. The grid keeps the
shape (how cost grows with batch, draft length and context); this keeps its level honest: one factor
for plain steps (k = 0) and one for drafting steps (k > 0), each the decayed mean of log(measured /
predicted) over the steps of its kind, shrunk toward 1 while evidence is thin and bounded so a
stray step (a page fault, a preempted thread) cannot make a kind look free or prohibitive. A padded shape's
first steps since the allocation (CUDA graphs' warm-up and recording, 16-26 ms against 2-3 ms steady on an
H100) are not fed at all (`Generator.settled`).
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


class StepCostCorrection:
    def __init__(self, settings: CorrectionSettings = CorrectionSettings()):
        self.settings = settings
        self.log_sum = [0.0, 0.0]  # [plain, drafting]: decayed sums of log(measured / predicted)
        self.weight = [0.0, 0.0]  # decayed step counts

    def observe(self, draft_len: int, measured_s: float, predicted_s: float) -> None:
        if not (measured_s > 0 and predicted_s > 0):
            return
        low, high = self.settings.bounds
        kind, d = int(draft_len > 0), self.settings.decay
        self.log_sum[kind] = d * self.log_sum[kind] + math.log(min(high, max(low, measured_s / predicted_s)))
        self.weight[kind] = d * self.weight[kind] + 1.0

    def factors(self) -> tuple[float, float]:
        """-> (plain, drafting) multipliers of the calibrated seconds."""
        w = self.settings.prior_weight
        return tuple(math.exp(s / (n + w)) for s, n in zip(self.log_sum, self.weight))

    def apply(self, seconds: np.ndarray) -> np.ndarray:
        """seconds [K + 1] at draft length 0..K -> corrected (a new array)."""
        plain, drafting = self.factors()
        out = np.asarray(seconds, dtype=float) * drafting
        out[0] = seconds[0] * plain
        return out
