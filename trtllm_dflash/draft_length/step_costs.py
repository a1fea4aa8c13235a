"""The seconds of one step at each draft length, as the cost-based policy reads them."""

from __future__ import annotations

import numpy as np

from .cost import CostModel
from .live_cost import StepCostCorrection

CONTEXT_STEP = 16  # tokens: the context granularity of the step-cost table the policy reads


class StepCosts:
    """The calibrated step-cost table (cost.py) at a batch size and a context rounded down to CONTEXT_STEP tokens,
    corrected by what the steps this process ran measured (live_cost.py). The last table read is kept, so a run of
    plain steps and the timing of the step just chosen read it without interpolating the grid again."""

    def __init__(self, model: CostModel | None):
        self.model = model
        self.correction = StepCostCorrection()
        self.last: tuple = ((), None)  # (key, [K + 1] seconds) of the last table read

    def calibrated(self, rows: int, context: int, max_draft_len: int) -> np.ndarray:
        """[K + 1] calibrated seconds at draft length 0..K."""
        key = (rows, context - context % CONTEXT_STEP, max_draft_len)
        if self.last[0] != key:
            self.last = (key, self.model.step_seconds(*key))
        return self.last[1]

    def seconds(self, rows: int, context: int, max_draft_len: int) -> np.ndarray:
        """[K + 1] calibrated seconds corrected by the live factors."""
        return self.correction.apply(self.calibrated(rows, context, max_draft_len))

    def observe(self, rows: int, context: int, max_draft_len: int, draft_len: int, seconds: float) -> None:
        """A step of `rows` rows at draft length `draft_len` took `seconds`: against the table it was chosen from."""
        predicted = self.calibrated(rows, context, max_draft_len)
        self.correction.observe(draft_len, seconds, float(predicted[min(draft_len, len(predicted) - 1)]))
