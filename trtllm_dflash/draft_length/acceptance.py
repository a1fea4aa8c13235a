"""Live acceptance statistics: how many drafts each running request can expect the target to accept.

Draft position j (1-based) has a conditional acceptance rate alpha_j = P(draft j accepted | drafts
1..j-1 accepted). A verified step with draft length k and a accepted drafts is evidence for
positions 1..min(a + 1, k): accepted at 1..a, rejected at a + 1 when a < k. Positions past k say
nothing. Counts are kept per cache slot (the request in it) and pooled over all requests; old
evidence decays (exponential forgetting), so the estimates follow drift. Acceptance also depends
on the context length (the built-in pair accepts far less at 1024 tokens than at 100), so pooled
counts are kept per context bucket as well (below 256 tokens, then one per doubling), and a new
request starts from the rates of its prompt's bucket: without that, every long request after a run
of short ones drafted on the short ones' rates until its own rejections taught it otherwise.
Estimates are shrunk where evidence is thin: a slot's toward its bucket's rate; a bucket's counts get
the other contexts' evidence scaled down to a few trials (deep positions' acceptances scaled by the
bucket's alpha_1 relative to theirs); a rate at position j is shrunk toward the rate at j - 1,
position 1 toward `prior`. The rates the policy plans with are optimistic:
`optimism` standard errors above the estimate (an upper confidence bound, as in bandit exploration;
at a deep position no more than at position 1).
Without it one early rejection, or positions never reached because the drafts were short, would
look like poor acceptance and keep
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
    slot_weight: float = 4.0  # pseudo-observations of the slot's context bucket's rate behind each slot's rate
    context_weight: float = 4.0  # at most this many trials of other contexts' evidence behind each bucket's rate
    pooled_decay: float = 0.95  # per step: the pooled counts' memory is about 1 / (1 - decay) steps
    slot_decay: float = 0.9  # per observation of that slot
    optimism: float = 1.0  # standard errors added to each rate the policy plans with (0: the plain posterior mean)


CONTEXT_BASE = 256  # contexts below it share bucket 0; bucket i >= 1 holds [BASE * 2^(i-1), BASE * 2^i)
CONTEXT_BUCKETS = 8  # the last one holds everything from 256 * 2^6 = 16384 tokens on


def context_buckets(contexts) -> np.ndarray:
    """[B] context lengths (tokens) -> [B] bucket indices."""
    c = np.maximum(np.asarray(contexts, dtype=float), 1.0)
    return np.clip(np.floor(np.log2(c / CONTEXT_BASE)) + 1, 0, CONTEXT_BUCKETS - 1).astype(int)


class AcceptanceModel:
    def __init__(self, num_slots: int, max_draft_len: int, settings: AcceptanceSettings = AcceptanceSettings()):
        self.settings, self.max_draft_len = settings, max_draft_len
        self.tried = np.zeros((num_slots, max_draft_len))  # [S, K] decayed trials of position j + 1
        self.accepted = np.zeros((num_slots, max_draft_len))  # [S, K] decayed acceptances
        self.pooled_tried = np.zeros(max_draft_len)  # [K] over all contexts
        self.pooled_accepted = np.zeros(max_draft_len)
        self.bucket_tried = np.zeros((CONTEXT_BUCKETS, max_draft_len))  # [C, K] per context bucket
        self.bucket_accepted = np.zeros((CONTEXT_BUCKETS, max_draft_len))
        self.context = np.zeros(num_slots)  # [S] each slot's committed length (tokens), kept by `observe`
        # bucket_rates(bound) -> [C, K], until the pooled counts change: they change only on drafting steps, so
        # a run of plain steps (where choosing is most of the host work per step) plans without the chain
        self.bucket_cache: dict[bool, np.ndarray] = {}
        self.version = 0  # bumped whenever any count changes (a drafting step, an admission)
        self.tokens_cache: tuple = ((), None)  # (key, expected_tokens) of the last call

    def reset(self, slots: list[int], contexts: list[int] | None = None) -> None:
        """New requests in these slots (prompts of `contexts` tokens) start from their context bucket's rates."""
        self.tried[slots] = 0
        self.accepted[slots] = 0
        self.context[slots] = 0 if contexts is None else contexts
        self.version += 1

    def move(self, src: int, dst: int) -> None:
        """The request in slot src now occupies slot dst: its evidence and context go along."""
        for counts in (self.tried, self.accepted, self.context):
            counts[dst] = counts[src]
        self.version += 1

    def observe(self, slots: list[int], draft_len: int, accepted: list[int], drafting: list[bool] | None = None) -> None:
        """One verified step: `draft_len` drafts per row, accepted[i] of them accepted by row slots[i]; drafting:
        which rows drafted (None: all), the others ran a plain step's token beside them (no evidence)."""
        if drafting is not None and not all(drafting):
            self.context[[s for s, d in zip(slots, drafting) if not d]] += 1
            slots, accepted = [s for s, d in zip(slots, drafting) if d], [a for a, d in zip(accepted, drafting) if d]
        k = min(draft_len, self.max_draft_len)
        if k == 0 or not slots:  # a plain step: one token each, no evidence (the common case: kept cheap)
            self.context[slots] += 1
            return
        rows = np.asarray(slots, dtype=int)
        buckets = context_buckets(self.context[rows])  # where each row stood when it drafted
        self.context[rows] += np.minimum(np.asarray(accepted), k) + 1  # the tokens the step emitted
        self.bucket_cache.clear()
        self.version += 1
        s = self.settings
        a = np.minimum(np.asarray(accepted), k)[:, None]  # [B, 1]
        position = np.arange(k)[None, :]  # [1, k]: 0-based, position j + 1
        tried = (position <= a).astype(float)  # reached: every earlier draft was accepted
        hit = (position < a).astype(float)
        self.pooled_tried[:k] = s.pooled_decay * self.pooled_tried[:k] + tried.sum(0)
        self.pooled_accepted[:k] = s.pooled_decay * self.pooled_accepted[:k] + hit.sum(0)
        seen = np.unique(buckets)  # only the buckets this step saw forget
        self.bucket_tried[seen, :k] *= s.pooled_decay
        self.bucket_accepted[seen, :k] *= s.pooled_decay
        np.add.at(self.bucket_tried[:, :k], buckets, tried)
        np.add.at(self.bucket_accepted[:, :k], buckets, hit)
        keep = np.where(tried > 0, s.slot_decay, 1.0)  # only positions this step reached forget
        self.tried[rows, :k] = keep * self.tried[rows, :k] + tried
        self.accepted[rows, :k] = keep * self.accepted[rows, :k] + hit

    def chain(self, tried: np.ndarray, accepted: np.ndarray, bound: bool) -> np.ndarray:
        """[..., K] decayed counts -> rates: position j's mean shrunk toward position j - 1's (position 1's
        toward `prior`) by `prior_weight` pseudo-trials; bound: each an upper confidence bound, the shrunk
        mean plus `optimism` standard errors of a rate seen on (trials + prior weight), at a deep position no
        more than position 1's: a position reached rarely (a few trials) would otherwise get a bonus of up to
        0.35 and look nearly certain, and a chain of such bonuses made drafting deep look worth it where
        position 1 is well measured and poor (the built-in pair at 1024 tokens: alpha_1 about 0.45, yet
        positions 4-6 planned at 0.85-1.0). A deep position matters only through position 1 (it is reached
        only after position 1 is accepted), so its uncertainty should not drive exploration more."""
        s = self.settings
        seen = tried + s.prior_weight  # [..., K]
        # the shrinkage is the recurrence mean_j = c_j + d_j * mean_(j-1), mean_0 = prior; in closed form
        # mean_j = D_j * (prior + sum_(i <= j) c_i / D_i) with D_j = d_1 * ... * d_j (float64: no underflow
        # for K <= 15 even at thousands of trials per position)
        c, d = accepted / seen, s.prior_weight / seen
        shrink = np.cumprod(d, axis=-1)
        mean = np.minimum(1.0, shrink * (s.prior + np.cumsum(c / shrink, axis=-1)))
        if not bound:
            return mean
        spread = s.optimism * np.sqrt(np.maximum(mean * (1.0 - mean), 0.0) / seen)
        return np.minimum(1.0, mean + np.minimum(spread, spread[..., :1]))

    def pooled_rates(self, bound: bool = False) -> np.ndarray:
        """[K] rates over all requests and contexts."""
        return self.chain(self.pooled_tried, self.pooled_accepted, bound)

    def bucket_rates(self, bound: bool = False) -> np.ndarray:
        """[C, K] each context bucket's rates (see `estimate_bucket_rates`), kept until a drafting step."""
        if bound not in self.bucket_cache:
            self.bucket_cache[bound] = self.estimate_bucket_rates(bound)
        return self.bucket_cache[bound]

    def estimate_bucket_rates(self, bound: bool) -> np.ndarray:
        """[C, K] each context bucket's rates: its own counts, plus the other contexts' evidence scaled down
        to at most `context_weight` trials per position (a bucket with no evidence of its own starts near
        the other contexts' rates and leaves them after a few trials; with one bucket in use this is the
        pooled estimate exactly). At deeper positions the borrowed acceptances are scaled by how the bucket's
        alpha_1 compares with the other contexts' (at most 1): a deep position is reached only after the
        drafts before it were accepted, so where position 1 is poor it stays thin for long, and borrowed at
        face value it kept the other contexts' rate. On the built-in pair, after short prompts (deep rates
        about 0.9) the first 1024-token requests (alpha_1 about 0.3, alpha_2 about 0.4) planned deep positions
        near 0.9 and drafted the whole block for tens of steps (about 1.8 tokens for 2.6 plain steps' time
        each), about 7 % of that point's time in a scratch trace of the served loop. Dropping the borrowed
        deep evidence instead fixed that but cost requests that cross into a new bucket at an unchanged
        acceptance (their deep positions then chained from alpha_1 alone)."""
        others_tried = np.maximum(self.pooled_tried[None] - self.bucket_tried, 0.0)  # [C, K]
        others_accepted = np.clip(self.pooled_accepted[None] - self.bucket_accepted, 0.0, others_tried)
        scale = np.minimum(1.0, self.settings.context_weight / np.maximum(others_tried, 1e-9))
        tried, accepted = self.bucket_tried + scale * others_tried, self.bucket_accepted + scale * others_accepted
        # alpha_1 means [C, 1] as `chain` shrinks position 1: (accepted + w * prior) / (tried + w)
        w, prior = self.settings.prior_weight, self.settings.prior
        own_first = (accepted[:, :1] + w * prior) / (tried[:, :1] + w)  # with the borrowed trials
        their_first = (others_accepted[:, :1] + w * prior) / (others_tried[:, :1] + w)
        relative = np.minimum(own_first / their_first, 1.0)  # [C, 1]
        accepted[:, 1:] = self.bucket_accepted[:, 1:] + relative * scale[:, 1:] * others_accepted[:, 1:]
        return self.chain(tried, accepted, bound)

    def rates(self, slots: list[int], bound: bool = False) -> np.ndarray:
        """[B, K] each slot's conditional acceptance rates (shrunk toward its context bucket's, or their bound)."""
        w = self.settings.slot_weight
        prior = self.bucket_rates(bound)[context_buckets(self.context[slots])]
        return (self.accepted[slots] + w * prior) / (self.tried[slots] + w)

    def expected_tokens(self, slots: list[int], remaining: list[int]) -> np.ndarray:
        """[B, K + 1]: expected tokens each request emits at draft length 0..K (the target's own token
        included), counting none past its remaining budget (tokens beyond max_new_tokens are wasted).
        Kept while nothing it depends on changes (in a run of plain steps: the same requests, no new
        evidence, the same context buckets), so a plain run does not recompute it every step."""
        buckets = context_buckets(self.context[slots])
        key = (tuple(slots), tuple(min(r, self.max_draft_len + 1) for r in remaining), tuple(buckets.tolist()),
               self.version)
        if self.tokens_cache[0] != key:
            self.tokens_cache = (key, self.estimate_tokens(slots, remaining))
        return self.tokens_cache[1]

    def estimate_tokens(self, slots: list[int], remaining: list[int]) -> np.ndarray:
        # [B, K]: P(at least j + 1 drafts accepted), planned with the optimistic rates (they explore)
        survive = np.cumprod(self.rates(slots, bound=True), axis=1)
        useful = np.arange(self.max_draft_len)[None, :] < (np.asarray(remaining)[:, None] - 1)
        gained = np.cumsum(survive * useful, axis=1)
        return 1.0 + np.concatenate([np.zeros((len(slots), 1)), gained], axis=1)
