"""Step seconds per (batch bucket, draft length), learned from the steps this process runs.

    log seconds(b, k) = level[b] + shape[b, k] + resid[b, k]

`shape` is the prior: the log ratio of a k-draft step to a plain one, from a stored calibration
(`dflash-build calibrate`) where the engine has one, else `analytic_shape`. `level[b]` follows every timed step of
bucket b whatever its k, so a machine that turns 2x slower moves every k alike within a few steps; `resid[b, k]`
is each cell's own decayed mean deviation, so what this machine measures replaces the prior after one step of
that kind. A drafting k not run borrows its run neighbours' deviation (interpolated; a drafting step drafts the
whole block at any k, speculative/dflash.py, so its cells differ only by their verify tokens). Once a cell has
been seen, each sample's deviation is clipped to +-CLIP: one stray step (another process's burst) moves an
estimate by a bounded amount. Host arrays only ([buckets, K + 1]).
"""

from __future__ import annotations

import math

import numpy as np

BUCKETS = 11  # batch buckets 1, 2-3, 4-7, ..., 1024 and more
DECAY = 0.98  # per timed step of a bucket: its cells' counts remember about 50 steps
LEVEL_GAIN = 0.3  # the share of each step's deviation the bucket's level takes at once
MIN_GAIN = 0.1  # a cell's mean weighs its latest step at least this much (a change shows within ~10 steps)
CLIP = math.log(2.0)  # the largest deviation one step of a seen cell counts with
# log-seconds uncertainty of a cell never timed (the prior's own error), shrinking as 1/sqrt(steps + 1): the
# policy prices each kind of step (plain, drafting) at this optimistic bound, so an untimed kind gets tried
SPREAD = 0.2
# the analytic prior, in plain steps: a drafting step costs DRAFT_COST plus VERIFY_COST per draft and row
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
        self.level = np.zeros(BUCKETS)  # [BUCKETS] log seconds of a plain step at the prior's shape
        self.resid = np.zeros_like(shape)  # [BUCKETS, K + 1] each cell's own deviation (0 where not run)
        self.count = np.zeros_like(shape)  # [BUCKETS, K + 1] decayed timed steps

    def log_seconds(self, b: int) -> np.ndarray:
        """[K + 1] the bucket's estimated log seconds at draft length 0..K."""
        resid, seen = self.resid[b].copy(), np.flatnonzero(self.count[b, 1:] > 0) + 1
        if len(seen):
            drafting = np.arange(1, len(resid))
            resid[1:] = np.interp(drafting, seen, resid[seen])
        return self.level[b] + self.shape[b] + resid

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
        predicted = self.log_seconds(b)
        first = not self.count[b].any()
        seen = self.count[b, k] > 0
        self.count[b] *= DECAY
        self.count[b, k] += 1.0
        if first:  # the bucket's first step (plain, see `AutoDraftLen.choose`): its level
            self.level[b] = y - predicted[k]
            return
        error = y - predicted[k]
        if not seen:  # a cell's first step corrects the prior (or the deviation it borrowed), not the level
            self.resid[b, k] = y - self.level[b] - self.shape[b, k]
            return
        error = max(-CLIP, min(CLIP, error))
        self.level[b] += LEVEL_GAIN * error
        self.resid[b, k] += (1.0 - LEVEL_GAIN) * error * max(1.0 / self.count[b, k], MIN_GAIN)
