"""Live acceptance statistics: how many drafts each running request can expect the target to accept.

Draft position j (1-based) has a conditional acceptance rate alpha_j = P(draft j accepted | drafts
1..j-1 accepted). A verified step with draft length k and a accepted drafts is evidence for
positions 1..min(a + 1, k): accepted at 1..a, rejected at a + 1 when a < k. Positions past k say
nothing. Counts are kept per cache slot (the request in it) and pooled over all requests; old
evidence decays (exponential forgetting), so the estimates follow drift such as the lower
acceptance of long contexts. Estimates are shrunk where evidence is thin: a slot's toward the
pooled rate, the pooled rate at position j toward the pooled rate at j - 1, position 1 toward
`prior`. The rates the policy plans with are optimistic: `optimism` standard errors above the
estimate (an upper confidence bound, as in bandit exploration). Without it one early rejection, or
positions never reached because the drafts were short, would look like poor acceptance and keep
the policy from ever drafting deep enough to learn otherwise; with it thin evidence explores and
ample evidence (at batch 1 about 1 / (1 - pooled_decay) steps) leaves a small bias. Host arrays
only (numpy, [slots, positions]): the generator already has the accepted counts on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AcceptanceSettings:
    prior: float = 0.5  # alpha_1 before any evidence
    prior_weight: float = 2.0  # pseudo-observations behind each pooled rate's prior
    slot_weight: float = 4.0  # pseudo-observations of the pooled rate behind each slot's rate
    pooled_decay: float = 0.95  # per step: the pooled counts' memory is about 1 / (1 - decay) steps
    slot_decay: float = 0.9  # per observation of that slot
    optimism: float = 1.0  # standard errors added to each pooled rate (0: the plain posterior mean)


class AcceptanceModel:
    def __init__(self, num_slots: int, max_draft_len: int, settings: AcceptanceSettings = AcceptanceSettings()):
        self.settings, self.max_draft_len = settings, max_draft_len
        self.tried = np.zeros((num_slots, max_draft_len))  # [S, K] decayed trials of position j + 1
        self.accepted = np.zeros((num_slots, max_draft_len))  # [S, K] decayed acceptances
        self.pooled_tried = np.zeros(max_draft_len)  # [K]
        self.pooled_accepted = np.zeros(max_draft_len)

    def reset(self, slots: list[int]) -> None:
        """New requests in these slots start from the pooled rates."""
        self.tried[slots] = 0
        self.accepted[slots] = 0

    def observe(self, slots: list[int], draft_len: int, accepted: list[int]) -> None:
        """One verified step: `draft_len` drafts per row, accepted[i] of them accepted by row slots[i]."""
        k = min(draft_len, self.max_draft_len)
        if k == 0 or not slots:
            return
        s = self.settings
        a = np.minimum(np.asarray(accepted), k)[:, None]  # [B, 1]
        position = np.arange(k)[None, :]  # [1, k]: 0-based, position j + 1
        tried = (position <= a).astype(float)  # reached: every earlier draft was accepted
        hit = (position < a).astype(float)
        self.pooled_tried[:k] = s.pooled_decay * self.pooled_tried[:k] + tried.sum(0)
        self.pooled_accepted[:k] = s.pooled_decay * self.pooled_accepted[:k] + hit.sum(0)
        rows = np.asarray(slots)
        keep = np.where(tried > 0, s.slot_decay, 1.0)  # only positions this step reached forget
        self.tried[rows, :k] = keep * self.tried[rows, :k] + tried
        self.accepted[rows, :k] = keep * self.accepted[rows, :k] + hit

    def pooled_rates(self, bound: bool = False) -> np.ndarray:
        """[K] conditional acceptance rates over all requests; bound: each an upper confidence bound, the
        shrunk mean plus `optimism` standard errors of a rate seen on (decayed trials + prior weight)."""
        s, rates, previous = self.settings, np.empty(self.max_draft_len), self.settings.prior
        for j in range(self.max_draft_len):
            seen = self.pooled_tried[j] + s.prior_weight
            previous = (self.pooled_accepted[j] + s.prior_weight * previous) / seen  # the chain shrinks means
            spread = s.optimism * np.sqrt(previous * (1.0 - previous) / seen) if bound else 0.0
            rates[j] = min(1.0, previous + spread)
        return rates

    def rates(self, slots: list[int], bound: bool = False) -> np.ndarray:
        """[B, K] each slot's conditional acceptance rates (shrunk toward the pooled ones, or their bound)."""
        w = self.settings.slot_weight
        return (self.accepted[slots] + w * self.pooled_rates(bound)) / (self.tried[slots] + w)

    def expected_tokens(self, slots: list[int], remaining: list[int]) -> np.ndarray:
        """[B, K + 1]: expected tokens each request emits at draft length 0..K (the target's own token
        included), counting none past its remaining budget (tokens beyond max_new_tokens are wasted)."""
        # [B, K]: P(at least j + 1 drafts accepted), planned with the optimistic rates (they explore)
        survive = np.cumprod(self.rates(slots, bound=True), axis=1)
        useful = np.arange(self.max_draft_len)[None, :] < (np.asarray(remaining)[:, None] - 1)
        gained = np.cumsum(survive * useful, axis=1)
        return 1.0 + np.concatenate([np.zeros((len(slots), 1)), gained], axis=1)
