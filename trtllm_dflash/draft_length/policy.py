"""Draft-length policies: how many tokens to draft in the next step for the running batch.

The interface and the fixed policies (`FixedDraftLen`, `ScheduledDraftLen`) are in interface.py, re-exported
here. `AutoDraftLen` (`--draft-len auto`) decides from what this process measures: the step times of the steps it
ran (step_times.py) and each request's acceptance per draft position (acceptance.py). Each step it takes

    k = argmax over k of  upper bound of the batch's expected tokens at k / lower bound of the step's seconds at k

an upper-confidence-bound choice (UCB1, Auer, Cesa-Bianchi & Fischer, Machine Learning 2002; discounted, so
evidence fades: Garivier & Moulines, ALT 2011). Its index is in tokens per second, so a choice that explores pays
its own step time in the index: a hard opening is drafted again once its rejections have faded enough to make
drafting plausible, and an arm that cannot win even at full acceptance is never tried. The batch's bound is the
sum of its rows' means plus the root of the sum of their squared widths (independent requests), so one rule
serves batch 1 and a served batch of many. Design: docs/draft-length-policy.md.
"""

from __future__ import annotations

import numpy as np

from .acceptance import AcceptanceModel
from .interface import BatchView, DraftLenPolicy, FixedDraftLen, ScheduledDraftLen
from .step_times import StepTimes, analytic_shape, stored_shape

__all__ = ["AutoDraftLen", "BatchView", "DraftLenPolicy", "FixedDraftLen", "ScheduledDraftLen", "best_length",
           "pick"]


def best_length(lengths: list[int], rates: list[float]) -> int:
    """The draft length of the highest rate (tokens/s); ties go to the shorter, and to plain (0)."""
    return -max(zip(rates, [-k for k in lengths]))[1]


def pick(rates: np.ndarray) -> int:
    """[K + 1] tokens/s at draft length 0..K -> the best length (`best_length`)."""
    return int(np.argmax(rates)) if len(rates) else 0  # argmax keeps the first maximum


class AutoDraftLen(DraftLenPolicy):
    name = "auto"

    def __init__(self, prior=None):
        self.prior = prior  # generator -> a stored step-cost model (draft_length/cost.py) or None
        self.acceptance: AcceptanceModel | None = None
        self.times: StepTimes | None = None

    def prepare(self, generator) -> None:
        """Per-slot state for the allocation; reads, never measures, a stored step-cost model as the prior."""
        k = generator.block - 1
        model = self.prior(generator) if self.prior else None
        self.acceptance = AcceptanceModel(generator.slots.usable, k)
        self.times = StepTimes(analytic_shape(k) if model is None else stored_shape(model, k))

    def admit(self, slots: list[int], contexts: list[int]) -> None:
        self.acceptance.reset(slots)

    def move(self, src: int, dst: int) -> None:
        self.acceptance.move(src, dst)

    def observe(self, slots: list[int], draft_len: int, accepted: list[int], drafting: list[bool] | None = None) -> None:
        self.acceptance.observe(slots, draft_len, accepted, drafting)

    def timed(self, rows: int, context: int, draft_len: int, seconds: float) -> None:
        self.times.observe(rows, draft_len, seconds)

    def choose(self, batch: BatchView) -> int:
        """A batch bucket's first timed step is plain: the level every other step of the bucket is priced against
        (timed first, a drafting step would pin the prior's error for its ratio onto plain steps)."""
        if not self.times.plain_timed(len(batch.slots)):
            return 0
        return min(pick(self.index(batch)), batch.max_draft_len)

    def index(self, batch: BatchView) -> np.ndarray:
        """[K + 1] the batch's upper-bound tokens per second at draft length 0..K."""
        mean, upper = self.acceptance.tokens(batch.slots, batch.remaining)  # [B, K + 1] each
        if batch.drafting is not None and not all(batch.drafting):
            plain_only = ~np.asarray(batch.drafting)
            mean[plain_only], upper[plain_only] = 1.0, 1.0
        width = np.sqrt(((upper - mean) ** 2).sum(0))
        return (mean.sum(0) + width) / self.times.lower_seconds(len(batch.slots))

    def reachable(self, batch: BatchView) -> bool:
        """Whether some draft length beats a plain step at full acceptance and the optimistic step times; where
        none does, keeping the drafter's context is pure cost."""
        width = np.arange(1, self.acceptance.max_draft_len + 2)[None, :]  # [1, K + 1]
        tokens = np.minimum(width, np.maximum(np.asarray(batch.remaining)[:, None], 1))  # [B, K + 1]
        if batch.drafting is not None and not all(batch.drafting):
            tokens[~np.asarray(batch.drafting)] = 1
        return pick(tokens.sum(0) / self.times.lower_seconds(len(batch.slots))) > 0

    def drafts_for(self, batch: BatchView) -> bool:
        return self.reachable(batch)

    def keeps_context(self, batch: BatchView) -> list[bool]:
        return [self.reachable(batch)] * len(batch.slots)
