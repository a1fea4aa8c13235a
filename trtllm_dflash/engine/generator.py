"""The speculative generation loop: prefill, then draft_block -> verify -> accept -> commit.

Requests decode together, each in its own row (slot), at its own positions and with its own
acceptance. Rows persist across steps, so requests can join between steps (`admit`) and leave
when finished: `generate()` runs a fixed batch to completion; a server calls `allocate` once, then
`admit` and `step` as requests arrive (inflight batching). Each step drafts k tokens per request,
k chosen by the draft-length policy (k = 0: a plain step, the target alone); any k is exact.

Memory is paged (kv_cache.py, paging.py): a request holds pool blocks for the positions it has reached, so
`max_batch_size` bounds rows, not memory. A request is admitted when the pool can hold its prompt and a first
step; a running one that cannot grow is preempted (its blocks freed) and recomputed later from its tokens.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..cache.block_pool import BlockPool, default_blocks
from ..cache.kv_cache import BLOCK, BlockTable, blocks_for
from ..compilation.step_mode import StepMode
from ..config.pairing import check_block_size
from ..config.runtime import RuntimeConfig
from ..draft_length.policy import BatchView, DraftLenPolicy, FixedDraftLen
from ..models.attention import ForwardContext
from ..models.target import TargetModel
from ..sample.sampling import FIRST, SamplingBatch, SamplingParams, sample, token_probs, uniforms
from ..speculative.accept import accept
from ..speculative.base import ContextTokens, Proposer, StepBatch
from ..utils.errors import DFlashError
from .request import Request, Result

log = logging.getLogger(__name__)


@dataclass
class Sequence:
    """One request being decoded in a cache slot."""

    request: Request
    slot: int
    result: Result
    key: int  # the request's random key (sampling.py)
    stops: frozenset[int]
    tag: object = None  # the caller's handle (a server's response sender)
    done: bool = False
    start: int = 0  # committed length on the host: the anchor's position
    drafting: bool = True  # the drafter keeps this request's context; False: plain-only (see Generator.admit)
    steps: int = 0  # steps run (its random stream's counter, restored when a preempted request resumes)
    order: int = 0  # admission order: the latest admitted is preempted first
    prefilled: int = 0  # context positions whose K/V are in its blocks (from the prefix cache, or prefilled)

    def tokens(self) -> list[int]:
        """The tokens at positions 0..start-1 (the anchor, output_ids[-1], is at position start)."""
        return (list(self.request.prompt_ids) + self.result.output_ids)[: self.start]

    def context(self) -> list[int]:
        """What a prefill runs: the prompt, and for a preempted request its output but the anchor (recomputed)."""
        return list(self.request.prompt_ids) + self.result.output_ids[:-1]


@dataclass
class Slots:
    """Per-slot device state: the anchor is the last committed token, at position `starts`."""

    starts: torch.Tensor  # [S] long, committed length
    anchors: torch.Tensor  # [S] long
    steps: torch.Tensor  # [S] long: steps the slot's sequence has run (its random stream's counter)
    sampling: SamplingBatch  # [S] each slot's sampling settings, written at admission; counters: `steps`
    drafting: torch.Tensor  # [S] bool: the slot's request keeps the drafter's context (Sequence.drafting, on device)
    usable: int  # slots requests may hold, <= S: the rest are padding rows only (see `Generator.allocate`)
    running: dict[int, Sequence] = field(default_factory=dict)
    reserved: int = 0  # free slots kept for staged (chunked) prefills, which take one when they finish

    def free(self) -> list[int]:
        free = [s for s in range(self.usable) if s not in self.running]
        return free[: len(free) - self.reserved]


@dataclass
class StepPlan:
    """One step as decided on the host before anything runs (`Generator.plan`)."""

    running: list[Sequence]  # the rows' requests, in slot order: row i holds slot i
    k: int  # draft length (0: a plain step)
    keeping: list[bool]  # per row: the request keeps the drafter's context (False: plain-only)
    rows: int  # rows of the passes: len(running), or padded up to a bucket with free slots
    width: int  # tokens per row of the target's pass: k + 1, or padded
    params: list[SamplingParams]  # per running row

    @property
    def mixed(self) -> bool:
        """A drafting step with plain-only rows riding along (see `Generator.propose`)."""
        return self.k > 0 and not all(self.keeping)


@dataclass
class Verified:
    """The target's verdict on a step, on its real rows (device tensors; B = len(running), T = tokens kept per
    row: width, or 1 for a plain step padded to 2)."""

    slots: torch.Tensor  # [B] long
    starts: torch.Tensor  # [B] long, committed lengths before the step
    positions: torch.Tensor  # [B, T] long
    drafts: torch.Tensor  # [B, T - 1] long
    features: torch.Tensor | None  # [B, T, ...] the captured target layers' outputs (None: none captured)
    num_accepted: torch.Tensor  # [B] long, drafts accepted
    bonus: torch.Tensor  # [B] long, the token sampled after them: the next anchor
    shape: tuple[int, int, int]  # the padded pass: (rows, width, key span)


class Generator:
    def __init__(self, target: TargetModel, proposer: Proposer, default_stop_ids: tuple[int, ...] = ()):
        self.target, self.proposer = target, proposer
        self.default_stop_ids = default_stop_ids
        self.device = target.lm_head.weight.device
        self.cache = None  # the target's KV cache (paged: kv_cache.py)
        self.table: BlockTable | None = None  # the block table the target's and the drafter's caches share
        self.pool: BlockPool | None = None  # which blocks each row holds (host side)
        self.slots: Slots | None = None
        self.preempted: list[Sequence] = []  # preempted requests, resumed (recomputed) first when blocks free up
        self.preemptions = 0
        self.admitted = 0
        self.prefix_caching = True  # reuse cached blocks of earlier requests' prefixes (set before `allocate`)
        self.max_num_tokens: int | None = None  # longer prompts are prefilled in chunks of this many, between steps
        self.kv_cache_bytes: int | None = None  # the pool's size (None: every slot can reach `capacity`)
        self.bytes_per_block = 0
        self.staged: list[Sequence] = []  # long prompts being prefilled in chunks, in the staging row, in order
        self.staging_row: int | None = None  # the cache row chunked prefills run in (one beyond the slots)
        self.refused_prefix_reuse = False
        self.block = proposer.max_block_size
        self.capacity = 0
        self.policy: DraftLenPolicy = FixedDraftLen()  # the whole block every step, unless told otherwise
        self.step_mode = StepMode()
        self.verify_pass = target  # the target's cached pass (plain step, verify): the module, or compiled
        self.prefill_pass = target  # the target's prefill: the module, or compiled (no CUDA graphs)
        self.shape_calls: Counter = Counter()  # padded steps since the allocation per (rows, width, key span)

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

    def set_step_mode(self, mode: StepMode, prefills_once: bool = False) -> None:
        """How steps run the target's and the proposer's passes (step_mode.py); call before `allocate`.
        prefills_once: this generator will prefill one request and no more (`dflash-generate`): its prefill runs
        eagerly, since tracing a graph it runs once cost more than it could save (1.9 s of a 15.5 s warm
        `dflash-generate --engine` of the built-in pair on the 2-core CPU); the steps, which run many times, are
        compiled as `mode` says."""
        self.step_mode = mode
        self.verify_pass = mode.compile(self.target)
        self.prefill_pass = self.target if prefills_once else mode.compile_prefill(self.target)
        self.proposer.set_step_mode(mode)

    @torch.inference_mode()
    def generate(self, requests: list[Request], block_size: int | None = None) -> list[Result]:
        """Decode a fixed batch to completion."""
        if not requests:
            return []
        block = self.check_block(block_size)
        cfg = self.target.config
        for r in requests:  # before `allocate`, whose draft-length calibration runs requests of its own
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
        """Caches for `num_slots` sequences of up to `capacity` positions (prompt + output + block). Normal tensors,
        never inference tensors, whether or not the caller is in inference mode (`generate` is): steps update them
        in place either way, and a compiled pass would take the two kinds for different inputs (a recompilation).
        num_blocks: the pool's blocks of kv_cache.BLOCK positions (None: enough for every slot at `capacity`).
        Compiled steps keep caches of at least 2 slots (the second one unused when num_slots is 1): a size of 1 is
        specialised, so one slot would need graphs of its own; padded steps whose buckets start at 2 rows
        (`StepShapes.min_rows`) keep per-slot state for that spare slot too, which only padding rows use. Padded
        steps' caches hold `capacity` rounded up to `StepShapes.align` positions (requests are still validated
        against `capacity`)."""
        shapes = self.step_mode.shapes
        rows = max(num_slots, shapes.min_rows if shapes is not None else 1)  # per-slot state: usable + spare
        cache_slots = max(rows, 2) if self.step_mode.compiled else rows
        positions = shapes.capacity(capacity) if shapes is not None else capacity  # padded: aligned key spans
        self.bytes_per_block = self.block_bytes()
        if num_blocks is None and self.kv_cache_bytes is not None and self.bytes_per_block:  # 0: nothing paged
            num_blocks = max(1, self.kv_cache_bytes // self.bytes_per_block)
        if num_blocks is None:
            num_blocks = default_blocks(num_slots, positions)
        self.staging_row = cache_slots if self.max_num_tokens is not None else None
        cache_rows = cache_slots + (self.staging_row is not None)
        self.table = BlockTable(cache_rows, positions, num_blocks, self.device)
        step_tokens = max(block, self.max_num_tokens or 0)  # a chunk is a cached pass too (window rings)
        self.cache = self.target.new_cache(cache_rows, positions, step_tokens, table=self.table)
        self.proposer.table = self.table
        self.proposer.allocate(cache_rows, positions)
        self.pool = BlockPool(self.table, prefix_caching=self.prefix_caching and self.reusable())
        self.step_mode.caches(self.cache.tensors() + self.proposer.tensors())
        self.preempted, self.staged, self.preemptions, self.admitted = [], [], 0, 0
        zeros = torch.zeros(rows, dtype=torch.long, device=self.device)
        steps = zeros.clone()
        table = SamplingBatch.of([SamplingParams()] * rows, [0] * rows, steps)
        drafting = torch.zeros(rows, dtype=torch.bool, device=self.device)
        self.slots = Slots(zeros, zeros.clone(), steps, table, drafting, num_slots)
        self.block, self.capacity = block, capacity
        self.shape_calls = Counter()  # new cache addresses: CUDA graphs record every shape again
        self.policy.prepare(self)

    def block_bytes(self) -> int:
        """Bytes of one pool block of the target's and the drafter's caches (measured on caches of one block)."""
        target = self.target.new_cache(1, BLOCK - 1)
        self.proposer.table = None
        self.proposer.allocate(1, BLOCK - 1)
        return sum(cache.block_bytes() for cache in (target, getattr(self.proposer, "cache", None))
                   if hasattr(cache, "block_bytes"))

    def pool_stats(self) -> dict[str, int]:
        """The pool's accounting for metrics: blocks in use and in all, prefix-cache hits, preemptions."""
        return {**self.pool.stats(), "preemptions": self.preemptions}

    def reusable(self) -> bool:
        """Whether cached prefixes can be reused: every layer's K/V is paged (no window ring, no recurrent state,
        which are per row and not kept with the blocks). Says why not once."""
        kinds = {layer.kind for layer in self.cache.layers}
        reason = ("its linear-attention (Gated DeltaNet) state is kept per request" if hasattr(self.cache, "state")
                  else "its sliding-window layers keep a ring per request" if "window" in kinds else None)
        if reason and not self.refused_prefix_reuse:
            log.warning("prefix caching is off for this target: %s", reason)
            self.refused_prefix_reuse = True
        return reason is None

    def validate(self, request: Request) -> None:
        cfg = self.target.config
        request.validate(cfg.vocab_size, cfg.max_position_embeddings)
        need = len(request.prompt_ids) + request.max_new_tokens + self.block + 1
        if need > self.capacity:
            raise DFlashError(f"prompt length {len(request.prompt_ids)} + max_new_tokens {request.max_new_tokens} "
                              f"exceeds this engine's sequence capacity {self.capacity - self.block - 1}")
        if blocks_for(need) > self.pool.num_blocks:
            raise DFlashError(f"prompt length {len(request.prompt_ids)} + max_new_tokens {request.max_new_tokens} "
                              f"needs {blocks_for(need)} KV blocks but the pool holds {self.pool.num_blocks}")

    def first_positions(self, tokens: int) -> int:
        """Positions a request of `tokens` committed tokens holds to run a step: them, the anchor and a block."""
        return tokens + self.block + 1

    def admissible(self, requests: list[Request]) -> int:
        """How many of `requests`, in order, `admit` can take now: free rows and free blocks for each one's prompt
        and first step (none while a preempted request waits to resume: it goes first)."""
        if self.preempted:
            return 0
        rows, blocks, staging = len(self.slots.free()), self.pool.available(), bool(self.staged)
        for n, r in enumerate(requests):  # as if drafting (decided in `admit`): a plain-only one costs no more
            cost = self.pool.cost(list(r.prompt_ids), self.first_positions(len(r.prompt_ids)))
            if n == rows or cost > blocks or (self.chunked(r) and staging):
                return n
            blocks -= cost
            staging = staging or self.chunked(r)
        return len(requests)

    @torch.inference_mode()
    def admit(self, requests: list[Request], tags: list | None = None, drafting: bool | None = None) -> list[Sequence]:
        """Prefill new requests into free slots (one batched pass); they decode from the next step.

        drafting: whether the drafter keeps their context (None: the policy's `drafts_for` decides). Plain-only
        requests skip the drafter's context K/V and draft nothing (their rows verify padding in drafting steps)."""
        for r in requests:
            self.validate(r)
        free = self.slots.free()
        if len(requests) > len(free):
            raise DFlashError(f"{len(requests)} requests but only {len(free)} free slots")
        if self.admissible(requests) < len(requests):
            raise DFlashError(f"{len(requests)} requests but the KV pool has only {self.pool.available()} free blocks "
                              f"(of {self.pool.num_blocks})")
        start = time.perf_counter()
        slots = free[: len(requests)]
        if drafting is None:
            drafting = self.decide_drafting(requests, slots)
        self.admitting(requests, drafting)
        rows = [self.staging_row if self.chunked(r) else s for r, s in zip(requests, slots)]  # a long one is staged
        sequences = [self.new_sequence(r, row, start, tag) for r, row, tag in zip(requests, rows, tags or [None] * len(requests))]
        for seq in sequences:
            seq.drafting = drafting
            seq.order, self.admitted = self.admitted, self.admitted + 1
            seq.prefilled = self.pool.admit(seq.slot, list(seq.request.prompt_ids),
                                            self.first_positions(len(seq.request.prompt_ids)), self.needs_context(seq))
        now_running = [s for s in sequences if s.slot != self.staging_row]
        self.staged += [s for s in sequences if s.slot == self.staging_row]
        self.slots.reserved = len(self.staged)
        if now_running:  # acceptance from their context's rates
            self.policy.admit([s.slot for s in now_running], [len(s.request.prompt_ids) for s in now_running])
            first = self.start(now_running)
            now = time.perf_counter()
            for seq, token in zip(now_running, first):
                self.slots.running[seq.slot] = seq
                seq.result.first_token_s = now
                self.emit(seq, [token], now)
        return sequences

    def chunked(self, request: Request) -> bool:
        """Whether the request's prompt is prefilled in chunks of `max_num_tokens`, between steps (staged)."""
        return self.max_num_tokens is not None and len(request.prompt_ids) > self.max_num_tokens

    def admitting(self, requests: list[Request], drafting: bool) -> None:
        """Called once `requests` are validated and their drafting decided, before any state changes (the
        tensor-parallel lockstep generator sends them to the other ranks here)."""

    def decide_drafting(self, requests: list[Request], new_slots: list[int]) -> bool:
        """The policy's `drafts_for` on the batch these requests join in `new_slots`."""
        if self.block == 1:
            return True
        running = list(self.slots.running.values())
        slots = [s.slot for s in running] + new_slots
        starts = [s.start for s in running] + [len(r.prompt_ids) for r in requests]
        remaining = [s.request.max_new_tokens - len(s.result.output_ids) for s in running]
        drafting = tuple(s.drafting for s in running) + (True,) * len(requests)
        view = BatchView(slots, max(starts), remaining + [r.max_new_tokens for r in requests], self.block - 1,
                         None if all(drafting) else drafting)
        return self.policy.drafts_for(view)

    def new_sequence(self, request: Request, slot: int, start: float, tag) -> Sequence:
        stops = request.stop_ids if request.stop_ids is not None else self.default_stop_ids
        return Sequence(request, slot, Result(prompt_tokens=len(request.prompt_ids), start_s=start),
                        request.sampling.key(), frozenset() if request.ignore_eos else frozenset(stops), tag)

    def start(self, sequences: list[Sequence]) -> list[int]:
        """Prefill `sequences` (their rows hold their blocks; `prefilled` positions come from the prefix cache) and
        make them decode: whole contexts in one pass, the rest of those with a cached prefix in a cached pass.
        -> each one's first token (a resumed request's: its anchor, already emitted)."""
        tokens = {}
        for group, run in (([s for s in sequences if s.prefilled == 0], self.prefill),
                           ([s for s in sequences if s.prefilled > 0], self.prefill_rest)):
            if group:
                tokens.update(zip(map(id, group), self.begin(group, run(group)).tolist()))
        return [tokens[id(s)] for s in sequences]

    def prefill(self, sequences: list[Sequence]) -> torch.Tensor:
        """Run the contexts (right-padded) through the target from position 0; -> each one's last hidden [N, hidden]."""
        contexts = [s.context() for s in sequences]
        n, prompt = len(sequences), max(len(c) for c in contexts)
        longest = self.step_mode.prefill_length(prompt, self.cache.capacity)
        ids = torch.zeros((n, longest), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, : len(c)] = torch.tensor(c)
        self.pool.flush()  # the rows' blocks, before the pass writes them
        # Right padding: a padded row writes junk K/V past its prompt, beyond its valid length.
        positions = torch.arange(longest, device=self.device).expand(n, -1)
        slots = torch.tensor([s.slot for s in sequences], device=self.device)
        lengths = torch.tensor([len(c) for c in contexts], device=self.device)
        self.target.reset(self.cache, slots)  # recurrent layers start from zero state
        drafting = sequences[0].drafting  # one decision per admitted batch
        # a compiled prefill captures for plain-only requests too (unused): one graph for both kinds of admission
        capture = drafting or self.step_mode.compiled
        ctx = ForwardContext.prefill(positions, self.cache, slots, lengths,
                                     capture_layer_ids=self.proposer.capture_layer_ids if capture else ())
        hidden, features = self.prefill_pass(ids.to(self.device), ctx)
        if drafting:  # written when a drafter pass first reads them: a request that never drafts never pays
            keep = positions < lengths[:, None]  # [N, T]: right padding is not context
            self.proposer.defer(ContextTokens(slots, keep, features, positions, [s.slot for s in sequences],
                                              [len(c) for c in contexts], prompt=True))
        for seq, c in zip(sequences, contexts):
            seq.prefilled = len(c)
        return hidden[torch.arange(n, device=self.device), lengths - 1]  # [N, hidden]

    def prefill_rest(self, sequences: list[Sequence]) -> torch.Tensor:
        return self.extend(sequences, [len(s.context()) - s.prefilled for s in sequences])

    def extend(self, sequences: list[Sequence], counts: list[int]) -> torch.Tensor:
        """Prefill counts[i] more context tokens of each sequence after its `prefilled` ones, attending to those in
        its blocks (a cached pass, eager: its shapes vary); -> each row's last hidden [N, hidden]. Recurrent
        layers fold exactly the counted tokens; window rings keep the last ones (kv_cache.py)."""
        n, width = len(sequences), max(counts)
        ids = torch.zeros((n, width), dtype=torch.long)
        for i, (s, c) in enumerate(zip(sequences, counts)):
            ids[i, :c] = torch.tensor(s.context()[s.prefilled: s.prefilled + c])
        self.pool.flush()
        rows = torch.tensor([s.slot for s in sequences], device=self.device)
        fresh = [s.slot for s in sequences if s.prefilled == 0]
        if fresh:
            self.target.reset(self.cache, torch.tensor(fresh, device=self.device))
        done = torch.tensor([s.prefilled for s in sequences], device=self.device)
        count = torch.tensor(counts, device=self.device)
        positions = done[:, None] + torch.arange(width, device=self.device)  # [N, T]
        drafting = sequences[0].drafting
        ctx = ForwardContext.cached(positions, self.cache, max(s.prefilled + c for s, c in zip(sequences, counts)),
                                    slots=rows, lengths=done + count, commit=count,
                                    capture_layer_ids=self.proposer.capture_layer_ids if drafting else ())
        hidden, features = self.target(ids.to(self.device), ctx)
        if drafting:
            keep = torch.arange(width, device=self.device) < count[:, None]
            self.proposer.defer(ContextTokens(rows, keep, features, positions, [s.slot for s in sequences], counts,
                                              prompt=True))
        for s, c in zip(sequences, counts):
            s.prefilled += c
        return hidden[torch.arange(n, device=self.device), count - 1]

    def begin(self, sequences: list[Sequence], last: torch.Tensor) -> torch.Tensor:
        """Prefilled sequences decode from here: their first token from the last hidden [N, hidden] (a resumed
        request's anchor is the token it emitted last), sampling settings and lengths in their slots. -> [N]."""
        slots = torch.tensor([s.slot for s in sequences], device=self.device)
        resumed = [s for s in sequences if s.result.output_ids]
        self.slots.steps[slots] = torch.tensor([s.steps for s in sequences], device=self.device) if resumed else 0
        sampling = self.sampling(sequences, self.slots.steps[slots])
        self.slots.sampling.write(slots, sampling)  # each step reads its rows' settings from there
        first = self.first_tokens(self.target.logits(last[:, None]), sampling)
        if resumed:
            known = torch.tensor([s.result.output_ids[-1] if s.result.output_ids else -1 for s in sequences],
                                 device=self.device)
            first = torch.where(known >= 0, known, first)
        self.slots.starts[slots] = torch.tensor([s.prefilled for s in sequences], device=self.device)
        self.slots.anchors[slots] = first
        self.slots.drafting[slots] = sequences[0].drafting
        for seq in sequences:
            seq.start = seq.prefilled
        return first

    @staticmethod
    def sampling(sequences: list[Sequence], counters: torch.Tensor) -> SamplingBatch:
        return SamplingBatch.of([s.request.sampling for s in sequences], [s.key for s in sequences], counters)

    @staticmethod
    def first_tokens(logits: torch.Tensor, sampling: SamplingBatch) -> torch.Tensor:
        # logits: [N, 1, V] -> [N]
        if sampling.all_greedy:
            return logits[:, 0].argmax(-1)
        return sample(token_probs(logits, sampling), uniforms(sampling, FIRST, 1))[:, 0]

    def batch_view(self, running: list[Sequence]) -> BatchView:
        """The running batch as the policy sees it, from host-side lengths (no device sync)."""
        slots, drafting = [s.slot for s in running], tuple(s.drafting for s in running)
        return BatchView(slots, max(s.start for s in running),
                         [s.request.max_new_tokens - len(s.result.output_ids) for s in running], self.block - 1,
                         None if all(drafting) else drafting)

    def draft_len(self, running: list[Sequence]) -> int:
        """The policy's draft length for the next step of `running` (0..block - 1); plain-only requests draft
        nothing in it (see `propose`). Before a plain step, requests that keep the drafter's context become
        plain-only when the policy no longer expects them to draft (`keeps_context`)."""
        if not any(s.drafting for s in running):  # plain-only requests alone: nothing to choose or keep
            return 0
        view = self.batch_view(running)
        k = max(0, min(self.policy.choose(view), self.block - 1))
        if k == 0 and self.block > 1:
            keep = self.policy.keeps_context(view)
            stopping = [seq for seq, kept in zip(running, keep) if seq.drafting and not kept]
            if stopping:
                self.stop_drafting(stopping)
        return k

    def stop_drafting(self, sequences: list[Sequence]) -> None:
        """These requests become plain-only: their plain steps write no drafter context, their rows draft
        nothing, and they cannot draft again; their deferred context is dropped unwritten. Once no running
        request keeps a context, steps capture nothing (plain decoding's ops)."""
        for seq in sequences:
            seq.drafting = False
            self.slots.drafting[seq.slot] = False  # a device write, no copy from the host
            self.proposer.release(seq.slot)  # its deferred context is never read
        if not any(seq.drafting for seq in self.slots.running.values()):
            self.proposer.discard()

    @torch.inference_mode()
    def step(self, draft_len: int | None = None) -> list[Sequence]:
        """One speculative step for every running sequence: draft k tokens, verify them, accept a prefix.

        Phases: paging's `reserve` (every running request's next blocks, preempting when the pool is full),
        `resume` (preempted requests, when blocks allow) and `advance_prefill` (one chunk of a staged long prompt);
        then the speculative step's `plan` (rows, k, padded shape: host only), `draft`, `verify` (the target's pass
        and acceptance), `advance` (device state), `read_tokens` (the step's one host sync), `keep_context` (the
        drafter's context of the kept tokens), `learn` (the draft-length policy) and `record` (results, emitted
        tokens). k = draft_len, else the policy's choice; k = 0 runs the target alone on each last token.
        -> the sequences that ran (finished ones have `done` set and have left their slots), and a staged one
        whose first token finished it."""
        self.reserve()
        self.resume()
        ready = self.advance_prefill()
        if not self.slots.running:
            return ready
        plan = self.plan(draft_len)
        self.step_mode.begin_step()
        began = time.perf_counter()
        batch = self.step_batch(plan)
        drafts, draft_probs = self.draft(batch, plan.running, plan.keeping, plan.k, plan.width - 1, plan.mixed)
        verified = self.verify(plan, batch, drafts, draft_probs)
        self.advance(plan, verified)
        drafted, accepted, bonuses = self.read_tokens(verified.drafts, verified.num_accepted, verified.bonus)
        self.keep_context(plan, verified, accepted)
        now = time.perf_counter()
        self.learn(plan, verified.shape, accepted, now - began)
        self.record(plan, drafted, accepted, bonuses, now)
        return ready + plan.running

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
            running = self.compact(running)
        if k > 0:
            self.proposer.flush(prompts_only=True)
        rows, width = self.padded(len(running), k, any(keeping))
        return StepPlan(running, k, keeping, rows, width, [s.request.sampling for s in running])

    def step_batch(self, plan: StepPlan) -> StepBatch:
        """The padded rows' device state as the proposer reads it (views of the per-slot tensors: no host copy)."""
        sampling = self.slots.sampling.rows(slice(0, plan.rows), plan.params)
        return StepBatch(self.slots.anchors[: plan.rows], self.slots.starts[: plan.rows],
                         max(s.start for s in plan.running), sampling, shapes=self.step_mode.shapes, block=self.block)

    def verify(self, plan: StepPlan, batch: StepBatch, drafts: torch.Tensor, draft_probs) -> Verified:
        """The target's pass over each row's anchor and drafts [rows, width - 1], then acceptance, on the real rows
        only (padding rows and a plain step's padding token dropped first); the target's recurrent state commits
        the accepted tokens. No host sync."""
        n, k, width = len(plan.running), plan.k, plan.width
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
        ctx = ForwardContext.cached(positions, self.cache, span, commit=commit, capture_layer_ids=capture)
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
            sampling = self.slots.sampling.rows(slice(0, n), plan.params)
        num_accepted, bonus = accept(drafts, draft_probs, self.target.logits(hidden), sampling, lengths)
        if commit is None:
            self.target.commit(self.cache, slots, num_accepted + 1, width)
        return Verified(slots, starts, positions, drafts, features, num_accepted, bonus, (plan.rows, width, span))

    def advance(self, plan: StepPlan, v: Verified) -> None:
        """Device state after acceptance: each row's committed length and anchor (the bonus token), and, on a plain
        step, the drafter's context of its token deferred for the rows that keep one."""
        n = len(plan.running)
        if plan.k == 0 and any(plan.keeping):
            keep = self.slots.drafting[:n, None]  # read only when some row is plain-only: then a snapshot
            self.proposer.defer(ContextTokens(v.slots, keep if all(plan.keeping) else keep.clone(),
                                              self.step_mode.keep(v.features), v.positions,
                                              [s.slot for s in plan.running], [int(d) for d in plan.keeping]))
        self.slots.starts[:n] = v.starts + v.num_accepted + 1
        self.slots.anchors[:n] = v.bonus
        self.slots.steps[:n] += 1
        for seq in plan.running:
            seq.steps += 1

    def keep_context(self, plan: StepPlan, v: Verified, accepted: list[int]) -> None:
        """A drafting step's drafter context: the target's features of the tokens it kept (the rest of the block was
        rejected), for the rows that keep a context."""
        if plan.k == 0 or v.features is None:
            return
        keep = torch.arange(v.positions.shape[1], device=self.device) <= v.num_accepted[:, None]  # [B, T]
        self.proposer.commit(ContextTokens(v.slots, keep & self.slots.drafting[: len(plan.running), None],
                                           v.features, v.positions, [s.slot for s in plan.running],
                                           [a + 1 if d else 0 for a, d in zip(accepted, plan.keeping)]))

    def learn(self, plan: StepPlan, shape: tuple[int, int, int], accepted: list[int], seconds: float) -> None:
        """The draft-length policy's evidence: the step's time (settled shapes only) and each row's acceptance."""
        if not any(plan.keeping):  # plain-only requests alone: none drafts again, so the step teaches nothing (the
            self.policy.plain_only_step()  # cost policy's bookkeeping was ~60 us a step, a one-off measurement)
            return
        slots, max_start = [s.slot for s in plan.running], max(s.start for s in plan.running)
        if self.settled(shape):
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

    def reserve(self) -> None:
        """Every running request holds blocks for its next step: the anchor and a block past its committed tokens.
        While the pool cannot hold them, the latest admitted request is preempted (`validate` made sure that one
        request alone always fits)."""
        for seq in sorted(self.slots.running.values(), key=lambda s: s.order):
            while self.slots.running.get(seq.slot) is seq and not self.pool.grow(seq.slot, self.first_positions(seq.start)):
                self.preempt(max(self.slots.running.values(), key=lambda s: s.order))
        self.pool.flush()

    def preempt(self, seq: Sequence) -> None:
        """`seq` gives its row and blocks back and waits in `preempted`; `resume` recomputes its K/V later from its
        tokens (prompt and output), so it continues exactly where it stopped."""
        self.policy.release(seq.slot, seq.drafting)
        self.release_blocks(seq)
        self.vacate(seq.slot)
        self.preempted.append(seq)
        self.preemptions += 1

    def resume(self) -> None:
        """Prefill preempted requests again, the earliest admitted first, while rows and blocks allow (one batched
        prefill of those with the first one's drafting)."""
        if not self.preempted:
            return
        waiting = sorted(self.preempted, key=lambda s: s.order)
        free, blocks, batch = self.slots.free(), self.pool.available(), []
        for seq in waiting:
            cost = self.pool.cost(seq.context(), self.first_positions(len(seq.context())), self.needs_context(seq))
            if len(batch) == len(free) or cost > blocks:
                break
            if seq.drafting == waiting[0].drafting:
                blocks -= cost
                batch.append(seq)
        if not batch:
            return
        for seq, slot in zip(batch, free):
            self.preempted.remove(seq)
            seq.slot = slot
            seq.prefilled = self.pool.admit(slot, seq.context(), self.first_positions(len(seq.context())),
                                            self.needs_context(seq))
        self.policy.admit([s.slot for s in batch], [len(s.context()) for s in batch])
        self.start(batch)
        for seq in batch:
            self.slots.running[seq.slot] = seq

    def advance_prefill(self) -> list[Sequence]:
        """One chunk (`max_num_tokens`) of the first staged prompt. After its last chunk it takes its reserved slot
        and decodes from this step. -> it, when its first token already finished it (nothing else reports it)."""
        if not self.staged:
            return []
        seq = self.staged[0]
        last = self.extend([seq], [min(len(seq.context()) - seq.prefilled, self.max_num_tokens)])
        if seq.prefilled < len(seq.context()):
            return []
        self.staged.pop(0)
        slot = next(s for s in range(self.slots.usable) if s not in self.slots.running)
        self.slots.reserved = len(self.staged)
        self.cache.move(self.staging_row, slot, seq.prefilled)
        self.proposer.move(self.staging_row, slot, seq.prefilled)
        self.pool.move(self.staging_row, slot)
        seq.slot = slot
        self.policy.admit([slot], [seq.prefilled])
        token = self.begin([seq], last).tolist()[0]  # a host read once per chunked prompt, as an admission's
        self.slots.running[slot] = seq
        now = time.perf_counter()
        seq.result.first_token_s = now
        self.emit(seq, [token], now)
        return [seq] if seq.done else []

    def release_blocks(self, seq: Sequence) -> None:
        """Free its blocks; with prefix caching, the full ones its tokens filled stay cached, with their drafter
        context (written first) when the request kept one; a plain-only request's serve plain-only requests."""
        keep, context = self.pool.prefix_caching and seq.start > 0, self.needs_context(seq)
        if keep and context:
            self.proposer.flush()
        self.pool.release(seq.slot, seq.tokens() if keep else None, context)

    def needs_context(self, seq: Sequence) -> bool:
        """Whether `seq`'s blocks carry the drafter's context (read from the cache, written for its own positions):
        a drafting request's do; a plain-only request's, or any request's of a target without a drafter, do not
        need one (without a drafter there is none to lack: every block counts as complete)."""
        return seq.drafting or not self.proposer.capture_layer_ids

    def settled(self, shape: tuple[int, int, int]) -> bool:
        """Whether a step at this padded shape (rows, width, key span) costs what a step costs: not one of its first
        `StepMode.settle_calls` since the allocation, which warm up and record its CUDA graphs (16-26 ms against
        2-3 ms steady on an H100, benchmarks/results/gpu_h100_policy/RUN.md). Only settled steps are fed to the
        cost policy's live correction, as calibration times only settled cells. Unpadded steps always are."""
        if self.step_mode.shapes is None:
            return True
        self.shape_calls[shape] += 1
        return self.shape_calls[shape] > self.step_mode.settle_calls

    def padded(self, n: int, k: int, keeping: bool) -> tuple[int, int]:
        """-> rows and tokens per row of this step's passes: n and k + 1, or rounded up to the step mode's buckets
        (rows past n are free slots, whose results are dropped; tokens past k + 1 are padding drafts).

        keeping False (no running request keeps the drafter's context): plain decoding's shape, one token per row.
        A plain step that keeps the context pads to `StepShapes.min_width` (2 under CUDA graphs: the drafting
        steps' graph, no extra one to compile); the one plain-only requests run alone does not, as plain
        decoding's engine does not. On an H100 under CUDA graphs, the built-in pair in float32, the padded plain
        step cost 1.07x / 1.60x / 0.92x plain decoding's at 1 / 4 / 16 rows (context 128): cuBLAS ran the
        4 x 2-token rows' GEMMs with kernels taking 2.5x the device time per step
        (benchmarks/results/gpu_h100_policy/plain_path/)."""
        shapes = self.step_mode.shapes
        if shapes is None:
            return n, k + 1
        width = shapes.width(k + 1, self.block) if keeping else shapes.width(1, 1)
        return shapes.rows(n, len(self.slots.starts)), width  # starts: usable + spare

    def own_draft_lengths(self, rows: int, k: int, width: int, mixed: bool) -> torch.Tensor | None:
        """[rows] long, each row's own draft length where it differs from the pass's width - 1 (None: it does not):
        plain-only rows draft 0 beside drafting ones, and padding drafts lie past k."""
        if mixed:
            return self.slots.drafting[:rows].long() * k
        if 0 < k < width - 1:  # (a plain step's padding token is dropped before `accept`: no lengths needed)
            return torch.full((rows,), k, dtype=torch.long, device=self.device)
        return None

    def draft(self, batch: StepBatch, running: list[Sequence], keeping: list[bool], k: int, drafts: int,
              mixed: bool):
        """-> drafts [rows, drafts] (k of them each row's own, the rest padding) and their probabilities or None.
        An eager mixed step runs the drafter over its drafting rows only (gathered); a compiled one over every
        row (one shape), whose plain-only rows draft from stale context what `accept` never takes."""
        if k == 0:  # a plain step: the drafter does not run (drafts > 0: padding tokens, dropped after the pass)
            return batch.anchors.new_zeros((len(batch.anchors), drafts)), None
        if mixed and not self.step_mode.compiled:
            return self.propose(batch, running, keeping, drafts)
        return self.proposer.propose(batch, drafts)

    @staticmethod
    def read_tokens(drafts, num_accepted, bonus) -> tuple[list[list[int]], list[int], list[int]]:
        """The step's one device read (the host sync of a step): drafts [B, k], num_accepted [B], bonus [B]
        copied as one [B, k + 2] tensor -> host lists."""
        rows = torch.cat([drafts, num_accepted[:, None], bonus[:, None]], dim=1).tolist()
        return [row[:-2] for row in rows], [row[-2] for row in rows], [row[-1] for row in rows]

    def compact(self, running: list[Sequence]) -> list[Sequence]:
        """Move the requests in the highest slots into the free slots below n = len(running), so the n running
        requests hold slots 0..n-1 and a step reads every cache in place. A free slot among running ones (a
        request finished or was cancelled, and no newcomer took its slot) otherwise made every step gather the
        running rows' whole caches: on the built-in pair at 1024 tokens, batch 8, one free slot made a plain step
        1.7-1.9x slower (`benchmarks/results/slot_holes.json`); a move copies one request's caches once. Device copies
        only; the same on every tensor-parallel rank (their running slots are the same). -> running, in slot
        order."""
        n = len(running)
        holes = [slot for slot in range(n) if slot not in self.slots.running]
        movers = [seq for seq in reversed(running) if seq.slot >= n]  # from the highest slot down
        for seq, dst in zip(movers, holes):
            self.move(seq, dst)
        return [self.slots.running[slot] for slot in range(n)]

    def move(self, seq: Sequence, dst: int) -> None:
        """`seq` leaves its slot for the free slot dst, with everything kept per slot."""
        src, length = seq.slot, seq.start + 1  # committed positions 0..start-1, and the anchor's
        self.cache.move(src, dst, length)
        self.proposer.move(src, dst, length)  # deferred context first: it is written through src's table row
        self.pool.move(src, dst)
        for per_slot in (self.slots.starts, self.slots.anchors, self.slots.steps, self.slots.drafting):
            per_slot[dst] = per_slot[src]
        self.slots.sampling.move(src, dst)
        self.policy.move(src, dst)
        self.vacate(src)
        self.slots.running[dst], seq.slot = seq, dst

    def propose(self, batch: StepBatch, running: list[Sequence], keeping: list[bool], num_drafts: int):
        """A drafting step with plain-only rows among its rows: the drafter runs the rows that keep its context
        (it has none for the others), and the plain-only rows verify padding (drafts 0, probabilities 0) that
        `accept` never takes, so each gets exactly a plain step's token. -> drafts [B, num_drafts], probabilities
        [B, num_drafts, V] or None. The verify costs every row num_drafts + 1 tokens: the cost model's price of a
        step of B rows. The drafter reads the drafting rows' context gathered (a copy of those rows' drafter
        context K/V)."""
        rows = [seq for seq, kept in zip(running, keeping) if kept]
        index = self.drafting_rows(keeping)
        sampling = self.slots.sampling.rows(index, [seq.request.sampling for seq in rows])
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

    def drafting_rows(self, keeping: list[bool]) -> torch.Tensor:
        """[D] the rows of the requests that keep the drafter's context, which are their slots (rows 0..B-1 hold
        slots 0..B-1); D counted on the host, so no device sync."""
        return torch.nonzero_static(self.slots.drafting[: len(keeping)], size=sum(keeping))[:, 0]

    def hold(self, sequences: list[Sequence], length: int) -> None:
        """Pin sequences at committed length `length` with no output yet. For calibration: a step then
        costs what it costs at that context (the cache holds junk there, which attends the same)."""
        for seq in sequences:
            if not self.pool.grow(seq.slot, self.first_positions(length)):
                raise DFlashError(f"the KV pool ({self.pool.num_blocks} blocks) cannot hold {len(sequences)} "
                                  f"requests at {length} tokens")
        self.pool.flush()
        slots = torch.tensor([s.slot for s in sequences], device=self.device)
        self.slots.starts[slots] = length
        for seq in sequences:
            seq.start = length
            seq.result.output_ids.clear()

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
        """Every admitted request not finished: running, or preempted and waiting to resume."""
        return list(self.slots.running.values()) + self.preempted + self.staged

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
            self.policy.release(seq.slot, seq.drafting)
            self.release_blocks(seq)
            self.vacate(seq.slot)
        elif seq in self.preempted:
            self.preempted.remove(seq)
        elif seq in self.staged:
            self.staged.remove(seq)
            self.slots.reserved = len(self.staged)
            self.pool.release(seq.slot)
            self.proposer.release(seq.slot)  # its chunks' deferred context is never written

    def vacate(self, slot: int) -> None:
        """The slot is free: its committed length 0, so a padded step's row there writes positions 0.. (a device
        write, no sync)."""
        del self.slots.running[slot]
        self.slots.starts[slot] = 0
        self.proposer.release(slot)
