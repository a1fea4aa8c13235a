"""Tensor parallelism: which slice of each weight a rank holds, and the collectives between ranks.

Megatron-style: Q/K/V and gate/up are column-parallel (split output rows), O and down are
row-parallel (split input columns, then all-reduce); the vocabulary (embedding rows, LM head rows)
is split after padding it to a multiple of the ranks; norms and the drafter's `fc` are replicated.
When a model has fewer KV heads than ranks, each KV head is replicated on tp / H_kv ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..utils.errors import DFlashError


@dataclass(frozen=True)
class Parallel:
    rank: int = 0
    world: int = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last dimension (rank order)."""
        if self.world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


SINGLE = Parallel()


def padded_vocab(vocab: int, world: int) -> int:
    return -(-vocab // world) * world


@dataclass(frozen=True)
class HeadSplit:
    """How one attention stack's heads divide over `world` ranks."""

    num_heads: int
    num_kv_heads: int
    world: int

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.world

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.world)

    def kv_heads_of(self, rank: int) -> range:
        """The global KV heads rank `rank` holds (one replicated head when H_kv < world)."""
        if self.num_kv_heads >= self.world:
            return range(rank * self.local_kv_heads, (rank + 1) * self.local_kv_heads)
        head = rank * self.num_kv_heads // self.world
        return range(head, head + 1)


def check_divisible(name: str, num_heads: int, num_kv_heads: int, intermediate: int, world: int) -> None:
    """One-line errors for a tensor-parallel size the model cannot be split by."""
    if world < 1:
        raise DFlashError(f"tensor-parallel size must be at least 1, got {world}")
    if num_heads % world:
        raise DFlashError(f"tensor-parallel size {world} does not divide the {name}'s num_attention_heads {num_heads}")
    if num_kv_heads % world and world % num_kv_heads:
        raise DFlashError(f"tensor-parallel size {world} and the {name}'s num_key_value_heads {num_kv_heads}: "
                          "one must divide the other")
    if intermediate % world:
        raise DFlashError(f"tensor-parallel size {world} does not divide the {name}'s intermediate_size {intermediate}")


def check_linear_heads(num_k_heads: int, num_v_heads: int, world: int) -> None:
    """Gated DeltaNet heads (and their recurrent state) are split over ranks, never replicated."""
    for field, heads in (("linear_num_key_heads", num_k_heads), ("linear_num_value_heads", num_v_heads)):
        if heads % world:
            raise DFlashError(f"tensor-parallel size {world} does not divide the target's {field} {heads}")


def check_divisible_experts(expert_intermediate: int, shared_intermediate: int, world: int) -> None:
    """MoE experts are split inside each expert (models/moe.py), like the dense MLP."""
    for field, size in (("moe intermediate size", expert_intermediate), ("shared expert intermediate size", shared_intermediate)):
        if size % world:
            raise DFlashError(f"tensor-parallel size {world} does not divide the target's {field} {size}")
