"""The generator's KV memory: the target's and the drafter's caches, the block table they share, the pool of
blocks each row holds and the per-slot device state. It allocates them once, gives rows blocks and takes them
back, and moves a request between rows (compaction)."""

from __future__ import annotations

import logging

import torch

from ..cache.block_pool import BlockPool, default_blocks
from ..cache.kv_cache import BLOCK, BlockTable
from ..compilation.step_mode import StepMode
from ..draft_length.policy import DraftLenPolicy
from ..models.target import TargetModel
from ..sample.sampling import SamplingBatch, SamplingParams
from ..speculative.base import Proposer
from ..utils.errors import DFlashError
from .sequence import Sequence, Slots

log = logging.getLogger(__name__)


class CacheManager:
    """Rows (slots) of the caches and the pool blocks behind them. `policy` is the generator's draft-length policy,
    which keeps per-slot state of its own (moved with a request)."""

    def __init__(self, target: TargetModel, proposer: Proposer, device: torch.device):
        self.target, self.proposer, self.device = target, proposer, device
        self.cache = None  # the target's KV cache (paged: kv_cache.py)
        self.table: BlockTable | None = None  # the block table the target's and the drafter's caches share
        self.pool: BlockPool | None = None  # which blocks each row holds (host side)
        self.slots: Slots | None = None
        self.bytes_per_block = 0
        self.staging_row: int | None = None  # the cache row chunked prefills run in (one beyond the slots)
        self.refused_prefix_reuse = False
        self.block = proposer.max_block_size
        self.capacity = 0  # positions a request may reach (validated against; the caches may hold more)
        self.policy: DraftLenPolicy | None = None

    @torch.inference_mode(False)
    def allocate(self, num_slots: int, capacity: int, block: int, num_blocks: int | None, mode: StepMode, *,
                 prefix_caching: bool, max_num_tokens: int | None, kv_cache_bytes: int | None) -> None:
        """Caches for `num_slots` sequences of up to `capacity` positions (prompt + output + block).
        Normal tensors, never inference tensors, whether or not the caller is in inference mode (`generate` is):
        steps update them in place either way, and a compiled pass would take the two kinds for different inputs
        (a recompilation). num_blocks: the pool's blocks of kv_cache.BLOCK positions (None: `kv_cache_bytes`'
        worth, else enough for every slot at `capacity`). Compiled steps keep caches of at least 2 slots (the
        second one unused when num_slots is 1): a size of 1 is specialised, so one slot would need graphs of its
        own; padded steps whose buckets start at 2 rows (`StepShapes.min_rows`) keep per-slot state for that spare
        slot too, which only padding rows use. Padded steps' caches hold `capacity` rounded up to
        `StepShapes.align` positions (requests are still validated against `capacity`)."""
        shapes = mode.shapes
        rows = max(num_slots, shapes.min_rows if shapes is not None else 1)  # per-slot state: usable + spare
        cache_slots = max(rows, 2) if mode.compiled else rows
        positions = shapes.capacity(capacity) if shapes is not None else capacity  # padded: aligned key spans
        self.bytes_per_block = self.block_bytes()
        if num_blocks is None and kv_cache_bytes is not None and self.bytes_per_block:  # 0: nothing paged
            num_blocks = max(1, kv_cache_bytes // self.bytes_per_block)
        if num_blocks is None:
            num_blocks = default_blocks(num_slots, positions)
        self.staging_row = cache_slots if max_num_tokens is not None else None
        cache_rows = cache_slots + (self.staging_row is not None)
        self.table = BlockTable(cache_rows, positions, num_blocks, self.device)
        step_tokens = max(block, max_num_tokens or 0)  # a chunk is a cached pass too (window rings)
        self.cache = self.target.new_cache(cache_rows, positions, step_tokens, table=self.table)
        self.proposer.table = self.table
        self.proposer.allocate(cache_rows, positions)
        self.pool = BlockPool(self.table, prefix_caching=prefix_caching and self.reusable())
        mode.caches(self.cache.tensors() + self.proposer.tensors())
        zeros = torch.zeros(rows, dtype=torch.long, device=self.device)
        steps = zeros.clone()
        table = SamplingBatch.of([SamplingParams()] * rows, [0] * rows, steps)
        drafting = torch.zeros(rows, dtype=torch.bool, device=self.device)
        self.slots = Slots(zeros, zeros.clone(), steps, table, drafting, num_slots)
        self.block, self.capacity = block, capacity

    def block_bytes(self) -> int:
        """Bytes of one pool block of the target's and the drafter's caches (measured on caches of one block)."""
        target = self.target.new_cache(1, BLOCK - 1)
        self.proposer.table = None
        self.proposer.allocate(1, BLOCK - 1)
        return sum(cache.block_bytes() for cache in (target, getattr(self.proposer, "cache", None))
                   if hasattr(cache, "block_bytes"))

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

    # -- blocks
    def first_positions(self, tokens: int) -> int:
        """Positions a request of `tokens` committed tokens holds to run a step: them, the anchor and a block."""
        return tokens + self.block + 1

    def needs_context(self, seq: Sequence) -> bool:
        """Whether `seq`'s blocks carry the drafter's context (read from the cache, written for its own positions):
        a drafting request's do; a plain-only request's, or any request's of a target without a drafter, do not
        need one (without a drafter there is none to lack: every block counts as complete)."""
        return seq.drafting or not self.proposer.capture_layer_ids

    def cost(self, tokens: list[int], context: bool = True) -> int:
        """Blocks a row prefilled with `tokens` (and holding a first step) takes from the free ones now."""
        return self.pool.cost(tokens, self.first_positions(len(tokens)), context)

    def claim(self, seq: Sequence, tokens: list[int]) -> int:
        """`seq`'s row takes the blocks of `tokens` and a first step. -> positions found in the prefix cache."""
        return self.pool.admit(seq.slot, tokens, self.first_positions(len(tokens)), self.needs_context(seq))

    def grow(self, seq: Sequence) -> bool:
        """`seq`'s row holds blocks for its next step (-> False: the pool cannot give them now)."""
        return self.pool.grow(seq.slot, self.first_positions(seq.start))

    def free(self, seq: Sequence) -> None:
        """A running `seq` gives its row and blocks back (finished or preempted)."""
        self.policy.release(seq.slot, seq.drafting)
        self.release_blocks(seq)
        self.vacate(seq.slot)

    def release_blocks(self, seq: Sequence) -> None:
        """Free its blocks; with prefix caching, the full ones its tokens filled stay cached, with their drafter
        context (written first) when the request kept one; a plain-only request's serve plain-only requests."""
        keep, context = self.pool.prefix_caching and seq.start > 0, self.needs_context(seq)
        if keep and context:
            self.proposer.flush()
        self.pool.release(seq.slot, seq.tokens() if keep else None, context)

    def unstage(self, seq: Sequence) -> None:
        """A staged request gives the staging row back: its blocks only (its chunks' deferred context is never
        written)."""
        self.pool.release(seq.slot)
        self.proposer.release(seq.slot)

    def vacate(self, slot: int) -> None:
        """The slot is free: its committed length 0, so a padded step's row there writes positions 0.. (a device
        write, no sync)."""
        del self.slots.running[slot]
        self.slots.starts[slot] = 0
        self.proposer.release(slot)

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

    # -- rows
    def settle(self, seq: Sequence, slot: int) -> None:
        """A staged request's prefilled caches leave the staging row for its own `slot`."""
        self.cache.move(self.staging_row, slot, seq.prefilled)
        self.proposer.move(self.staging_row, slot, seq.prefilled)
        self.pool.move(self.staging_row, slot)
        seq.slot = slot

    def compact(self, running: list[Sequence]) -> list[Sequence]:
        """Move the requests in the highest slots into the free slots below n = len(running), so the n running
        requests hold slots 0..n-1 and a step reads every cache in place. A free slot among running ones (a
        request finished or was cancelled, and no newcomer took its slot) otherwise made every step gather the
        running rows' whole caches (`benchmarks/results/slot_holes.json`); a move copies one request's caches
        once. Device copies only; the same on every tensor-parallel rank (their running slots are the same).
        -> running, in slot order."""
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
