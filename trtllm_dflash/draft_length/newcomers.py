"""Which newcomers get a probe of their own: per context bucket, backed off while that bucket's requests fail.

A request admitted into a small batch drafts at its first step (`ProbeSettings.newcomer_batch`): one hard request
must not stop the next, easy one from drafting. But where every request of a context bucket fails, each
newcomer's probe is pure cost: the drafter's context for its prompt (benchmarks/results/plain_only_admission.json),
its drafting steps, and its plain steps' context written at later drafting steps. So the outcome of each request
that drafted enough to judge (`OWN_PROBES` own steps) is kept per bucket of its prompt's length: paid (by its own
estimate some draft length beats a plain step even alone) or failed (it stopped keeping the drafter's context, or
ended without paying). After n >= 2 failures in a row, one newcomer of that bucket in 2^(n-1) probes, at most one
in `longest`; one that pays restarts it. A bucket whose recent verdicts (decayed by HISTORY_DECAY per verdict)
paid at least as often as they failed is not backed off: a mix of easy and hard prompts has runs of hard ones
(benchmarks/results/bucket_history.json). Large batches' own back-off (`CostBasedDraftLen.crowd`) keeps the streak
rule alone: there a request that pays alone is judged paid though its batch would not draft.
The others join plain-only where no running request keeps the drafter's context (`CostBasedDraftLen.drafts_for`):
the bucket's pooled rates come mostly from its easy requests. An easy request of a backed-off bucket is found at
its bucket's turn, which restarts every newcomer's probe.
"""

from __future__ import annotations

import numpy as np

from .acceptance import CONTEXT_BASE, CONTEXT_BUCKETS, context_buckets

HISTORY_DECAY = 0.9  # per verdict of a bucket: its paid and failed counts remember about its last 10 verdicts


class NewcomerBackoff:
    def __init__(self, num_slots: int, longest: int, history: bool = True):
        self.longest = longest
        self.use_history = history  # False: any run of n >= 2 failures backs off (large batches' back-off)
        self.failures = np.zeros(CONTEXT_BUCKETS, dtype=int)  # [C] judged requests that failed in a row
        self.history = np.zeros((2, CONTEXT_BUCKETS))  # [2 (paid, failed), C] decayed verdicts
        self.waited = np.zeros(CONTEXT_BUCKETS, dtype=int)  # [C] admissions since that bucket's last probe
        self.bucket = np.full(num_slots, -1)  # [S] prompt bucket of a slot's request not judged yet (-1: none)

    def every(self, bucket: int) -> int:
        """1 newcomer in this many of the bucket probes."""
        # mostly paying lately: a run of failures is a run of hard requests, not the bucket
        if self.use_history and self.history[0, bucket] >= self.history[1, bucket]:
            return 1
        return int(min(2 ** max(int(self.failures[bucket]) - 1, 0), self.longest))

    def admit(self, slots: list[int], contexts: list[int]) -> bool:
        """New requests (prompts of `contexts` tokens) take these slots; -> whether they probe at their first
        step (one probe serves them all: a step drafts for every row that keeps the drafter's context)."""
        buckets = context_buckets(contexts)
        self.bucket[slots] = buckets
        return any([self.due(int(b)) for b in np.unique(buckets)])  # a list: every bucket counts its admission

    def backed_off(self, contexts: list[int]) -> bool:
        """Whether any of these prompt lengths' buckets probes fewer than every newcomer."""
        return any(self.every(int(b)) > 1 for b in context_buckets(contexts))

    def due(self, bucket: int) -> bool:
        self.waited[bucket] += 1
        if self.waited[bucket] < self.every(bucket):
            return False
        self.waited[bucket] = 0
        return True

    def judged(self, slot: int, paid: bool) -> None:
        """The request in `slot` has shown whether drafting pays for it (once per request; later calls do nothing)."""
        bucket = int(self.bucket[slot])
        if bucket < 0:
            return
        self.bucket[slot] = -1
        self.failures[bucket] = 0 if paid else self.failures[bucket] + 1
        self.history[:, bucket] *= HISTORY_DECAY
        self.history[0 if paid else 1, bucket] += 1
        if paid:
            self.waited[bucket] = 0

    def forget(self, slot: int) -> None:
        """The request in `slot` ended unjudged (plain-only, or too few drafting steps of its own)."""
        self.bucket[slot] = -1

    def move(self, src: int, dst: int) -> None:
        self.bucket[dst], self.bucket[src] = self.bucket[src], -1

    def describe(self) -> dict:
        """Buckets now backed off: their lower bound in tokens -> 1 newcomer in N probes."""
        return {str(0 if b == 0 else CONTEXT_BASE * 2 ** (b - 1)): self.every(b)
                for b in range(CONTEXT_BUCKETS) if self.every(b) > 1}
