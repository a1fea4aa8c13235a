"""The records of a request's life in the generator: its sequence (host side), the slots' device state, a step's
plan and the target's verdict on it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..draft_length.policy import BatchView
from ..sample.sampling import SamplingBatch, SamplingParams
from .request import Request, Result


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

    @classmethod
    def new(cls, request: Request, slot: int, start: float, tag, default_stops: tuple[int, ...],
            drafting: bool) -> Sequence:
        """A request admitted at `start` (seconds, perf_counter) into row `slot`."""
        stops = request.stop_ids if request.stop_ids is not None else default_stops
        return cls(request, slot, Result(prompt_tokens=len(request.prompt_ids), start_s=start),
                   request.sampling.key(), frozenset() if request.ignore_eos else frozenset(stops), tag,
                   drafting=drafting)

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
    usable: int  # slots requests may hold, <= S: the rest are padding rows only (see `CacheManager.allocate`)
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
        """A drafting step with plain-only rows riding along (see `Runner.propose`)."""
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


def batch_view(running: list[Sequence], block: int, joining: list[Request] = (), slots: list[int] = ()) -> BatchView:
    """The running batch, and the requests `joining` it in `slots`, as the draft-length policy sees them, from
    host-side lengths (no device sync); a newcomer counts as drafting."""
    drafting = tuple(s.drafting for s in running) + (True,) * len(joining)
    return BatchView([s.slot for s in running] + list(slots),
                     max([s.start for s in running] + [len(r.prompt_ids) for r in joining]),
                     [s.request.max_new_tokens - len(s.result.output_ids) for s in running]
                     + [r.max_new_tokens for r in joining], block - 1, None if all(drafting) else drafting)
