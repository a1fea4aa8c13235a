"""Each running request's acceptance per draft position, with a pooled prior for the pair.

alpha_j = P(draft j accepted | drafts 1..j-1 accepted). A verified step of k drafts with a accepted is evidence
for positions 1..min(a + 1, k): accepted at 1..a, rejected at a + 1 when a < k, so every step that drafted at
least j counts for position j. A request's counts are discounted at every step it runs, plain ones included
(discounted UCB, Garivier & Moulines, ALT 2011: evidence fades whether or not its arm is played): a hard
opening's rejections fade, and its bound returns toward the pooled rates, so it is drafted again. The pooled
counts (every request's drafting steps, discounted at every step, over a base prior) are each request's
prior, PRIOR_WEIGHT pseudo-trials at every position. Host arrays only ([2 (trials, accepted), slots, K]).
"""

from __future__ import annotations

import numpy as np

OWN_DECAY = 0.95  # per step of the request: its own evidence remembers about 20 steps
POOLED_DECAY = 0.99  # per step: the pair's pooled evidence remembers about 100 (a pool of hard requests fades)
PRIOR_WEIGHT = 2.0  # pseudo-trials of the pooled rate behind each request's rate
BASE_RATE, BASE_WEIGHT = 0.6, 2.0  # the pooled rates before any evidence, and the pseudo-trials behind them
OPTIMISM = 1.0  # standard errors the policy adds to each rate it plans with (an upper confidence bound)


def slot_rows(slots: list[int]) -> slice | list[int]:
    """-> an index of per-slot arrays: a slice where slots are 0..n-1 in order (the generator keeps its running
    requests there, `CacheManager.compact`), whose reads are views updated in place; else the list itself."""
    n = len(slots)
    return slice(0, n) if n and slots[-1] == n - 1 and slots == list(range(n)) else slots


class AcceptanceModel:
    def __init__(self, num_slots: int, max_draft_len: int):
        self.max_draft_len = max_draft_len
        self.counts = np.zeros((2, num_slots, max_draft_len))  # [2, S, K] decayed trials, acceptances
        self.pooled = np.zeros((2, max_draft_len))  # [2, K]
        position, a = np.arange(max_draft_len)[None, :], np.arange(max_draft_len + 1)[:, None]
        self.evidence = np.stack([position <= a, position < a]).astype(float)  # [2, K + 1, K] by accepted count

    def reset(self, slots: list[int]) -> None:
        """New requests in these slots start from the pooled rates."""
        self.counts[:, slots] = 0.0

    def move(self, src: int, dst: int) -> None:
        self.counts[:, dst] = self.counts[:, src]

    def observe(self, slots: list[int], draft_len: int, accepted: list[int], drafting: list[bool] | None) -> None:
        """A step: every row's evidence fades; rows that drafted `draft_len` add theirs (see the module)."""
        rows = slot_rows(slots)
        self.counts[:, rows] *= OWN_DECAY
        self.pooled *= POOLED_DECAY
        k = min(draft_len, self.max_draft_len)
        if k == 0:
            return
        if drafting is not None and not all(drafting):
            rows = [s for s, d in zip(slots, drafting) if d]
            accepted = [a for a, d in zip(accepted, drafting) if d]
        evidence = self.evidence[:, np.minimum(accepted, k), :k]  # [2, B, k]
        self.counts[:, rows, :k] += evidence
        self.pooled[:, :k] += evidence.sum(1)

    def pooled_rates(self) -> np.ndarray:
        """[K] the pooled rate at each position, shrunk toward the one before it (position 1's toward BASE_RATE):
        a deep position is reached only after the drafts before it are accepted, so where those are rejected it
        stays thin, and it should read as its predecessor's rate, not as the base rate."""
        rates, before = np.empty(self.max_draft_len), BASE_RATE
        for j, (trials, hits) in enumerate(self.pooled.T):
            rates[j] = before = (hits + BASE_WEIGHT * before) / (trials + BASE_WEIGHT)
        return rates

    def rates(self, slots: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """-> ([B, K] posterior mean rates, [B, K] their upper confidence bounds). A deep position's bound is no
        wider than position 1's: thin deep evidence must not compound into a long draft where position 1 is well
        measured and poor."""
        trials, hits = self.counts[:, slot_rows(slots)]
        seen = trials + PRIOR_WEIGHT
        mean = (hits + PRIOR_WEIGHT * self.pooled_rates()) / seen
        width = OPTIMISM * np.sqrt(mean * (1.0 - mean) / seen)
        return mean, np.minimum(1.0, mean + np.minimum(width, width[:, :1]))

    def tokens(self, slots: list[int], remaining: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """-> ([B, K + 1] expected tokens each request emits at draft length 0..K, the same at the upper bounds),
        none past its remaining budget."""
        mean, upper = self.rates(slots)
        useful = np.arange(1, self.max_draft_len + 1)[None, :] < np.asarray(remaining)[:, None]  # [B, K]
        out = []
        for rates in (mean, upper):
            tokens = np.ones((len(slots), self.max_draft_len + 1))
            tokens[:, 1:] += np.cumsum(np.cumprod(rates, axis=1) * useful, axis=1)
            out.append(tokens)
        return out[0], out[1]
