"""The draft-length policy interface and the fixed policies.

The generator asks `choose` before every step (k = 0 is a plain step: the target alone) and tells
`observe` what the target accepted. Any k keeps the output exact: greedy output is the target's,
and speculative sampling is lossless for any proposal length chosen from the past.

- `FixedDraftLen(k)`: always k (capped by the block), the classic speculative loop.
- `ScheduledDraftLen(schedule)`: TensorRT-LLM's `draft_len_schedule` semantics (running batch size
  -> draft length), so a schedule tuned for a TensorRT-LLM deployment can be tried here.
The live policy (`--draft-len auto`) is policy.py's `AutoDraftLen`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from .schedule import DraftLenSchedule


@dataclass(frozen=True)
class BatchView:
    """What a policy sees of the running batch; host values only, so choosing needs no device sync."""

    slots: list[int]  # cache slot of each running request (a step computes these rows, no others)
    context: int  # longest committed length in the batch (tokens the verify attends to, before the block)
    remaining: list[int]  # tokens each request may still emit
    max_draft_len: int  # block size - 1 of this run
    # whether each request keeps the drafter's context (None: all do); a plain-only one emits one token per step
    # whatever the draft length, while a drafting step still verifies k + 1 tokens for it
    drafting: tuple[bool, ...] | None = None

class DraftLenPolicy(ABC):
    name = "policy"

    def prepare(self, generator) -> None:
        """Called once the generator's caches are allocated (size per-slot state)."""

    def admit(self, slots: list[int], contexts: list[int]) -> None:
        """New requests, of prompts of `contexts` tokens, now occupy these slots."""

    @abstractmethod
    def choose(self, batch: BatchView) -> int:
        """-> the draft length of the next step, 0..batch.max_draft_len."""

    def observe(self, slots: list[int], draft_len: int, accepted: list[int], drafting: list[bool] | None = None) -> None:
        """The step ran with `draft_len` drafts per row; row i (slot slots[i]) had accepted[i] accepted. drafting:
        which rows drafted when plain-only rows ran beside them (None: every row)."""

    def plain_only_step(self) -> None:
        """A step of plain-only requests alone ran (instead of `timed` and `observe`): none of them drafts again,
        so there is no acceptance to learn, and its cost is plain decoding's."""

    def move(self, src: int, dst: int) -> None:
        """The request in slot src now occupies slot dst (the generator keeps running requests in the lowest slots)."""

    def release(self, slot: int, drafting: bool) -> None:
        """The request in `slot` ended (after its last `observe`); drafting: whether it still kept the drafter's
        context."""

    def timed(self, rows: int, context: int, draft_len: int, seconds: float) -> None:
        """The step of `rows` requests at longest context `context` with `draft_len` drafts took `seconds`
        (wall, up to the emitted tokens on the host)."""

    def drafts_for(self, batch: BatchView) -> bool:
        """Whether requests joining a running batch like `batch` (them included) should keep the drafter's
        context; False admits them plain-only: no drafter work for them, and they never draft (the others do)."""
        return True

    def keeps_context(self, batch: BatchView) -> list[bool]:
        """Asked at a plain step of a batch some of whose requests keep the drafter's context: per request, whether
        it should go on paying for it (its plain steps capture the target's features and write the drafter's
        context K/V). False makes that request plain-only until it ends: plain decoding's ops for it, and no
        drafting; the others draft on beside it (a drafting step verifies its row with padding)."""
        return [True] * len(batch.slots)

    def describe(self) -> dict:
        return {"policy": self.name}


class FixedDraftLen(DraftLenPolicy):
    name = "fixed"

    def __init__(self, draft_len: int | None = None):
        self.draft_len = draft_len  # None: the whole block

    def choose(self, batch: BatchView) -> int:
        return batch.max_draft_len if self.draft_len is None else min(self.draft_len, batch.max_draft_len)

    def drafts_for(self, batch: BatchView) -> bool:
        """Never drafting (draft length 0): requests are admitted plain-only, so the DFlash engine runs exactly
        plain decoding's ops (no drafter context, no captured target features)."""
        return self.draft_len != 0

    def describe(self) -> dict:
        return {"policy": self.name, "draft_len": self.draft_len}


class ScheduledDraftLen(DraftLenPolicy):
    name = "schedule"

    def __init__(self, schedule: DraftLenSchedule):
        self.schedule = schedule

    def choose(self, batch: BatchView) -> int:
        return min(self.schedule.draft_len(len(batch.slots)), batch.max_draft_len)

    def describe(self) -> dict:
        return {"policy": self.name, "schedule": self.schedule.as_option()}
