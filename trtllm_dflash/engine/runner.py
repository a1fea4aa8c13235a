"""The passes a step runs over rows of the caches: prefill (whole contexts, or chunks of them, in one pass), the
drafter's proposal, and the target's verification with acceptance; then the device state the step leaves."""

from __future__ import annotations

from collections import Counter

import torch

from ..compilation.step_mode import StepMode
from ..models.attention import ForwardContext
from ..models.target import TargetModel
from ..sample.sampling import FIRST, SamplingBatch, sample, token_probs, uniforms
from ..speculative.accept import accept
from ..speculative.base import ContextTokens, Proposer, StepBatch
from .cache_manager import CacheManager
from .sequence import Sequence, StepPlan, Verified


class Runner:
    """Runs the target's and the proposer's passes on the caches' rows."""

    def __init__(self, target: TargetModel, proposer: Proposer, caches: CacheManager):
        self.target, self.proposer, self.caches = target, proposer, caches
        self.device = caches.device
        self.step_mode = StepMode()
        self.shape_calls: Counter = Counter()  # padded steps since the allocation per (rows, width, key span)
        self.verify_pass = target  # the target's cached pass (plain step, verify): the module, or compiled
        self.prefill_pass = target  # the target's prefill: the module, or compiled (no CUDA graphs)

    def count_shape(self, shape: tuple[int, int, int]) -> bool:
        """Counts a step at this padded shape (rows, width, key span). -> whether it was settled: not one of the
        shape's first `StepMode.settle_calls` since the allocation, which warm up and record its CUDA graphs
        (benchmarks/results/gpu_h100_policy/RUN.md); unpadded steps always are. Only settled steps are fed to the
        live policy's step times (draft_length/step_times.py)."""
        if self.step_mode.shapes is None:
            return True
        self.shape_calls[shape] += 1
        return self.shape_calls[shape] > self.step_mode.settle_calls

    def set_step_mode(self, mode: StepMode, prefills_once: bool = False) -> None:
        """See `Generator.set_step_mode`."""
        self.step_mode = mode
        self.verify_pass = mode.compile(self.target)
        self.prefill_pass = self.target if prefills_once else mode.compile_prefill(self.target)
        self.proposer.set_step_mode(mode)

    # -- prefill
    def start(self, sequences: list[Sequence]) -> list[int]:
        """Prefill `sequences` (their rows hold their blocks; `prefilled` positions come from the prefix cache) and
        make them decode: whole contexts in one pass, the rest of those with a cached prefix in a cached pass.
        -> each one's first token (a resumed request's: its anchor, already emitted)."""
        tokens = {}
        fresh = [s for s in sequences if s.prefilled == 0]
        cached = [s for s in sequences if s.prefilled > 0]
        for group, counts in ((fresh, None), (cached, [len(s.context()) - s.prefilled for s in cached])):
            if group:
                tokens.update(zip(map(id, group), self.begin(group, self.prefill(group, counts)).tolist()))
        return [tokens[id(s)] for s in sequences]

    def prefill(self, sequences: list[Sequence], counts: list[int] | None = None) -> torch.Tensor:
        """Run counts[i] more context tokens of each sequence after its `prefilled` ones, attending to those in its
        blocks (a cached pass, eager: its shapes vary); counts None: whole contexts from position 0 (the prefill
        pass, right-padded to the step mode's prefill length). -> each row's last hidden [N, hidden]. Recurrent
        layers fold exactly the counted tokens; window rings keep the last ones (kv_cache.py)."""
        whole = counts is None
        if whole:
            counts = [len(s.context()) for s in sequences]
        n, width = len(sequences), max(counts)
        if whole:
            width = self.step_mode.prefill_length(width, self.caches.cache.capacity)
        ids = torch.zeros((n, width), dtype=torch.long)
        for i, (s, c) in enumerate(zip(sequences, counts)):
            ids[i, :c] = torch.tensor(s.context()[s.prefilled: s.prefilled + c])
        self.caches.pool.flush()  # the rows' blocks, before the pass writes them
        rows = torch.tensor([s.slot for s in sequences], device=self.device)
        fresh = [s.slot for s in sequences if s.prefilled == 0]
        if fresh:  # recurrent layers start from zero state
            self.target.reset(self.caches.cache, rows if whole else torch.tensor(fresh, device=self.device))
        count = torch.tensor(counts, device=self.device)
        drafting = sequences[0].drafting  # one decision per admitted batch
        if whole:  # right padding: a padded row writes junk K/V past its context, beyond its valid length
            positions = torch.arange(width, device=self.device).expand(n, -1)
            # a compiled prefill captures for plain-only requests too (unused): one graph for both kinds
            capture = self.proposer.capture_layer_ids if drafting or self.step_mode.compiled else ()
            ctx = ForwardContext.prefill(positions, self.caches.cache, rows, count, capture_layer_ids=capture)
            hidden, features = self.prefill_pass(ids.to(self.device), ctx)
        else:
            done = torch.tensor([s.prefilled for s in sequences], device=self.device)
            positions = done[:, None] + torch.arange(width, device=self.device)  # [N, T]
            span = max(s.prefilled + c for s, c in zip(sequences, counts))
            ctx = ForwardContext.cached(positions, self.caches.cache, span, slots=rows, lengths=done + count,
                                        commit=count,
                                        capture_layer_ids=self.proposer.capture_layer_ids if drafting else ())
            hidden, features = self.target(ids.to(self.device), ctx)
        if drafting:  # written when a drafter pass first reads them: a request that never drafts never pays
            keep = torch.arange(width, device=self.device) < count[:, None]  # [N, T]: padding is not context
            self.proposer.defer(ContextTokens(rows, keep, features, positions, [s.slot for s in sequences], counts,
                                              prompt=True))
        for s, c in zip(sequences, counts):
            s.prefilled += c
        return hidden[torch.arange(n, device=self.device), count - 1]  # [N, hidden]

    def begin(self, sequences: list[Sequence], last: torch.Tensor) -> torch.Tensor:
        """Prefilled sequences decode from here: their first token from the last hidden [N, hidden] (a resumed
        request's anchor is the token it emitted last), sampling settings and lengths in their slots. -> [N]."""
        per_slot = self.caches.slots
        slots = torch.tensor([s.slot for s in sequences], device=self.device)
        resumed = [s for s in sequences if s.result.output_ids]
        per_slot.steps[slots] = torch.tensor([s.steps for s in sequences], device=self.device) if resumed else 0
        sampling = SamplingBatch.of([s.request.sampling for s in sequences], [s.key for s in sequences],
                                    per_slot.steps[slots])
        per_slot.sampling.write(slots, sampling)  # each step reads its rows' settings from there
        first = self.first_tokens(self.target.logits(last[:, None]), sampling)
        if resumed:
            known = torch.tensor([s.result.output_ids[-1] if s.result.output_ids else -1 for s in sequences],
                                 device=self.device)
            first = torch.where(known >= 0, known, first)
        per_slot.starts[slots] = torch.tensor([s.prefilled for s in sequences], device=self.device)
        per_slot.anchors[slots] = first
        per_slot.drafting[slots] = sequences[0].drafting
        for seq in sequences:
            seq.start = seq.prefilled
        return first

    @staticmethod
    def first_tokens(logits: torch.Tensor, sampling: SamplingBatch) -> torch.Tensor:
        # logits: [N, 1, V] -> [N]
        if sampling.all_greedy:
            return logits[:, 0].argmax(-1)
        return sample(token_probs(logits, sampling), uniforms(sampling, FIRST, 1))[:, 0]

    # -- a step
    def padded(self, n: int, k: int, keeping: bool) -> tuple[int, int]:
        """-> rows and tokens per row of this step's passes: n and k + 1, or rounded up to the step mode's buckets
        (rows past n are free slots, whose results are dropped; tokens past k + 1 are padding drafts).

        keeping False (no running request keeps the drafter's context): plain decoding's shape, one token per row.
        A plain step that keeps the context pads to `StepShapes.min_width` (2 under CUDA graphs: the drafting
        steps' graph, no extra one to compile); the one plain-only requests run alone does not, as plain
        decoding's engine does not: 4 x 2-token rows ran GEMM kernels taking 2.5x the device time per step
        (benchmarks/results/gpu_h100_policy/plain_path/)."""
        shapes = self.step_mode.shapes
        if shapes is None:
            return n, k + 1
        width = shapes.width(k + 1, self.caches.block) if keeping else shapes.width(1, 1)
        return shapes.rows(n, len(self.caches.slots.starts)), width  # starts: usable + spare

    def batch(self, plan: StepPlan) -> StepBatch:
        """The padded rows' device state as the proposer reads it (views of the per-slot tensors: no host copy)."""
        per_slot = self.caches.slots
        sampling = per_slot.sampling.rows(slice(0, plan.rows), plan.params)
        return StepBatch(per_slot.anchors[: plan.rows], per_slot.starts[: plan.rows],
                         max(s.start for s in plan.running), sampling, shapes=self.step_mode.shapes,
                         block=self.caches.block)

    def draft(self, plan: StepPlan, batch: StepBatch):
        """-> drafts [rows, width - 1] (k of them each row's own, the rest padding) and their probabilities or None.
        An eager mixed step runs the drafter over its drafting rows only (gathered); a compiled one over every
        row (one shape), whose plain-only rows draft from stale context what `accept` never takes."""
        drafts = plan.width - 1
        if plan.k == 0:  # a plain step: the drafter does not run (drafts > 0: padding tokens, dropped after the pass)
            return batch.anchors.new_zeros((len(batch.anchors), drafts)), None
        if plan.mixed and not self.step_mode.compiled:
            return self.propose(batch, plan.running, plan.keeping, drafts)
        return self.proposer.propose(batch, drafts)

    def propose(self, batch: StepBatch, running: list[Sequence], keeping: list[bool], num_drafts: int):
        """A drafting step with plain-only rows among its rows: the drafter runs the rows that keep its context
        (it has none for the others), and the plain-only rows verify padding (drafts 0, probabilities 0) that
        `accept` never takes, so each gets exactly a plain step's token. -> drafts [B, num_drafts], probabilities
        [B, num_drafts, V] or None. The verify costs every row num_drafts + 1 tokens: the cost model's price of a
        step of B rows. The drafter reads the drafting rows' context gathered (a copy of those rows' drafter
        context K/V)."""
        rows = [seq for seq, kept in zip(running, keeping) if kept]
        # [D] the drafting rows, which are their slots (rows 0..B-1 hold slots 0..B-1); D counted on the host
        index = torch.nonzero_static(self.caches.slots.drafting[: len(keeping)], size=sum(keeping))[:, 0]
        sampling = self.caches.slots.sampling.rows(index, [seq.request.sampling for seq in rows])
        sub = StepBatch(batch.anchors[index], batch.starts[index], max(seq.start for seq in rows), sampling, index,
                        batch.shapes, batch.block)
        own, own_probs = self.proposer.propose(sub, num_drafts)
        drafts = batch.anchors.new_zeros((len(batch.anchors), num_drafts)).index_copy_(0, index, own)
        if own_probs is None:
            if batch.sampling.all_greedy:
                return drafts, None
            # greedy drafting rows beside a sampling plain-only row: their proposals are one-hot
            own_probs = torch.nn.functional.one_hot(own, self.target.config.vocab_size).float()
        return drafts, own_probs.new_zeros((len(batch.anchors), *own_probs.shape[1:])).index_copy_(0, index, own_probs)

    def own_draft_lengths(self, rows: int, k: int, width: int, mixed: bool) -> torch.Tensor | None:
        """[rows] long, each row's own draft length where it differs from the pass's width - 1 (None: it does not):
        plain-only rows draft 0 beside drafting ones, and padding drafts lie past k."""
        if mixed:
            return self.caches.slots.drafting[:rows].long() * k
        if 0 < k < width - 1:  # (a plain step's padding token is dropped before `accept`: no lengths needed)
            return torch.full((rows,), k, dtype=torch.long, device=self.device)
        return None

    def verify(self, plan: StepPlan, batch: StepBatch, drafts: torch.Tensor, draft_probs) -> Verified:
        """The target's pass over each row's anchor and drafts [rows, width - 1], then acceptance, on the real rows
        only (padding rows and a plain step's padding token dropped first); the target's recurrent state commits
        the accepted tokens. No host sync."""
        n, k, width, cache = len(plan.running), plan.k, plan.width, self.caches.cache
        lengths = self.own_draft_lengths(plan.rows, k, width, plan.mixed)
        starts = batch.starts
        tokens = torch.cat([batch.anchors[:, None], drafts], dim=1)  # [rows, width]
        positions = starts[:, None] + torch.arange(width, device=self.device)
        # a lone anchor is always kept: recurrent layers commit it in the pass; a block commits after accept
        commit = torch.ones_like(starts) if width == 1 else None
        # the target's features feed the drafter's context: none are captured when no running request keeps one
        # (plain-only requests alone), so such a step runs exactly plain decoding's pass, compiled or not
        capture = self.proposer.capture_layer_ids if any(plan.keeping) else ()
        span = batch.key_span(width)
        ctx = ForwardContext.cached(positions, cache, span, commit=commit, capture_layer_ids=capture)
        hidden, features = self.verify_pass(tokens, ctx)
        slots, sampling = ctx.slots, batch.sampling
        if k == 0 and width > 1:  # a plain step padded to a block of 2 (`StepShapes.min_width`): its token alone
            hidden, positions, drafts = hidden[:, :1], positions[:, :1], drafts[:, :0]
            features = None if features is None else features[:, :1]
        if plan.rows > n:  # padding rows (free slots) end here
            slots, starts, positions, hidden, drafts = slots[:n], starts[:n], positions[:n], hidden[:n], drafts[:n]
            features = None if features is None else features[:n]
            draft_probs = None if draft_probs is None else draft_probs[:n]
            lengths = None if lengths is None else lengths[:n]
            sampling = self.caches.slots.sampling.rows(slice(0, n), plan.params)
        num_accepted, bonus = accept(drafts, draft_probs, self.target.logits(hidden), sampling, lengths)
        if commit is None:
            self.target.commit(cache, slots, num_accepted + 1, width)
        return Verified(slots, starts, positions, drafts, features, num_accepted, bonus, (plan.rows, width, span))

    def advance(self, plan: StepPlan, v: Verified) -> None:
        """Device state after acceptance: each row's committed length and anchor (the bonus token), and, on a plain
        step, the drafter's context of its token deferred for the rows that keep one."""
        n, per_slot = len(plan.running), self.caches.slots
        if plan.k == 0 and any(plan.keeping):
            keep = per_slot.drafting[:n, None]  # read only when some row is plain-only: then a snapshot
            self.proposer.defer(ContextTokens(v.slots, keep if all(plan.keeping) else keep.clone(),
                                              self.step_mode.keep(v.features), v.positions,
                                              [s.slot for s in plan.running], [int(d) for d in plan.keeping]))
        per_slot.starts[:n] = v.starts + v.num_accepted + 1
        per_slot.anchors[:n] = v.bonus
        per_slot.steps[:n] += 1
        for seq in plan.running:
            seq.steps += 1

    @staticmethod
    def read_tokens(v: Verified) -> tuple[list[list[int]], list[int], list[int]]:
        """The step's one device read (the host sync of a step): drafts [B, k], num_accepted [B], bonus [B]
        copied as one [B, k + 2] tensor -> host lists."""
        rows = torch.cat([v.drafts, v.num_accepted[:, None], v.bonus[:, None]], dim=1).tolist()
        return [row[:-2] for row in rows], [row[-2] for row in rows], [row[-1] for row in rows]

    def keep_context(self, plan: StepPlan, v: Verified, accepted: list[int]) -> None:
        """A drafting step's drafter context: the target's features of the tokens it kept (the rest of the block was
        rejected), for the rows that keep a context."""
        if plan.k == 0 or v.features is None:
            return
        keep = torch.arange(v.positions.shape[1], device=self.device) <= v.num_accepted[:, None]  # [B, T]
        self.proposer.commit(ContextTokens(v.slots, keep & self.caches.slots.drafting[: len(plan.running), None],
                                           v.features, v.positions, [s.slot for s in plan.running],
                                           [a + 1 if d else 0 for a, d in zip(accepted, plan.keeping)]))
