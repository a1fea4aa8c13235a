"""Live acceptance statistics: how many drafts each running request can expect the target to accept.

Draft position j (1-based) has a conditional acceptance rate alpha_j = P(draft j accepted | drafts 1..j-1
accepted). A verified step of k drafts with a accepted is evidence for positions 1..min(a + 1, k): accepted at
1..a, rejected at a + 1 when a < k. Counts are kept per cache slot (the request in it), pooled, and per context
bucket (below 256 tokens, then one per doubling: acceptance falls with context), and decay at every drafting step,
at positions past k as well, so estimates follow drift. A new request starts from its prompt's bucket.
Thin evidence is shrunk: a slot's rate toward its bucket's, a bucket's toward the other contexts' evidence, a rate
at position j toward j - 1's and position 1's toward `prior`. The policy plans with optimistic rates (an upper
confidence bound, `optimism` standard errors above the estimate): else one early rejection, or positions never
drafted, would read as poor acceptance and stop the policy from learning otherwise. Design:
docs/draft-length-policy.md. Host arrays only (numpy, [slots, positions]).
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
BASE_BITS = CONTEXT_BASE.bit_length()  # 9: a context c >= 1 is in bucket floor(log2(c / 256)) + 1 = bit_length(c) - 8


def context_buckets(contexts) -> list[int]:
    """[B] context lengths (tokens; numbers or an array) -> [B] bucket indices. Python ints, not numpy: it runs at
    every step on at most a batch of values, where each numpy call's fixed cost (and its code's, cold after the
    step) is most of the work."""
    values = contexts.tolist() if isinstance(contexts, np.ndarray) else contexts
    top = CONTEXT_BUCKETS - 1
    return [min(max(int(c).bit_length() - BASE_BITS + 1, 0), top) if c >= 1 else 0 for c in values]


def slot_rows(slots: list[int]) -> slice | list[int]:
    """-> an index of per-slot arrays: a slice where slots are 0..n-1 in order (the generator keeps its running
    requests there, `CacheManager.compact`), whose reads are views updated in place; else the list itself."""
    n = len(slots)
    return slice(0, n) if n and slots[-1] == n - 1 and slots == list(range(n)) else slots


class AcceptanceModel:
    """Counts are stacked [2, ...] (trials, acceptances) so one numpy call updates or reads both: the model runs
    between steps, where each call's fixed cost dominates arrays this small."""

    def __init__(self, num_slots: int, max_draft_len: int, settings: AcceptanceSettings = AcceptanceSettings()):
        self.settings, self.max_draft_len = settings, max_draft_len
        k = max_draft_len
        self.slot_counts = np.zeros((2, num_slots, k))  # [2, S, K] decayed trials, acceptances of position j + 1
        self.pooled_counts = np.zeros((2, k))  # [2, K] over all contexts
        self.bucket_counts = np.zeros((2, CONTEXT_BUCKETS, k))  # [2, C, K] per context bucket
        self.lengths = np.zeros(num_slots)  # [S] each slot's committed length (tokens), kept by `observe`
        # observed steps not yet applied, in order: (slots, draft length, accepted, drafting); `folded` applies them
        # before anything reads or changes the counts, so a policy reading every few steps pays once for several
        self.pending: list[tuple] = []
        # per row that accepted a = 0..K drafts, [3, K + 1, K]: the factor its own counts decay by (positions it
        # reached forget; so do those past the step's k, in `apply`), and its evidence: position j + 1 reached
        # (every earlier draft accepted), accepted. A step of k drafts reads the first k positions.
        position, a = np.arange(k)[None, :], np.arange(k + 1)[:, None]
        self.by_accepted = np.stack([np.where(position <= a, settings.slot_decay, 1.0), position <= a, position < a])
        # [K + 2, K]: whether draft position j + 1 can still emit a token for a request with r = 0..K + 1 remaining
        self.useful = (position < np.arange(k + 2)[:, None] - 1).astype(float)
        # bucket_rates(bound) -> [C, K], until the pooled counts change: they change only on drafting steps, so
        # a run of plain steps (where choosing is most of the host work per step) plans without the chain
        self.bucket_cache: dict[bool, np.ndarray] = {}
        self.version = 0  # bumped whenever the evidence changes (a drafting step observed, an admission, a move)
        self.tokens_cache: tuple = ((), None)  # (key, expected_tokens) of the last call

    # the counts as [S, K], [K] and [C, K] arrays, and each slot's context [S], every observed step applied
    tried = property(lambda self: self.folded().slot_counts[0])
    accepted = property(lambda self: self.folded().slot_counts[1])
    pooled_tried = property(lambda self: self.folded().pooled_counts[0])
    pooled_accepted = property(lambda self: self.folded().pooled_counts[1])
    bucket_tried = property(lambda self: self.folded().bucket_counts[0])
    bucket_accepted = property(lambda self: self.folded().bucket_counts[1])
    context = property(lambda self: self.folded().lengths)

    def folded(self) -> AcceptanceModel:
        """Apply the observed steps not applied yet, in order; -> self."""
        if self.pending:
            pending, self.pending = self.pending, []
            for step in pending:
                self.apply(*step)
        return self

    def reset(self, slots: list[int], contexts: list[int] | None = None) -> None:
        """New requests in these slots (prompts of `contexts` tokens) start from their context bucket's rates."""
        self.folded()
        self.slot_counts[:, slots] = 0
        self.lengths[slots] = 0 if contexts is None else contexts
        self.version += 1

    def move(self, src: int, dst: int) -> None:
        """The request in slot src now occupies slot dst: its evidence and context go along."""
        self.folded()
        self.slot_counts[:, dst] = self.slot_counts[:, src]
        self.lengths[dst] = self.lengths[src]
        self.version += 1

    def age(self, slots: list[int], steps: int) -> None:
        """`steps` plain steps passed since these slots' requests last drafted: their own evidence forgets as `steps`
        drafting steps of theirs would (slot_decay each), the pooled and the context buckets' as `steps` drafting
        steps would (pooled_decay each), every position alike. Discounted UCB discounts every arm at every round,
        the arms not played included (Garivier & Moulines, ALT 2011); a plain step is a round where no drafting
        arm was played. The policy calls it only where a lone request's probe contradicts that evidence
        (`CostBasedDraftLen.probed`)."""
        self.folded()
        self.slot_counts[:, slots] *= self.settings.slot_decay ** steps
        factor = self.settings.pooled_decay ** steps
        self.pooled_counts *= factor
        self.bucket_counts *= factor
        self.bucket_cache.clear()
        self.version += 1

    def observe(self, slots: list[int], draft_len: int, accepted: list[int], drafting: list[bool] | None = None) -> None:
        """One verified step: `draft_len` drafts per row, accepted[i] of them accepted by row slots[i]; drafting:
        which rows drafted (None: all), the others ran a plain step's token beside them (no evidence). A plain
        step with nothing pending is applied at once (one array update); anything else waits for `folded`."""
        if self.pending or draft_len > 0:
            self.pending.append((list(slots), draft_len, list(accepted), None if drafting is None else list(drafting)))
            if draft_len > 0:  # evidence, applied at the next read: estimates and kept plain choices are stale
                self.version += 1
        else:
            self.apply(slots, draft_len, accepted, drafting)

    def apply(self, slots: list[int], draft_len: int, accepted: list[int], drafting: list[bool] | None) -> None:
        """One observed step (see `observe`) applied to the counts."""
        if drafting is not None and not all(drafting):
            self.lengths[[s for s, d in zip(slots, drafting) if not d]] += 1
            slots, accepted = [s for s, d in zip(slots, drafting) if d], [a for a, d in zip(accepted, drafting) if d]
        k = min(draft_len, self.max_draft_len)
        if k == 0 or not slots:  # a plain step: one token each, no evidence (the common case: one array update)
            self.lengths[slots] += 1
            return
        a = [min(n, k) for n in accepted]
        rows = slot_rows(slots)
        buckets = context_buckets(self.lengths[rows])  # where each row stood when it drafted
        self.lengths[rows] += [n + 1 for n in a]  # the tokens the step emitted
        self.bucket_cache.clear()
        decay = self.settings.pooled_decay
        table = self.by_accepted[:, a, :k]  # [3, B, k]
        evidence = table[1:]  # [2, B, k]
        total = evidence.sum(1)  # [2, k]
        # Every position forgets at a drafting step, the ones past k too (censored by the choice): else a short
        # draft length locks itself in, its deep positions keeping an opening's rates. A position not drafted fades
        # toward the rate of the one before it, as discounted UCB returns to an arm not played for a while
        # (Garivier & Moulines, ALT 2011). benchmarks/results/draft_len_batch1_load.json
        self.pooled_counts *= decay
        self.pooled_counts[:, :k] += total
        for b in sorted(set(buckets)):  # only the buckets this step saw forget
            same = [i for i, x in enumerate(buckets) if x == b]
            self.bucket_counts[:, b] *= decay
            self.bucket_counts[:, b, :k] += total if len(same) == len(buckets) else evidence[:, same].sum(1)
        counts = self.slot_counts[:, rows, :k]  # [2, B, k]: a view when rows is a slice
        counts *= table[0]
        counts += evidence
        if not isinstance(rows, slice):
            self.slot_counts[:, rows, :k] = counts
        if k < self.max_draft_len:  # a drafting row's positions past k forget as its reached ones do
            self.slot_counts[:, rows, k:] *= self.settings.slot_decay

    def chain(self, tried: np.ndarray, accepted: np.ndarray, bound: bool) -> np.ndarray:
        """[..., K] decayed counts -> rates: position j's mean shrunk toward position j - 1's (position 1's
        toward `prior`) by `prior_weight` pseudo-trials; bound: each an upper confidence bound, the shrunk
        mean plus `optimism` standard errors of a rate seen on (trials + prior weight), at a deep position no
        more than position 1's: a deep position is reached only after position 1 is accepted, so its (thin)
        evidence's uncertainty should not drive exploration more than position 1's."""
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
        return self.chain(*self.folded().pooled_counts, bound)

    def bucket_rates(self, bound: bool = False) -> np.ndarray:
        """[C, K] each context bucket's rates (see `estimate_bucket_rates`), kept until a drafting step."""
        self.folded()
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
        face value it would keep the other contexts' rate (long prompts after short ones planned deep drafts that
        lost). Dropping the borrowed deep evidence instead would chain a request crossing into a new bucket from
        alpha_1 alone."""
        others = np.maximum(self.pooled_counts[:, None] - self.bucket_counts, 0.0)  # [2, C, K] the other contexts'
        np.minimum(others[1], others[0], out=others[1])  # their acceptances, at most their trials
        scale = np.minimum(1.0, self.settings.context_weight / np.maximum(others[0], 1e-9))  # [C, K]
        counts = self.bucket_counts + scale * others  # [2, C, K]
        # alpha_1 means as `chain` shrinks position 1, (accepted + w * prior) / (tried + w): [2, C] with the
        # borrowed trials, and of the other contexts alone
        w, prior = self.settings.prior_weight, self.settings.prior
        first = np.stack((counts[:, :, 0], others[:, :, 0]))  # [2 (own, theirs), 2 (tried, accepted), C]
        first = (first[:, 1] + w * prior) / (first[:, 0] + w)
        relative = np.minimum(first[0] / first[1], 1.0)[:, None]  # [C, 1]
        counts[1, :, 1:] = self.bucket_counts[1, :, 1:] + relative * scale[:, 1:] * others[1, :, 1:]
        return self.chain(counts[0], counts[1], bound)

    def rates(self, slots: list[int], bound: bool = False) -> np.ndarray:
        """[B, K] each slot's conditional acceptance rates (shrunk toward its context bucket's, or their bound)."""
        rows = slot_rows(slots)
        rates = self.bucket_rates(bound)  # folded
        buckets = context_buckets(self.lengths[rows])
        prior = rates[buckets[0]] if len(set(buckets)) == 1 else rates[buckets]  # [K] (all in one bucket) or [B, K]
        tried, accepted = self.slot_counts[:, rows]  # [B, K] each
        w = self.settings.slot_weight
        return (accepted + w * prior) / (tried + w)

    def expected_tokens(self, slots: list[int], remaining: list[int]) -> np.ndarray:
        """[B, K + 1]: expected tokens each request emits at draft length 0..K (the target's own token
        included), counting none past its remaining budget (tokens beyond max_new_tokens are wasted).
        Kept while nothing it depends on changes (in a run of plain steps: the same requests, no new
        evidence, the same context buckets), so a plain run does not recompute it every step."""
        buckets = context_buckets(self.folded().lengths[slot_rows(slots)])
        key = (tuple(slots), tuple(min(r, self.max_draft_len + 1) for r in remaining), tuple(buckets), self.version)
        if self.tokens_cache[0] != key:
            self.tokens_cache = (key, self.estimate_tokens(slots, remaining))
        return self.tokens_cache[1]

    def estimate_tokens(self, slots: list[int], remaining: list[int]) -> np.ndarray:
        # [B, K]: P(at least j + 1 drafts accepted), planned with the optimistic rates (they explore); counting none
        # past a request's remaining budget (r remaining: positions j + 1 < r can still emit)
        survive = np.cumprod(self.rates(slots, bound=True), axis=1)
        top = self.max_draft_len + 1
        if min(remaining) < top:
            survive *= self.useful[[max(0, min(r, top)) for r in remaining]]
        tokens = np.empty((len(slots), top))  # [B, K + 1]
        tokens[:, 0] = 1.0
        np.cumsum(survive, axis=1, out=tokens[:, 1:])
        tokens[:, 1:] += 1.0
        return tokens
