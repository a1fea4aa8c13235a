"""The host side of the paged KV cache: which pool blocks each row holds, and the prefix cache.

A request holds the blocks of its positions 0.. in order (`BlockTable` on the device mirrors them). Blocks are
reference-counted: a full block of a finished (or preempted) request is kept in the prefix cache under a hash of its
tokens and every token before it, and a later request whose prompt starts with those tokens takes it instead of
prefilling them. A block holds the target's K/V and, when its request kept one, the drafter's context for the same
positions; a block without that context (a plain-only request's) serves only requests that need none (plain-only
ones), and a drafting request's copy of the same tokens replaces it in the cache. Free blocks wait in
least-recently-used order; allocation takes uncached ones first, then evicts the least recently used cached one (vLLM's
`BlockPool`/`FreeKVCacheBlockQueue`, vllm/v1/core/block_pool.py at v0.8; TensorRT-LLM's `KVCacheManager` block
reuse).
"""

from __future__ import annotations

from collections import OrderedDict

from .kv_cache import BLOCK, BlockTable, blocks_for


def default_blocks(num_slots: int, positions: int) -> int:
    """A pool sized by no memory budget: every slot can hold positions 0..positions (a pass's spare key included)."""
    return num_slots * blocks_for(positions + 1)


def block_hashes(tokens: list[int]) -> list[int]:
    """Chained hashes of the full blocks of `tokens`: hash i names tokens 0 .. (i + 1) * BLOCK - 1."""
    hashes, parent = [], None
    for i in range(len(tokens) // BLOCK):
        parent = hash((parent, tuple(tokens[i * BLOCK: (i + 1) * BLOCK])))
        hashes.append(parent)
    return hashes


class BlockPool:
    """Allocates and frees the pool's blocks for rows; keeps full blocks of finished requests for prefix reuse."""

    def __init__(self, table: BlockTable, prefix_caching: bool = True):
        self.table, self.prefix_caching = table, prefix_caching
        self.num_blocks = table.num_blocks
        self.refs = [0] * self.num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(self.num_blocks))  # LRU first
        self.hash_of: dict[int, int] = {}  # cached block -> its hash
        self.without_context: set[int] = set()  # cached blocks whose drafter context was never written
        self.cached: dict[int, int] = {}  # hash -> cached block
        self.rows: dict[int, list[int]] = {}  # row -> its blocks, in position order
        self.updates: tuple[list[int], list[int], list[int]] = ([], [], [])  # table entries not yet on the device
        self.hit_tokens = self.queried_tokens = self.hit_requests = self.queried_requests = 0

    # -- queries
    def available(self) -> int:
        """Blocks an allocation can take now (free ones, cached ones included: they are evicted on demand)."""
        return len(self.free)

    def used(self) -> int:
        return self.num_blocks - len(self.free)

    def match(self, tokens: list[int], context: bool = True) -> list[int]:
        """The cached blocks of the longest cached prefix of `tokens`, at most all but its last token (a prefill
        needs one token to run: the last one's logits). context: the request needs the drafter's context of the
        prefix (it drafts), so the prefix ends at the first block without one."""
        if not self.prefix_caching:
            return []
        blocks = []
        for h in block_hashes(tokens[: len(tokens) - 1]):
            block = self.cached.get(h)
            if block is None or (context and block in self.without_context):
                break
            blocks.append(block)
        return blocks

    def cost(self, tokens: list[int], positions: int, context: bool = True) -> int:
        """Blocks a new row holding `positions` positions whose first tokens are `tokens` takes from the free ones.
        Never more with context=False (more hits, each taking at most the block it saves)."""
        hits = self.match(tokens, context)
        return blocks_for(positions) - len(hits) + sum(1 for b in hits if self.refs[b] == 0)

    # -- a row's life
    def admit(self, row: int, tokens: list[int], positions: int, context: bool = True) -> int:
        """Give `row` the blocks of its first `positions` positions, reusing cached ones for a prefix of `tokens`
        (with the drafter's context, when `context`); -> the positions reused (a multiple of BLOCK). The caller
        checked `cost` against `available`."""
        hits = self.match(tokens, context)
        for b in hits:
            self.take(b, hit=True)
        self.rows[row] = []
        self.assign(row, hits)
        self.grow(row, positions)
        self.queried_requests += 1
        self.queried_tokens += len(tokens)
        self.hit_requests += bool(hits)
        self.hit_tokens += len(hits) * BLOCK
        return len(hits) * BLOCK

    def grow(self, row: int, positions: int) -> bool:
        """Make `row` hold blocks for positions 0..positions-1; False (nothing taken) when too few are free."""
        need = blocks_for(positions) - len(self.rows[row])
        if need <= 0:
            return True
        if need > len(self.free):
            return False
        self.assign(row, [self.take(next(iter(self.free))) for _ in range(need)])
        return True

    def release(self, row: int, tokens: list[int] | None = None, context: bool = True) -> None:
        """`row` ends; tokens: what its first positions hold (their K/V written): its full blocks among them stay
        cached for reuse. context: their drafter context is written too (False: a plain-only request's). None:
        nothing is kept."""
        blocks = self.rows.pop(row)
        if tokens is not None and self.prefix_caching:
            for block, h in zip(blocks, block_hashes(tokens)):
                if block in self.hash_of:  # a hit it took: cached already
                    continue
                held = self.cached.get(h)
                if held is None or (context and held in self.without_context):
                    if held is not None:  # the same tokens without the drafter's context: this copy serves more
                        self.uncache(held)
                    self.cached[h], self.hash_of[block] = block, h
                    if not context:
                        self.without_context.add(block)
        for block in reversed(blocks):  # a chain's tail is evicted before its head
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free[block] = None
                if block not in self.hash_of:  # uncached: taken first
                    self.free.move_to_end(block, last=False)
        self.table_clear(row)

    def move(self, src: int, dst: int) -> None:
        self.rows[dst] = self.rows.pop(src)
        self.flush()
        self.table.move(src, dst)

    # -- internals
    def take(self, block: int, hit: bool = False) -> int:
        """One more holder of `block`; hit: taken for the prefix it caches (kept cached), else as a fresh block
        (its cached prefix, if any, is evicted)."""
        if self.refs[block] == 0:
            del self.free[block]
            h = self.hash_of.get(block)
            if h is not None and not hit:
                self.evict(block, h)
        self.refs[block] += 1
        return block

    def evict(self, block: int, h: int) -> None:
        del self.hash_of[block]
        del self.cached[h]
        self.without_context.discard(block)

    def uncache(self, block: int) -> None:
        """`block` leaves the prefix cache; free, it is taken first (as an uncached block is)."""
        self.evict(block, self.hash_of[block])
        if self.refs[block] == 0:
            self.free.move_to_end(block, last=False)

    def assign(self, row: int, blocks: list[int]) -> None:
        held = self.rows[row]
        rows, cols, ids = self.updates
        for b in blocks:
            rows.append(row)
            cols.append(len(held))
            ids.append(b)
            held.append(b)

    def table_clear(self, row: int) -> None:
        self.flush()
        self.table.clear(row)

    def flush(self) -> None:
        """Copy the pending table entries to the device (before a pass reads them)."""
        rows, cols, ids = self.updates
        self.table.set(rows, cols, ids)
        self.updates = ([], [], [])

    def stats(self) -> dict[str, int]:
        return {"blocks": self.num_blocks, "used": self.used(), "hit_tokens": self.hit_tokens,
                "queried_tokens": self.queried_tokens, "hit_requests": self.hit_requests,
                "queried_requests": self.queried_requests}
