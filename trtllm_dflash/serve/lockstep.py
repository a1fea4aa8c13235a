"""Tensor-parallel serving: rank 0 (the Triton model) drives the other ranks' generators in lockstep.

Every call that changes generator state (allocate, admit, step, hold, cancel) is broadcast to the
worker ranks before rank 0 runs it, so all ranks execute the same steps on the same inputs and their
collectives line up. Requests without a seed get one here, so every rank samples alike; the draft
length of each step is chosen on rank 0 and sent with it.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from ..engine.generator import Generator
from ..engine.request import Request
from ..engine.sequence import Sequence
from ..utils.errors import DFlashError

from .failures import RANK_LOST as RANK_LOST_TEXT

DEATH_SEEN_S = 2.0  # a collective that failed because a rank died: how long its exit may take to be reaped


class RankLost(DFlashError):
    """A worker rank exited: the ranks can no longer step together (its message names the rank and exit code)."""


def broadcast(message=None):
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class LockstepGenerator:
    """Rank 0's generator: a `Generator` (the same behaviour) whose every state change is first sent to the
    workers (`follow`). Everything else, reads and settings alike, is the generator's own."""

    def __init__(self, target, proposer, default_stop_ids: tuple[int, ...] = (), workers=()):
        object.__setattr__(self, "generator", Generator(target, proposer, default_stop_ids))
        object.__setattr__(self, "workers", list(workers))  # ranks 1.. (subprocess.Popen)
        object.__setattr__(self, "lost", None)  # why the ranks cannot step together any more, once known

    def __getattr__(self, name: str):
        return getattr(self.generator, name)

    def __setattr__(self, name: str, value) -> None:  # the runtime settings (policy, prefix_caching, ...)
        setattr(self.generator, name, value)

    def generate(self, requests: list[Request], block_size: int | None = None):
        return Generator.generate(self, requests, block_size)  # its allocate, admit and step mirrored

    @torch.inference_mode(False)
    def allocate(self, num_slots: int, capacity: int, block: int, num_blocks: int | None = None) -> None:
        g = self.generator
        # the pool's settings first: every rank sizes the same pool, so admission and preemption agree
        self.send(("configure", (g.prefix_caching, g.max_num_tokens, g.kv_cache_bytes)))
        self.send(("allocate", (num_slots, capacity, block, num_blocks)))
        self.guarded(g.allocate_caches, num_slots, capacity, block, num_blocks)
        g.policy.prepare(self)

    def admit(self, requests: list[Request], tags: list | None = None, drafting: bool | None = None) -> list[Sequence]:
        g, requests = self.generator, [with_seed(r) for r in requests]
        g.check_admission(requests)  # a rejected batch never reaches the workers
        if drafting is None:  # decided by rank 0's policy and sent, so every rank keeps the same drafter context
            drafting = g.decide_drafting(requests, g.slots.free()[: len(requests)])
        self.send(("admit", (requests, None, drafting)))
        return self.guarded(g.admit, requests, tags, drafting)

    def step(self, draft_len: int | None = None) -> list[Sequence]:
        g = self.generator
        if not g.live():
            return []
        running = list(g.slots.running.values())
        k = (self.draft_len(running) if running else 0) if draft_len is None else draft_len
        self.send(("step", (k,)))
        return self.guarded(g.step, k)

    def draft_len(self, running: list[Sequence]) -> int:
        k, stopping = self.generator.next_draft_len(running)
        if stopping:
            self.stop_drafting(stopping)
        return k

    def stop_drafting(self, running: list[Sequence]) -> None:
        self.send(("stop_drafting", ([s.slot for s in running],)))
        self.generator.stop_drafting(running)

    def hold(self, sequences: list[Sequence], length: int) -> None:
        self.send(("hold", ([s.slot for s in sequences], length)))
        self.generator.hold(sequences, length)

    def cancel(self, seq: Sequence, reason: str) -> None:
        if self.lost is None:  # once a rank is gone, rank 0 still ends its own requests
            self.send(("cancel", (seq.order, reason)))  # admission order: also names a preempted or staged one
        self.generator.cancel(seq, reason)

    def close(self) -> None:
        if self.lost is None:
            self.send(("stop", ()))
        for worker in self.workers:  # past a lost rank the others may wait in a collective forever
            if self.lost is not None and worker.poll() is None:
                worker.kill()

    def send(self, message) -> None:
        if self.lost is not None:
            raise RankLost(self.lost)
        self.guarded(broadcast, message)

    def guarded(self, call, *args):
        """call(*args); a failure while a worker rank has exited is that rank's loss (RankLost), not a step's."""
        try:
            return call(*args)
        except RankLost:
            raise
        except Exception as exc:
            if self.check_ranks(DEATH_SEEN_S) is None:
                raise
            raise RankLost(self.lost) from exc

    def check_ranks(self, wait_s: float = 0.0) -> str | None:
        """Why the ranks can no longer step together (a worker exited), else None; waits up to `wait_s` for an
        exit to show. Cheap (one waitpid per worker): the serving loop calls it while idle."""
        deadline = time.monotonic() + wait_s
        while self.lost is None:
            for rank, worker in enumerate(self.workers, start=1):
                if worker.poll() is not None:
                    object.__setattr__(self, "lost", f"{RANK_LOST_TEXT} (rank {rank} exited with code "
                                                     f"{worker.returncode})")
                    break
            else:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.05)
        return self.lost


def with_seed(request: Request) -> Request:
    if request.sampling.seed is not None or request.sampling.greedy:
        return request
    return dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, seed=random.getrandbits(63)))


def follow(generator: Generator) -> None:
    """A worker rank: apply rank 0's calls until told to stop."""
    while True:
        op, args = broadcast()
        if op == "stop":
            return
        if op == "configure":
            generator.prefix_caching, generator.max_num_tokens, generator.kv_cache_bytes = args
        elif op == "allocate":
            generator.allocate(*args)
        elif op == "admit":
            generator.admit(*args)
        elif op == "step":
            generator.step(*args)
        elif op == "stop_drafting":
            generator.stop_drafting([generator.slots.running[slot] for slot in args[0]])
        elif op == "hold":
            generator.hold([generator.slots.running[slot] for slot in args[0]], args[1])
        elif op == "cancel":
            seq = next((s for s in generator.live() if s.order == args[0]), None)
            if seq is not None:
                generator.cancel(seq, args[1])


def spawn_workers(engine_dir: str, world: int, port: int, decoding: str) -> list[subprocess.Popen]:
    """Ranks 1..world-1 as processes of this environment's Python (gloo on loopback)."""
    python = sys.executable if "python" in sys.executable.rsplit("/", 1)[-1] else shutil.which("python3")
    return [subprocess.Popen([python, "-m", "trtllm_dflash.serve.tp_worker", engine_dir, str(rank), str(world),
                              str(port), decoding]) for rank in range(1, world)]
