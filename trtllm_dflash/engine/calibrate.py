"""`dflash-build calibrate`: measure a step-cost model on the machine that serves, and cache it with the engine.

Nothing measures at start-up: the live policy (draft_length/policy.py) reads a cached model as the prior of its
step times, which its own timed steps override within a few steps.

The calibration times the generator's own `step(k)` (drafter, verify, acceptance, bookkeeping: the
whole step a request pays for) on synthetic requests pinned at each context length (`hold`: the
cache holds junk there, which costs the same as real keys), for every (batch size, draft length,
context) of a small grid. Every cell first steps untimed as often as the step mode needs to settle a
new shape (`StepMode.settle_calls`: CUDA graphs warm up and record each padded shape on its first two
calls, which measured 2x a replayed step on an H100 when they were in the samples). Repeats are
interleaved over draft lengths and contexts, so a machine that gets busier mid-way shifts every draft
length alike, and each timed step follows untimed ones of the same draft length and context, as steps
follow each other in a run of them: a plain cell after 3 plain steps (`PLAIN_LEAD_STEPS`), a drafting cell
after 1. A whole-block step slows the plain steps right after it on a CPU, so each cell is timed after leads of its own
kind (benchmarks/results/calibration_lead.json). The median of the repeats is kept and made
non-decreasing in the draft length. The model is valid for one device, thread count, torch version and
engine: that key names the cache file (`ENGINE/calibration/step-cost-<key>.json`).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..cache.kv_cache import BLOCK
from ..draft_length.cost import CostModel, monotone
from ..utils.device import device_name
from ..utils.errors import DFlashError
from .request import Request

DRAFT_LENS = (0, 1, 2, 4, 8, 16, 32)  # measured draft lengths (the rest is interpolated; cost is near linear)
PLAIN_LEAD_STEPS = 3  # untimed plain steps before a timed one: a whole-block step slows ~3 after it (below)
SHORT_CONTEXT = 128
# how cells are timed: a cached model measured another way is measured again (2: cells after lead steps of
# their own kind; models cached before carry no procedure and read as 1, whose plain cells ran up to 1.29x high;
# 3: a drafting step of k < block - 1 drafts the whole block (speculative/dflash.py), so it costs what k = 15 does)
PROCEDURE = 3


@dataclass(frozen=True)
class CalibrationPlan:
    batch_sizes: tuple[int, ...]
    draft_lens: tuple[int, ...]
    contexts: tuple[int, ...]
    repeats: int = 3
    plain_lead: int = PLAIN_LEAD_STEPS  # untimed steps of its kind before each timed plain step
    draft_lead: int = 1  # ... before each timed drafting step

    @classmethod
    def covering(cls, max_batch: int, max_draft_len: int, max_context: int, repeats: int = 3) -> CalibrationPlan:
        """Powers of two up to max_batch (and it), DRAFT_LENS up to max_draft_len (and it), a short
        context and the longest."""
        batches = sorted({b for b in (1 << i for i in range(max_batch.bit_length())) if b < max_batch} | {max_batch})
        lens = sorted({k for k in DRAFT_LENS if k < max_draft_len} | {0, max_draft_len})
        contexts = sorted({min(SHORT_CONTEXT, max_context), max_context})
        return cls(tuple(batches), tuple(lens), tuple(contexts), repeats)


def calibration_key(generator) -> dict:
    """What a measured cost is valid for."""
    return {"device": device_name(generator.device), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "tp_size": generator.target.tp.world, "block": generator.block, "step_mode": generator.step_mode.mode,
            "procedure": PROCEDURE}


def measure(generator, plan: CalibrationPlan, clock=time.perf_counter) -> CostModel:
    """Time generator steps over the plan's grid; the generator must be allocated and idle."""
    if generator.slots is None or generator.slots.running:
        raise DFlashError("calibration needs an allocated, idle generator (no running requests)")
    slots, longest = generator.slots.usable, generator.capacity - generator.block - 1
    if plan.batch_sizes[-1] > slots or plan.contexts[-1] > longest or plan.draft_lens[-1] > generator.block - 1:
        raise DFlashError(f"calibration plan {plan} exceeds the allocation ({slots} slots, contexts up to {longest}, "
                          f"draft length up to {generator.block - 1})")
    plan = within_pool(generator, plan)
    start = time.perf_counter()
    samples = {}
    for batch in plan.batch_sizes:
        samples.update(measure_batch(generator, plan, batch, clock))
    seconds = [[monotone([statistics.median(samples[c, b, k]) for k in plan.draft_lens]) for b in plan.batch_sizes]
               for c in plan.contexts]
    worst = max(samples, key=lambda cell: max(samples[cell]) / min(samples[cell]))
    meta = {**calibration_key(generator), "repeats": plan.repeats, "calibration_s": time.perf_counter() - start,
            "worst_cell_max_over_min": max(samples[worst]) / min(samples[worst]),
            "worst_cell": dict(zip(("context", "batch", "draft_len"), worst), seconds=samples[worst]),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return CostModel(plan.batch_sizes, plan.draft_lens, plan.contexts, seconds, meta)


def within_pool(generator, plan: CalibrationPlan) -> CalibrationPlan:
    """The plan with its contexts cut to the longest at which the KV pool holds its largest batch at once (a pool
    sized by --kv-cache-gib may hold fewer positions than max_batch_size x max_seq_len); the cost model
    extrapolates past its longest context. A pool too small for that batch at any context is refused."""
    rows = plan.batch_sizes[-1]
    fits = generator.pool.num_blocks // rows * BLOCK - generator.block - 1  # positions per row less anchor, block
    if fits < 1:
        raise DFlashError(f"the KV pool ({generator.pool.num_blocks} blocks of {BLOCK}) cannot hold {rows} requests "
                          f"at once to calibrate the step cost: give a larger --kv-cache-gib, a smaller "
                          f"--max-batch-size, or a fixed --draft-len")
    return replace(plan, contexts=tuple(sorted({min(c, fits) for c in plan.contexts})))


def measure_batch(generator, plan: CalibrationPlan, batch: int, clock) -> dict[tuple, list[float]]:
    """-> {(context, batch, draft_len): [seconds per repeat]} for one batch size."""
    # max_new_tokens that still validates, against the engine's capacity and the pool's blocks
    budget = min(generator.capacity, generator.pool.num_blocks * BLOCK) - generator.block - 2
    requests = [Request((0,), budget, ignore_eos=True) for _ in range(batch)]
    sequences = generator.admit(requests, drafting=True)  # whatever the policy says of newcomers: k is the plan's
    samples: dict[tuple, list[float]] = {}
    try:
        for _ in range(generator.step_mode.settle_calls):  # first-call costs stay out of the samples
            for context in plan.contexts:
                for k in plan.draft_lens:
                    generator.hold(sequences, context)
                    generator.step(k)
        for r in range(plan.repeats):
            lens = plan.draft_lens[r % len(plan.draft_lens):] + plan.draft_lens[: r % len(plan.draft_lens)]
            for context in plan.contexts:
                for k in lens:
                    for _ in range(plan.draft_lead if k else plan.plain_lead):  # untimed, of its kind
                        generator.hold(sequences, context)
                        generator.step(k)
                    generator.hold(sequences, context)
                    t0 = clock()
                    generator.step(k)
                    samples.setdefault((context, batch, k), []).append(clock() - t0)
    finally:
        for seq in sequences:
            if not seq.done:
                generator.cancel(seq, "calibration")
    return samples


class CalibrationCache:
    """Cost models of one engine, one file per key, in ENGINE/calibration/ (or `fallback` when the
    engine directory is read-only)."""

    def __init__(self, directory: Path, fallback: Path | None = None):
        self.directory, self.fallback = Path(directory), fallback
        self.loaded_from: Path | None = None

    def path(self, key: dict, directory: Path | None = None) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return (directory or self.directory) / f"step-cost-{digest}.json"

    def load(self, key: dict) -> CostModel | None:
        """The model cached for `key`, if any (`loaded_from` then says where)."""
        for directory in filter(None, (self.directory, self.fallback)):
            path = self.path(key, directory)
            if path.is_file():
                model = CostModel.load(path)
                if all(model.meta.get(k) == v for k, v in key.items()):
                    self.loaded_from = path
                    return model
        return None

    def save(self, model: CostModel, key: dict) -> Path | None:
        """-> where it was written; None when neither place is writable (the model is still used)."""
        for directory in filter(None, (self.directory, self.fallback)):
            try:
                path = self.path(key, directory)
                model.save(path)
                return path
            except OSError:
                continue
        return None
