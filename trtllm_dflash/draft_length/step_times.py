"""Step seconds per (batch bucket, draft length), learned from the steps this process runs.

    log seconds(b, 0) = plain[b]                              log seconds(b, k > 0) = draft[b] + shape[b, k] + resid[b, k]

Each is a robust decaying mean over the timed steps of its kind in the bucket: the first step sets it, each later
one moves it by at least GAIN of its deviation, clipped to +-CLIP (one stray step, another process's burst, moves it
by a bounded amount; a lasting change shows within a few steps). `draft[b]` follows every drafting step whatever
its k: a drafting step drafts the whole block at any k (speculative/dflash.py), so a change in its cost reaches
every k at once. `shape` is the prior's ratio of a k-draft step to a plain one: a stored calibration's
(`dflash-build calibrate`) where the engine has one, else `analytic_shape`; `resid[b, k]` corrects it where that
k ran (a k not run takes its run neighbours', interpolated). Plain steps are their own cell: when the machine slows,
the kind that runs looks dearer than the one that does not, so the policy tries the other and measures it, where
one shared level would keep the old ratio. Host arrays only ([buckets, K + 1]).
"""

from __future__ import annotations

import math

import numpy as np

BUCKETS = 11  # batch buckets 1, 2-3, 4-7, ..., 1024 and more
DECAY = 0.98  # per timed step of a bucket: its cells' counts remember about 50 steps
GAIN = 0.25  # the least weight a mean gives its latest step (half a lasting change shows in 3 steps)
RESID_GAIN = 0.1  # ... a k's correction of the prior's shape, once that k has run
CLIP = math.log(2.0)  # the largest deviation one step of a seen cell counts with
# log-seconds uncertainty of a cell never timed (the prior's own error), shrinking as 1/sqrt(steps + 1): the
# policy prices each kind of step (plain, drafting) at this optimistic bound, so an untimed kind gets tried
SPREAD = 0.2
# the analytic prior, in plain steps: a drafting step costs DRAFT_COST plus VERIFY_COST per draft and sqrt(row)
DRAFT_COST, VERIFY_COST = 0.6, 0.02


def bucket(rows: int) -> int:
    return min(max(int(rows), 1).bit_length() - 1, BUCKETS - 1)


def analytic_shape(max_draft_len: int) -> np.ndarray:
    """[BUCKETS, K + 1] log(step seconds / plain step seconds) when nothing was measured."""
    rows = 2.0 ** np.arange(BUCKETS)[:, None]
    k = np.arange(max_draft_len + 1)[None, :]
    return np.log(1.0 + (k > 0) * DRAFT_COST + VERIFY_COST * k * rows ** 0.5)


def stored_shape(model, max_draft_len: int) -> np.ndarray:
    """[BUCKETS, K + 1] the same ratios from a stored step-cost model (draft_length/cost.py) at its shortest
    context (lengths past its measured ones extend its last)."""
    rows = []
    for b in range(BUCKETS):
        seconds = model.step_seconds(2 ** b, model.contexts[0], max_draft_len)
        seconds = np.pad(seconds, (0, max_draft_len + 1 - len(seconds)), mode="edge")
        rows.append(np.log(seconds / seconds[0]))
    return np.maximum.accumulate(np.asarray(rows), axis=1)  # more drafts never cost less


class StepTimes:
    def __init__(self, shape: np.ndarray):
        self.shape = shape  # [BUCKETS, K + 1]
        self.level = np.zeros((BUCKETS, 2))  # [BUCKETS, (plain, draft)] log seconds
        self.resid = np.zeros_like(shape)  # [BUCKETS, K + 1] the shape's correction where k ran
        self.count = np.zeros_like(shape)  # [BUCKETS, K + 1] decayed timed steps (0: never timed)

    def log_seconds(self, b: int) -> np.ndarray:
        """[K + 1] the bucket's estimated log seconds at draft length 0..K."""
        seen = self.count[b] > 0
        plain, draft = self.level[b]
        if not seen[0]:  # no plain step timed yet (`AutoDraftLen.choose` times one first)
            plain = draft if seen[1:].any() else 0.0
        if not seen[1:].any():
            draft = plain
        out = draft + self.shape[b] + self.resid[b]
        ran = np.flatnonzero(seen[1:]) + 1
        if len(ran):
            out[1:] = draft + self.shape[b, 1:] + np.interp(np.arange(1, len(out)), ran, self.resid[b, ran])
        out[0] = plain
        return out

    def plain_timed(self, rows: int) -> bool:
        return self.count[bucket(rows), 0] > 0

    def lower_seconds(self, rows: int) -> np.ndarray:
        """[K + 1] optimistic seconds: each kind's estimate less SPREAD / sqrt(its timed steps + 1)."""
        b = bucket(rows)
        plain, drafting = self.count[b, 0], self.count[b, 1:].sum()
        spread = SPREAD / np.sqrt(np.array([plain] + [drafting] * (self.shape.shape[1] - 1)) + 1.0)
        return np.exp(self.log_seconds(b) - spread)

    def observe(self, rows: int, k: int, seconds: float) -> None:
        if not seconds > 0:
            return
        b, y = bucket(rows), math.log(seconds)
        k = min(k, self.shape.shape[1] - 1)
        kind = int(k > 0)
        first_of_kind = not (self.count[b, 1:].any() if kind else self.count[b, 0] > 0)
        seen = self.count[b, k] > 0
        predicted = self.log_seconds(b)[k]
        self.count[b] *= DECAY
        self.count[b, k] += 1.0
        if first_of_kind:  # sets the kind's level (the prior's shape kept)
            self.level[b, kind] = y - (self.shape[b, k] if kind else 0.0)
            return
        if kind and not seen:  # a k's first step corrects the shape there (from what it borrowed), not the level
            self.resid[b, k] = y - self.level[b, 1] - self.shape[b, k]
            return
        error = max(-CLIP, min(CLIP, y - predicted))
        gain = max(1.0 / self.count[b, k], GAIN)
        self.level[b, kind] += gain * error
        if kind:
            self.resid[b, k] += RESID_GAIN * error
