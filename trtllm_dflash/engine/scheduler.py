"""Which requests hold rows and KV blocks: admission, preemption and resumption, and chunked prefill.

A request is admitted when the pool can hold its prompt and a first step; a running one that cannot grow is
preempted (its blocks freed) and recomputed later from its tokens, before any newcomer. A prompt longer than
`max_num_tokens` is staged: prefilled a chunk a step in the staging row, then moved into a slot it reserved.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..cache.kv_cache import blocks_for
from ..draft_length.policy import DraftLenPolicy
from ..utils.errors import DFlashError
from .cache_manager import CacheManager
from .request import Request
from .runner import Runner
from .sequence import Sequence, batch_view


class Scheduler:
    """Places requests in rows and blocks between steps. `policy` is the generator's draft-length policy (told
    of each placement)."""

    def __init__(self, caches: CacheManager, runner: Runner):
        self.caches, self.runner = caches, runner
        self.policy: DraftLenPolicy | None = None
        self.preempted: list[Sequence] = []  # preempted requests, resumed (recomputed) first when blocks free up
        self.staged: list[Sequence] = []  # long prompts being prefilled in chunks, in the staging row, in order
        self.preemptions = 0
        self.admitted = 0
        self.max_num_tokens: int | None = None  # longer prompts are prefilled in chunks of this many

    def drafts_for(self, requests: list[Request], new_slots: list[int]) -> bool:
        """Whether newcomers keep the drafter's context: the policy's `drafts_for` on the batch these requests
        join in `new_slots`."""
        if self.caches.block == 1:
            return True
        running = list(self.caches.slots.running.values())
        return self.policy.drafts_for(batch_view(running, self.caches.block, requests, new_slots))

    def next_draft_len(self, running: list[Sequence]) -> tuple[int, list[Sequence]]:
        """-> the policy's draft length for the next step of `running` (0..block - 1), and the requests that keep the
        drafter's context but should become plain-only before this plain step (`keeps_context`). Plain-only
        requests draft nothing in a drafting step (see `Runner.propose`)."""
        if not any(s.drafting for s in running):  # plain-only requests alone: nothing to choose or keep
            return 0, []
        view = batch_view(running, self.caches.block)
        k = max(0, min(self.policy.choose(view), self.caches.block - 1))
        if k == 0 and self.caches.block > 1:
            keep = self.policy.keeps_context(view)
            return k, [seq for seq, kept in zip(running, keep) if seq.drafting and not kept]
        return k, []

    def reset(self) -> None:
        """A new allocation: nothing waits, nothing is staged."""
        self.preempted, self.staged, self.preemptions, self.admitted = [], [], 0, 0

    def live(self) -> list[Sequence]:
        """Every admitted request not finished: running, or preempted and waiting to resume, or staged."""
        return list(self.caches.slots.running.values()) + self.preempted + self.staged

    def chunked(self, request: Request) -> bool:
        """Whether the request's prompt is prefilled in chunks of `max_num_tokens`, between steps (staged)."""
        return self.max_num_tokens is not None and len(request.prompt_ids) > self.max_num_tokens

    # -- admission
    def validate(self, request: Request) -> None:
        """Raise unless the request fits this allocation: its tokens, and its prompt, output and a block in a row and
        in the pool."""
        caches, cfg = self.caches, self.caches.target.config
        request.validate(cfg.vocab_size, cfg.max_position_embeddings)
        asked = f"prompt length {len(request.prompt_ids)} + max_new_tokens {request.max_new_tokens}"
        need = len(request.prompt_ids) + request.max_new_tokens + caches.block + 1
        if need > caches.capacity:
            raise DFlashError(f"{asked} exceeds this engine's sequence capacity {caches.capacity - caches.block - 1}")
        if blocks_for(need) > caches.pool.num_blocks:
            raise DFlashError(f"{asked} needs {blocks_for(need)} KV blocks but the pool holds {caches.pool.num_blocks}")

    def check_admission(self, requests: list[Request]) -> None:
        """Raise unless `Generator.admit` can take every one of `requests` now (valid, free slots and blocks)."""
        for r in requests:
            self.validate(r)
        free, pool = self.caches.slots.free(), self.caches.pool
        if len(requests) > len(free):
            raise DFlashError(f"{len(requests)} requests but only {len(free)} free slots")
        if self.admissible(requests) < len(requests):
            raise DFlashError(f"{len(requests)} requests but the KV pool has only {pool.available()} free blocks "
                              f"(of {pool.num_blocks})")

    def fit(self, candidates: Iterable[tuple[float, bool]], rows: int) -> list[int]:
        """The block-cost loop: the indices of the candidates placed, in order, while there are free rows (at most
        `rows`) and the pool's free blocks hold each one's cost. candidates: (blocks, placed) each, read lazily; the
        first that does not fit ends the loop, placed or not (placed False: skipped, its blocks not counted)."""
        blocks, taken = self.caches.pool.available(), []
        for i, (cost, placed) in enumerate(candidates):
            if len(taken) == rows or cost > blocks:
                break
            if placed:
                blocks -= cost
                taken.append(i)
        return taken

    def admissible(self, requests: list[Request]) -> int:
        """How many of `requests`, in order, `admit` can take now: free rows and free blocks for each one's prompt
        and first step (none while a preempted request waits to resume: it goes first)."""
        if self.preempted:
            return 0

        def costs():  # as if drafting (decided in `admit`): a plain-only one costs no more
            staging = bool(self.staged)
            for r in requests:  # one staged prompt at a time: a second long one waits
                chunked = self.chunked(r)
                yield (math.inf if chunked and staging else self.caches.cost(list(r.prompt_ids))), True
                staging = staging or chunked

        return len(self.fit(costs(), len(self.caches.slots.free())))

    def place(self, sequences: list[Sequence]) -> list[Sequence]:
        """New sequences take their rows' blocks (their slots, or the staging row for a long prompt, staged);
        -> those that decode from the next step, prefilled (their first tokens: `Runner.start`, in order)."""
        for seq in sequences:
            seq.order, self.admitted = self.admitted, self.admitted + 1
            seq.prefilled = self.caches.claim(seq, list(seq.request.prompt_ids))
        running = [s for s in sequences if s.slot != self.caches.staging_row]
        self.staged += [s for s in sequences if s.slot == self.caches.staging_row]
        self.caches.slots.reserved = len(self.staged)
        return running

    def start(self, sequences: list[Sequence], contexts: list[int]) -> list[int]:
        """Prefill placed sequences of these context lengths into their slots: they run from the next step.
        -> each one's first token."""
        self.policy.admit([s.slot for s in sequences], contexts)  # acceptance from their context's rates
        first = self.runner.start(sequences)
        for seq in sequences:
            self.caches.slots.running[seq.slot] = seq
        return first

    # -- preemption
    def reserve(self) -> None:
        """Every running request holds blocks for its next step: the anchor and a block past its committed tokens.
        While the pool cannot hold them, the latest admitted request is preempted (`Generator.validate` made sure
        that one request alone always fits)."""
        running = self.caches.slots.running
        for seq in sorted(running.values(), key=lambda s: s.order):
            while running.get(seq.slot) is seq and not self.caches.grow(seq):
                self.preempt(max(running.values(), key=lambda s: s.order))
        self.caches.pool.flush()

    def preempt(self, seq: Sequence) -> None:
        """`seq` gives its row and blocks back and waits in `preempted`; `resume` recomputes its K/V later from its
        tokens (prompt and output), so it continues exactly where it stopped."""
        self.caches.free(seq)
        self.preempted.append(seq)
        self.preemptions += 1

    def resume(self) -> None:
        """Prefill preempted requests again, the earliest admitted first, while rows and blocks allow (one batched
        prefill of those with the first one's drafting)."""
        if not self.preempted:
            return
        waiting, free = sorted(self.preempted, key=lambda s: s.order), self.caches.slots.free()
        costs = ((self.caches.cost(s.context(), self.caches.needs_context(s)), s.drafting == waiting[0].drafting)
                 for s in waiting)
        batch = [waiting[i] for i in self.fit(costs, len(free))]
        if not batch:
            return
        for seq, slot in zip(batch, free):
            self.preempted.remove(seq)
            seq.slot = slot
            seq.prefilled = self.caches.claim(seq, seq.context())
        self.start(batch, [len(s.context()) for s in batch])

    # -- chunked prefill
    def advance_prefill(self) -> tuple[Sequence, int] | None:
        """One chunk (`max_num_tokens`) of the first staged prompt. After its last chunk it takes its reserved slot
        and decodes from this step. -> it and its first token, after its last chunk."""
        if not self.staged:
            return None
        seq = self.staged[0]
        last = self.runner.prefill([seq], [min(len(seq.context()) - seq.prefilled, self.max_num_tokens)])
        if seq.prefilled < len(seq.context()):
            return None
        self.staged.pop(0)
        running = self.caches.slots.running
        slot = next(s for s in range(self.caches.slots.usable) if s not in running)
        self.caches.slots.reserved = len(self.staged)
        self.caches.settle(seq, slot)
        self.policy.admit([slot], [seq.prefilled])
        token = self.runner.begin([seq], last).tolist()[0]  # a host read once per chunked prompt, as an admission's
        running[slot] = seq
        return seq, token

    def drop(self, seq: Sequence) -> None:
        """A preempted or staged `seq` ends (cancelled) without running again."""
        if seq in self.preempted:
            self.preempted.remove(seq)
        elif seq in self.staged:
            self.staged.remove(seq)
            self.caches.slots.reserved = len(self.staged)
            self.caches.unstage(seq)
