"""Paged caches that attention reads through a block table.

Full-attention K/V live in a pool of fixed-size blocks of BLOCK positions shared by every request; a block table
maps each row's (slot's) logical block i = position // BLOCK to a pool block. Layers declare a `LayerCacheSpec`:
- "full": paged. Every full layer shares one pool per K and V, [L_full, N + 1, BLOCK, H_kv, D]: position-major
  inside a block, the paged layout of FlashAttention's and vLLM's kernels ([num_blocks, block_size, H_kv, D]), so a
  row's gathered blocks are its keys [nb * BLOCK, H_kv, D] as a view, with no second copy. Pool block N is the null
  block: every table entry no request owns points at it, so padded writes (free rows of a padded step, a prompt's
  right padding past its blocks) land there harmlessly and reads of it are never visible (keys past a row's queries
  are masked). Rolling back to an accepted length is just a smaller length: entries past it are never visible (see
  models/attention.py) and are rewritten before they are read.
  On CUDA, cached-mode attention reads the blocks in place through the table (trtllm_dflash/plugins/paged_attention); `FullKV.view`'s
  gather is the CPU's path and the prefill's.
- "window": a ring per row of R = window + max_step_tokens - 1 entries, index = position % R, so memory is
  bounded by the window and the rows, not the context. R keeps every key a later query can see even when a whole
  verified block is rejected (a rejected entry can only shadow a position at least window + 1 behind every later
  query). Prefill writes only each row's last R real positions; the others go to a spare entry R, never read.
The table ([S, M + 2] int32, M blocks per row and two last columns always null) and the pools are fixed tensors
written in place, so compiled and CUDA-graph steps keep static addresses. Which blocks a row holds is decided on
the host (paging.py); the table is the device copy. Recurrent (linear-attention) layers keep their state per row,
in state_cache.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

KINDS = ("full", "window")
BLOCK = 16  # positions per pool block (vLLM's and TensorRT-LLM's default tokens_per_block)


def blocks_for(positions: int) -> int:
    return -(-positions // BLOCK)


@dataclass(frozen=True)
class LayerCacheSpec:
    kind: str = "full"
    window: int | None = None  # "window" layers: the attention window in positions

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"cache kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "window" and not (self.window and self.window > 0):
            raise ValueError(f"a window cache needs a positive window, got {self.window!r}")


class BlockTable:
    """Rows' block tables on the device: table [S, M + 2] int32, entry (row, i) the pool block of the row's
    positions i * BLOCK .. (i + 1) * BLOCK - 1; `null` (= num_blocks) where the row holds none. Shared by the
    target's and the drafter's caches of one generator (their pools have the same number of blocks)."""

    def __init__(self, num_rows: int, capacity: int, num_blocks: int, device):
        self.capacity, self.num_blocks, self.null = capacity, num_blocks, num_blocks
        self.max_blocks = blocks_for(capacity + 1)  # positions 0..capacity (a pass's spare key included)
        # two null columns past max_blocks: FullKV.view reads up to kv_len // BLOCK + 2 blocks
        self.table = torch.full((num_rows, self.max_blocks + 2), num_blocks, dtype=torch.int32, device=device)

    @classmethod
    def contiguous(cls, num_rows: int, capacity: int, device) -> BlockTable:
        """Every row owns max_blocks blocks for good: a cache for one-off passes and tests, no pool manager."""
        per_row = blocks_for(capacity + 1)
        table = cls(num_rows, capacity, num_rows * per_row, device)
        table.table[:, :per_row] = torch.arange(num_rows * per_row, dtype=torch.int32, device=device).view(num_rows, -1)
        return table

    def set(self, rows: list[int], cols: list[int], blocks: list[int]) -> None:
        """Point the given (row, col) entries at `blocks`. A step's few (a row growing by a block every BLOCK
        tokens) are scalar fills, device writes with no host data to copy; an admission's many are one copy."""
        if len(rows) <= 8:
            for row, col, block in zip(rows, cols, blocks):
                self.table[row, col] = block
        else:
            device = self.table.device
            index = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))
            self.table[index] = torch.tensor(blocks, dtype=torch.int32, device=device)

    def clear(self, row: int) -> None:
        self.table[row] = self.null

    def move(self, src: int, dst: int) -> None:
        self.table[dst] = self.table[src]
        self.table[src] = self.null

    def locate(self, rows: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """rows [B] or [B, 1], positions [B, T] -> pool block [B, T] long and offset in it [B, T]."""
        rows = rows if rows.dim() == positions.dim() else rows[:, None]
        # positions past the table (a padded row's junk) read the last column: the null block. The bound is the
        # table's shape, not a Python int, so a compiled pass needs no guard on it (a new allocation recompiles nothing)
        last = self.table.shape[1] - 1
        return self.table[rows, (positions // BLOCK).clamp(max=last)].long(), positions % BLOCK


class FullKV:
    """K/V of one full-attention layer: k, v [N + 1, BLOCK, H_kv, D] (views of the shared pools) read through
    the block table."""

    kind = "full"

    def __init__(self, k: Tensor, v: Tensor, table: BlockTable):
        self.k, self.v, self.table = k, v, table

    def write(self, ctx, k: Tensor, v: Tensor) -> None:
        # k, v: [B, T, H_kv, D] at ctx.positions [B, T] of rows ctx.slots [B]; a cache is state,
        # never differentiated through (training passes context K/V explicitly)
        blocks, offsets = ctx.once("locate", lambda: self.table.locate(ctx.slots, ctx.positions))
        self.k[blocks, offsets] = k.detach()  # index result: [B, T, H_kv, D]
        self.v[blocks, offsets] = v.detach()

    def view(self, ctx, rows: slice | Tensor, kv_len: int) -> tuple[Tensor, Tensor]:
        # -> k, v [B, H_kv, kv_len, D], gathered from the rows' blocks (one copy; the transpose is a view)
        # kv_len // BLOCK + 2 blocks (the table's last two columns are null, so they exist): at least two, and
        # always more positions than kv_len, so one compiled graph serves every kv_len (with blocks_for(kv_len) a
        # one-block span and a whole number of blocks would each specialise, compiled at a request's step). The
        # price: one or two blocks per row read past the span, never visible (keys past kv_len are sliced off).
        # [B, nb], read once per forward: every full layer of a cache shares its one table (a string key, not the
        # table's id: a compiled pass would guard on that object and recompile for every new allocation)
        blocks = ctx.once("blocks", lambda: self.table.table[rows, : kv_len // BLOCK + 2].long())
        return self.gather(self.k, blocks, kv_len), self.gather(self.v, blocks, kv_len)

    @staticmethod
    def gather(pool: Tensor, blocks: Tensor, kv_len: int) -> Tensor:
        # index_select, not pool[blocks]: several times faster for the same copy on a CPU
        # (benchmarks/results/paged_vs_slot.json)
        b, nb = blocks.shape
        x = pool.index_select(0, blocks.flatten())  # [B * nb, BLOCK, H_kv, D]
        return x.view(b, nb * BLOCK, *x.shape[-2:])[:, :kv_len].transpose(1, 2)

    def key_positions(self, ctx) -> Tensor:
        return ctx.keys[None]  # [1, kv_len]


class WindowKV:
    """K/V of one sliding-window layer in a ring per row: k, v [S, H_kv, R + 1, D]; entry R is a spare."""

    kind = "window"

    def __init__(self, k: Tensor, v: Tensor):
        self.k, self.v = k, v
        self.ring = k.shape[2] - 1

    def write(self, ctx, k: Tensor, v: Tensor) -> None:
        index = ctx.positions % self.ring
        if ctx.lengths is not None:  # prefill: keep each row's last `ring` real positions only
            length = ctx.lengths[:, None]
            keep = (ctx.positions < length) & (ctx.positions >= length - self.ring)
            index = torch.where(keep, index, self.ring)
        self.k[ctx.slots[:, None], :, index] = k.detach()
        self.v[ctx.slots[:, None], :, index] = v.detach()

    def view(self, ctx, rows: slice | Tensor, kv_len: int) -> tuple[Tensor, Tensor]:
        return self.k[rows, :, : self.ring], self.v[rows, :, : self.ring]

    def key_positions(self, ctx) -> Tensor:
        # entry i holds the latest position <= the row's last query position that is i mod R: [B, R]
        last = ctx.positions[:, -1:]
        return last - (last - torch.arange(self.ring, device=last.device)) % self.ring


class KVCache:
    """The caches of every layer of one model: full layers paged in a pool of `table.num_blocks` blocks (without
    a table, one of its own where every row owns `capacity` positions), window layers a ring per row."""

    def __init__(self, specs: list[LayerCacheSpec], num_slots: int, num_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, max_step_tokens: int = 1,
                 table: BlockTable | None = None, v_head_dim: int | None = None):
        """v_head_dim: V's width when it differs from K's (multi-head latent attention keeps the latent as K and
        the shared roped key as V: models/deepseek_v3/)."""
        self.table = table if table is not None else BlockTable.contiguous(num_slots, capacity, device)
        full = [i for i, s in enumerate(specs) if s.kind == "full"]
        shape = (len(full), self.table.num_blocks + 1, BLOCK, num_kv_heads, head_dim)
        # k, v: [L_full, N + 1, BLOCK, H_kv, D]
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros((*shape[:-1], v_head_dim or head_dim), dtype=dtype, device=device)
        self.capacity = capacity
        self.layers: list[FullKV | WindowKV] = []
        for spec in specs:
            if spec.kind == "full":
                index = len([s for s in self.layers if s.kind == "full"])
                self.layers.append(FullKV(self.k[index], self.v[index], self.table))
            else:
                ring = min(spec.window + max_step_tokens - 1, capacity)
                ring_shape = (num_slots, num_kv_heads, ring + 1, head_dim)
                self.layers.append(WindowKV(torch.zeros(ring_shape, dtype=dtype, device=device),
                                            torch.zeros((*ring_shape[:-1], v_head_dim or head_dim), dtype=dtype,
                                                        device=device)))

    def tensors(self) -> list[tuple[Tensor, tuple[int, ...]]]:
        """What a pass reads and writes, with the dims an allocation sizes (`step_mode.StepMode.caches`): every
        layer's k and v (full: [N + 1, BLOCK, H_kv, D], window: [S, H_kv, R + 1, D]), the pools [L_full, N + 1,
        BLOCK, H_kv, D] the full layers' views come from (a compiled pass guards on a view's base too), and the
        block table [S, M + 2]."""
        layers = [(t, (0, 2) if layer.kind == "window" else (0,)) for layer in self.layers for t in (layer.k, layer.v)]
        return layers + [(self.k, (1,)), (self.v, (1,)), (self.table.table, (0, 1))]

    def block_bytes(self) -> int:
        """Bytes of one pool block: K and V of every full layer."""
        return (self.k[:, 0].numel() + self.v[:, 0].numel()) * self.k.element_size()

    def move(self, src: int, dst: int, length: int) -> None:
        """A sequence changes row: its window rings go from row src to row dst (its full layers' blocks move with
        its table row, `BlockTable.move`). Device copies only."""
        for layer in self.layers:
            if layer.kind == "window":
                layer.k[dst] = layer.k[src]
                layer.v[dst] = layer.v[src]
