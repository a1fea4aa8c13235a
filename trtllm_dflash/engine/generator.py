"""The speculative generation loop: prefill, then draft_block -> verify -> accept -> commit.

Requests decode together, each in its own row (slot), at its own positions and with its own
acceptance. Rows persist across steps, so requests can join between steps (`admit`) and leave
when finished: `generate()` runs a fixed batch to completion; a server calls `allocate` once, then
`admit` and `step` as requests arrive (inflight batching). Each step drafts k tokens per request,
k chosen by the draft-length policy (k = 0: a plain step, the target alone); any k is exact.

The roles are their own classes: the cache manager (cache_manager.py: caches, block pool, per-slot state,
compaction), the scheduler (scheduler.py: admission, preemption, chunked prefill) and the runner (runner.py: the
passes). Memory is paged (cache/kv_cache.py, cache/block_pool.py): a request holds pool blocks for the positions
it has reached, so `max_batch_size` bounds rows, not memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..config.pairing import check_block_size
from ..config.runtime import RuntimeConfig
from ..draft_length.policy import DraftLenPolicy, FixedDraftLen
from ..models.target import TargetModel
from ..speculative.base import Proposer
from .cache_manager import CacheManager
from .request import Request, Result
from .runner import Runner
from .scheduler import Scheduler
from .sequence import Sequence, StepPlan


def part(role: str, name: str, doc: str = "") -> property:
    """A read-write view of a role's attribute on the generator (`generator.pool` is its cache manager's)."""
    return property(lambda self: getattr(getattr(self, role), name),
                    lambda self, value: setattr(getattr(self, role), name, value), doc=doc)


class Generator:
    """Decodes requests in slots: `allocate` once, then `admit` and `step` (or `generate` a fixed batch).

    Runtime settings, read at `allocate`: `policy` (the draft-length policy), `prefix_caching` (reuse cached
    blocks of earlier requests' prefixes), `max_num_tokens` (longer prompts are prefilled in chunks of this many,
    between steps; None: whole), `kv_cache_bytes` (the pool's size; None: every slot can reach `capacity`)."""

    cache = part("caches", "cache", "the target's KV cache (paged: kv_cache.py)")
    pool = part("caches", "pool", "which blocks each row holds (host side)")
    slots = part("caches", "slots", "per-slot device state and the running requests")
    bytes_per_block = part("caches", "bytes_per_block")
    block = part("caches", "block", "the draft block: drafts per step <= block - 1")
    capacity = part("caches", "capacity", "positions a request may reach: prompt + output + block")
    max_num_tokens = part("scheduler", "max_num_tokens", "longer prompts are prefilled in chunks (None: whole)")
    preempted = part("scheduler", "preempted")
    staged = part("scheduler", "staged")
    preemptions = part("scheduler", "preemptions")
    step_mode = part("runner", "step_mode")
    verify_pass = part("runner", "verify_pass", "the target's cached pass (plain step, verify)")
    prefill_pass = part("runner", "prefill_pass", "the target's prefill")

    def __init__(self, target: TargetModel, proposer: Proposer, default_stop_ids: tuple[int, ...] = ()):
        self.target, self.default_stop_ids = target, default_stop_ids
        self.device = target.lm_head.weight.device
        self.caches = CacheManager(target, proposer, self.device)
        self.runner = Runner(target, proposer, self.caches)
        self.scheduler = Scheduler(self.caches, self.runner)
        self.prefix_caching = True
        self.kv_cache_bytes: int | None = None
        self.policy: DraftLenPolicy = FixedDraftLen()  # the whole block every step, unless told otherwise

    def configure(self, runtime: RuntimeConfig, policy: DraftLenPolicy, kv_cache_bytes: int | None = None) -> None:
        """The runtime's settings and the draft-length policy its `draft_len` names; call before `allocate`.
        kv_cache_bytes: the pool's size where the caller sized it (a server on a GPU, from free memory); None:
        runtime.kv_cache_gib's, or without one every slot at `capacity`."""
        self.policy = policy
        self.prefix_caching, self.max_num_tokens = runtime.prefix_caching, runtime.max_num_tokens
        self.kv_cache_bytes = runtime.kv_cache_bytes if kv_cache_bytes is None else kv_cache_bytes

    @contextmanager
    def temporarily(self, policy: DraftLenPolicy, prefix_caching: bool | None = None) -> Iterator[None]:
        """Steps inside the block run under `policy` and, where given, with the allocated pool's prefix caching on
        or off (requests a caller times or warms up with); both are restored after, an error included."""
        held, caching = self.policy, None if prefix_caching is None else self.pool.prefix_caching
        self.policy = policy
        if prefix_caching is not None:
            self.pool.prefix_caching = prefix_caching
        try:
            yield
        finally:
            self.policy = held
            if caching is not None:
                self.pool.prefix_caching = caching

    @property
    def policy(self) -> DraftLenPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: DraftLenPolicy) -> None:
        self._policy = self.caches.policy = self.scheduler.policy = policy

    @property
    def proposer(self) -> Proposer:
        return self.runner.proposer

    @proposer.setter
    def proposer(self, proposer: Proposer) -> None:
        self.caches.proposer = self.runner.proposer = proposer

    def set_step_mode(self, mode, prefills_once: bool = False) -> None:
        """How steps run the target's and the proposer's passes (step_mode.py); call before `allocate`.
        prefills_once: this generator will prefill one request and no more (`dflash-generate`): its prefill runs
        eagerly, since tracing a graph it runs once costs more than it could save; the steps, which run many
        times, are compiled as `mode` says."""
        self.runner.set_step_mode(mode, prefills_once)

    @torch.inference_mode()
    def generate(self, requests: list[Request], block_size: int | None = None) -> list[Result]:
        """Decode a fixed batch to completion."""
        if not requests:
            return []
        block = self.check_block(block_size)
        cfg = self.target.config
        for r in requests:  # before `allocate`
            r.validate(cfg.vocab_size, cfg.max_position_embeddings)
        capacity = max(len(r.prompt_ids) + r.max_new_tokens for r in requests) + block + 1
        self.allocate(len(requests), capacity, block)
        sequences = self.admit(requests)
        while self.slots.running or self.preempted:
            self.step()
        return [s.result for s in sequences]

    def check_block(self, block_size: int | None) -> int:
        trained = self.proposer.max_block_size
        return check_block_size(trained if block_size is None else block_size, trained)

    @torch.inference_mode(False)
    def allocate(self, num_slots: int, capacity: int, block: int, num_blocks: int | None = None) -> None:
        """Caches for `num_slots` sequences of up to `capacity` positions (prompt + output + block), then the
        draft-length policy's preparation (per-slot state)."""
        self.allocate_caches(num_slots, capacity, block, num_blocks)
        self.policy.prepare(self)

    @torch.inference_mode(False)
    def allocate_caches(self, num_slots: int, capacity: int, block: int, num_blocks: int | None = None) -> None:
        """`allocate` without the policy's preparation (`CacheManager.allocate`)."""
        self.caches.allocate(num_slots, capacity, block, num_blocks, self.step_mode, prefix_caching=self.prefix_caching,
                             max_num_tokens=self.max_num_tokens, kv_cache_bytes=self.kv_cache_bytes)
        self.scheduler.reset()
        self.runner.shape_calls.clear()  # new cache addresses: CUDA graphs record every shape again

    def block_bytes(self) -> int:
        return self.caches.block_bytes()

    def pool_stats(self) -> dict[str, int]:
        """The pool's accounting for metrics: blocks in use and in all, prefix-cache hits, preemptions ({} before
        `allocate`)."""
        return {} if self.pool is None else {**self.pool.stats(), "preemptions": self.preemptions}

    def num_running(self) -> int:
        return 0 if self.slots is None else len(self.slots.running)  # requests decoding in slots

    def num_free(self) -> int:
        return len(self.slots.free())  # slots a newcomer may take now

    def first_positions(self, tokens: int) -> int:
        return self.caches.first_positions(tokens)

    # -- admission
    def validate(self, request: Request) -> None:
        self.scheduler.validate(request)

    def admissible(self, requests: list[Request]) -> int:
        """How many of `requests`, in order, `admit` can take now (`Scheduler.admissible`)."""
        return self.scheduler.admissible(requests)

    def check_admission(self, requests: list[Request]) -> None:
        self.scheduler.check_admission(requests)

    @torch.inference_mode()
    def admit(self, requests: list[Request], tags: list | None = None, drafting: bool | None = None) -> list[Sequence]:
        """Prefill new requests into free slots (one batched pass); they decode from the next step.

        drafting: whether the drafter keeps their context (None: the policy's `drafts_for` decides). Plain-only
        requests skip the drafter's context K/V and draft nothing (their rows verify padding in drafting steps)."""
        self.check_admission(requests)
        start = time.perf_counter()
        slots = self.slots.free()[: len(requests)]
        if drafting is None:
            drafting = self.decide_drafting(requests, slots)
        rows = [self.caches.staging_row if self.scheduler.chunked(r) else s for r, s in zip(requests, slots)]  # staged
        stops = self.default_stop_ids
        sequences = [Sequence.new(r, row, start, tag, stops, drafting)
                     for r, row, tag in zip(requests, rows, tags or [None] * len(requests))]
        running = self.scheduler.place(sequences)
        if running:
            first = self.scheduler.start(running, [len(s.request.prompt_ids) for s in running])
            now = time.perf_counter()
            for seq, token in zip(running, first):
                seq.result.first_token_s = now
                self.emit(seq, [token], now)
        return sequences

    def decide_drafting(self, requests: list[Request], new_slots: list[int]) -> bool:
        return self.scheduler.drafts_for(requests, new_slots)

    # -- draft length
    def draft_len(self, running: list[Sequence]) -> int:
        """The policy's draft length for the next step of `running` (0..block - 1), after stopping the requests it
        no longer expects to draft (`next_draft_len`)."""
        k, stopping = self.next_draft_len(running)
        if stopping:
            self.stop_drafting(stopping)
        return k

    def next_draft_len(self, running: list[Sequence]) -> tuple[int, list[Sequence]]:
        return self.scheduler.next_draft_len(running)

    def stop_drafting(self, sequences: list[Sequence]) -> None:
        """These requests become plain-only (`CacheManager.stop_drafting`)."""
        self.caches.stop_drafting(sequences)

    # -- a step
    @torch.inference_mode()
    def step(self, draft_len: int | None = None) -> list[Sequence]:
        """One speculative step for every running sequence: draft k tokens, verify them, accept a prefix; first the
        scheduler's phases (blocks for the step, preempting when the pool is full; resumed requests; a chunk of a
        staged prompt). k = draft_len, else the policy's choice; k = 0 runs the target alone on each last token;
        `read_tokens` is the step's one host sync. -> the sequences that ran (finished ones have `done` set and
        have left their slots), and a staged one whose first token finished it."""
        self.scheduler.reserve()
        self.scheduler.resume()
        ready = self.advance_prefill()
        if not self.slots.running:
            return ready
        plan = self.plan(draft_len)
        self.step_mode.begin_step()
        began = time.perf_counter()
        batch = self.runner.batch(plan)
        drafts, draft_probs = self.runner.draft(plan, batch)
        verified = self.runner.verify(plan, batch, drafts, draft_probs)
        self.runner.advance(plan, verified)
        drafted, accepted, bonuses = self.runner.read_tokens(verified)
        self.runner.keep_context(plan, verified, accepted)
        now = time.perf_counter()
        self.learn(plan, verified.shape, accepted, now - began)
        self.record(plan, drafted, accepted, bonuses, now)
        return ready + plan.running

    def advance_prefill(self) -> list[Sequence]:
        """One chunk of the first staged prompt (`Scheduler.advance_prefill`); after its last one it emits its first
        token. -> it, when that token already finished it (nothing else reports it)."""
        started = self.scheduler.advance_prefill()
        if started is None:
            return []
        seq, token = started
        now = time.perf_counter()
        seq.result.first_token_s = now
        self.emit(seq, [token], now)
        return [seq] if seq.done else []

    def plan(self, draft_len: int | None) -> StepPlan:
        """The step's rows (running requests in slot order, compacted to slots 0..n-1), draft length and padded
        shape, decided on the host. Before a drafting step, the prompts' deferred drafter context is written:
        admission's cost, which no step model prices (the plain steps' is the drafting step's, timed with it)."""
        running = [self.slots.running[slot] for slot in sorted(self.slots.running)]
        k = self.draft_len(running) if draft_len is None else draft_len
        keeping = [s.drafting for s in running]  # after draft_len: it may stop some requests drafting
        if not any(keeping):  # the drafter has no context for any of them
            k = 0
        if running[-1].slot != len(running) - 1:  # free slots among the running ones
            running = self.caches.compact(running)
        if k > 0:
            self.proposer.flush(prompts_only=True)
        rows, width = self.runner.padded(len(running), k, any(keeping))
        return StepPlan(running, k, keeping, rows, width, [s.request.sampling for s in running])

    def learn(self, plan: StepPlan, shape: tuple[int, int, int], accepted: list[int], seconds: float) -> None:
        """The draft-length policy's evidence: the step's time (settled shapes only) and each row's acceptance."""
        if not any(plan.keeping):  # plain-only requests alone: none drafts again, so the step teaches nothing
            self.policy.plain_only_step()
            return
        slots, max_start = [s.slot for s in plan.running], max(s.start for s in plan.running)
        if self.runner.count_shape(shape):
            self.policy.timed(len(slots), max_start, plan.k, seconds)
        self.policy.observe(slots, plan.k, accepted, plan.keeping if plan.mixed else None)

    def record(self, plan: StepPlan, drafted: list[list[int]], accepted: list[int], bonuses: list[int],
               now: float) -> None:
        """Each request's result: its draft and acceptance counts, and its accepted tokens and bonus emitted."""
        for row, seq in enumerate(plan.running):
            a, own = accepted[row], plan.k if seq.drafting else 0
            seq.start += a + 1
            seq.result.drafted_tokens += own
            seq.result.accepted_tokens += a
            seq.result.draft_lengths.append(own)
            seq.result.acceptance_lengths.append(self.emit(seq, drafted[row][:a] + [bonuses[row]], now))

    def hold(self, sequences: list[Sequence], length: int) -> None:
        """Pin sequences at committed length `length` with no output yet (calibration: `CacheManager.hold`)."""
        self.caches.hold(sequences, length)

    # -- output
    def emit(self, seq: Sequence, tokens: list[int], now: float) -> int:
        """Append tokens up to the stop token or length limit; a finished sequence frees its slot.

        -> tokens kept."""
        result, request = seq.result, seq.request
        kept = tokens[: request.max_new_tokens - len(result.output_ids)]
        for j, token in enumerate(kept):
            if token in seq.stops:
                kept = kept[: j + 1]
                result.finish_reason = "stop"
                break
        result.output_ids.extend(kept)
        if not result.finish_reason and len(result.output_ids) >= request.max_new_tokens:
            result.finish_reason = "length"
        if result.finish_reason:
            self.finish(seq, now)
        return len(kept)

    def live(self) -> list[Sequence]:
        """Every admitted request not finished: running, or preempted and waiting to resume, or staged."""
        return self.scheduler.live()

    def cancel(self, seq: Sequence, reason: str) -> None:
        """End a sequence from outside the loop (client gone, stop string, shutdown)."""
        self.finish(seq, time.perf_counter(), reason)

    def finish(self, seq: Sequence, now: float, reason: str | None = None) -> None:
        """Leave the slot (also for a cancelled request, with `reason`)."""
        if reason:
            seq.result.finish_reason = reason
        seq.done = True
        seq.result.finish_s = now
        if self.slots.running.get(seq.slot) is seq:
            self.caches.free(seq)
        else:
            self.scheduler.drop(seq)
