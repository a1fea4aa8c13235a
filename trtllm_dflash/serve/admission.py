"""When the serving loop admits waiting requests: at once, or held a little so that one call admits several.

An admission (`Generator.admit`: one prefill pass over the new prompts) stalls every running request while it
runs, and part of its cost is per call whatever the number of prompts: on an H100 the built-in pair's compiled
prefill took 3.2-4.5 ms for one short prompt or for 16 (eager 6-7.4 ms: host-bound, ~1,600 aten ops;
benchmarks/results/gpu_h100_policy/RUN.md). DFlash requests finish at different steps, as each accepts its own
drafts, so a loaded server's replacements arrive one or two at a time where plain decoding's finish together:
at snippets, concurrency 16, the H100 run's DFlash engine made 63-65 admission calls a point (0.24-0.28 s of a
point of about 1.4 s) against plain decoding's 6 (0.03 s).

The rule (`AdmissionGate.ready`): with B requests running, requests arriving at rate lambda and a fixed cost F
(seconds) per call, admitting in groups of k costs each request F / k of stalled batch plus its own wait, an
idle slot: a slot idle t seconds forgoes t / B of the batch's output, (k - 1) / (2 lambda B) a request at steady
arrivals. Groups of k + 1 cost no more than groups of k while k (k + 1) < 2 lambda B F, so the gate admits once
n waiting requests reach n (n + 1) >= 2 lambda B F: every request at once where lambda B F <= 1, else groups of
the best size (tests/serve/test_admission.py checks it against the best fixed group size). Where arrivals come slower
than estimated it admits once the waits add up to F B (no more idle than the call it saves: rent or buy), and
`AdmissionSettings.max_wait_s` caps any request's wait (its time to first token). F is measured on the serving
engine at load (`fixed_cost`), lambda from the last arrivals.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass

from ..cache.kv_cache import blocks_for
from ..draft_length.policy import FixedDraftLen
from ..engine.request import Request
from ..utils.errors import DFlashError

MAX_WAIT_S = 0.05  # default cap on how long the gate holds a request
PROBE_TOKENS = 16  # prompt tokens of the requests `fixed_cost` admits (a compiled prefill's alignment)
PROBE_ROWS = 8  # the larger admission `fixed_cost` times (or the engine's slots, if fewer)
RATE_WINDOW = 32  # arrivals the rate is estimated over
RATE_MIN = 8  # arrivals seen before the gate may hold at all


@dataclass(frozen=True)
class AdmissionSettings:
    max_wait_s: float = MAX_WAIT_S  # 0: admit waiting requests at once (no fixed cost is measured)

    def __post_init__(self):
        if not (math.isfinite(self.max_wait_s) and self.max_wait_s >= 0):
            raise DFlashError(f"--admission-wait-ms must be a number of milliseconds >= 0, got "
                              f"{self.max_wait_s * 1e3:g}")


def fixed_cost(generator, repeats: int = 3, clock=time.perf_counter) -> float:
    """Seconds per admission call that admitting N requests at once saves over N calls of one: from the medians
    of timed admissions of 1 and of N = min(PROBE_ROWS, slots) PROBE_TOKENS-token prompts (fewer where the
    engine's sequences or `max_num_tokens` are shorter), (N a1 - aN) / (N - 1),
    at least 0. The generator must be allocated and idle; each probe request emits its one token at admission
    and leaves, and the draft-length policy is set aside meanwhile (it learns nothing from these)."""
    if generator.slots is None or generator.slots.running:
        raise DFlashError("measuring the admission cost needs an allocated, idle generator")
    tokens = min(PROBE_TOKENS, generator.capacity - generator.block - 2)  # a probe's prompt must fit the engine
    if generator.max_num_tokens is not None:  # ... and one prefill: a longer prompt is staged, one at a time
        tokens = min(tokens, generator.max_num_tokens)
    held = blocks_for(generator.first_positions(tokens))  # KV blocks one probe holds while admitted
    rows = min(PROBE_ROWS, generator.slots.usable, generator.pool.num_blocks // held)  # ... and the pool, all rows
    if rows < 2 or tokens < 1:  # one slot: there is never a second request to admit with the first
        return 0.0
    samples = {1: [], rows: []}
    # the probes' prompts are alike: with prefix caching every timed admission after the first would reuse them
    with generator.temporarily(FixedDraftLen(0), prefix_caching=False):
        for r in range(repeats + 1):  # the first round untimed: a compiled prefill compiles each shape there
            for n in (1, rows):
                requests = [Request((1,) * tokens, 1, ignore_eos=True) for _ in range(n)]
                start = clock()
                generator.admit(requests, drafting=False)
                seconds = clock() - start
                if r:
                    samples[n].append(seconds)
    one, many = statistics.median(samples[1]), statistics.median(samples[rows])
    return max(0.0, (rows * one - many) / (rows - 1))


class AdmissionGate:
    """Decides, between steps, whether the waiting requests that have free slots are admitted now."""

    def __init__(self, fixed_s: float, settings: AdmissionSettings = AdmissionSettings()):
        self.fixed_s, self.settings = fixed_s, settings
        self.arrivals: deque[float] = deque(maxlen=RATE_WINDOW)  # when each of the last requests became admissible

    def arrived(self, now: float) -> None:
        """A request became admissible (a free slot for it) at `now` (seconds, monotonic)."""
        self.arrivals.append(now)

    def rate(self) -> float:
        """Requests per second becoming admissible, over the last RATE_WINDOW (0 until RATE_MIN have)."""
        if len(self.arrivals) < RATE_MIN or self.arrivals[-1] <= self.arrivals[0]:
            return 0.0
        return (len(self.arrivals) - 1) / (self.arrivals[-1] - self.arrivals[0])

    def holds(self, running: int) -> bool:
        """Whether grouping admissions can pay at all beside `running` requests: lambda B F > 1."""
        return running > 0 and self.settings.max_wait_s > 0 and self.rate() * running * self.fixed_s > 1.0

    def ready(self, running: int, waited: list[float]) -> bool:
        """waited: [N] seconds each admissible request has waited; -> admit them now (module docstring)."""
        if not waited:
            return False
        if not self.holds(running):
            return True
        n, cost = len(waited), self.fixed_s * running
        return n * (n + 1) >= 2 * self.rate() * cost or sum(waited) >= cost or max(waited) >= self.settings.max_wait_s
