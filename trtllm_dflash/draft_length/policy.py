"""Draft-length policies: how many tokens to draft in the next step for the running batch.

The interface and the fixed policies (`FixedDraftLen`, `ScheduledDraftLen`) are in interface.py, re-exported
here. `CostBasedDraftLen(cost)` (`--draft-len auto`) maximises expected output tokens per second of the running
batch from a measured step-cost model and live acceptance statistics; it drafts only where drafting is expected
to beat a plain step (in a batch of more than 4 requests, by the margin MIN_GAIN), and probes now and then
(exponentially less often) so it notices when it pays again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .acceptance import AcceptanceModel, AcceptanceSettings
from .cost import CostModel
from .interface import BatchView, DraftLenPolicy, FixedDraftLen, ScheduledDraftLen
from .newcomers import NewcomerBackoff
from .step_costs import CONTEXT_STEP, StepCosts

__all__ = ["BatchView", "CostBasedDraftLen", "DraftLenPolicy", "FixedDraftLen", "ProbeSettings",
           "ScheduledDraftLen"]


# Each rule's reasoning and measurement: docs/draft-length-policy.md.
PLAIN_ONLY_AFTER = 16  # plain-best steps in a row before newcomers are admitted plain-only
# Steps a plain choice is kept while the batch and the acceptance evidence stay the same: choosing is host time
# between steps (benchmarks/results/policy_overhead.json).
PLAIN_KEPT_STEPS = 8
# Steps a drafting choice is kept while the batch stays the same and it beats plain by DRAFT_KEPT_GAIN times the
# margin at the live cost factors (`keeps_drafting`); the kept steps' evidence is folded in at the next choice.
DRAFT_KEPT_STEPS = 4
DRAFT_KEPT_GAIN = 1.1
# A request's own decayed drafting steps (trials of draft position 1) before it may drop the drafter's context.
OWN_PROBES = 1.5
# When a lone request's probe accepts drafts its evidence gave less than this chance (the product of its mean rates
# at the accepted positions), that evidence ages by the plain run before the probe (`AcceptanceModel.age`): the
# request changed. benchmarks/results/draft_len_batch1_threads1.json
SURPRISE = 0.1
# Above ProbeSettings.newcomer_batch requests a drafting step must reach this many times the plain step's expected
# tokens/s: the models miss part of a served step's cost. Small batches keep no margin (that is where requests
# explore). benchmarks/results/min_gain_trial/
MIN_GAIN = 1.25


@dataclass(frozen=True)
class ProbeSettings:
    """After `first` plain steps in a row a drafting step is tried; each probe that does not make drafting win
    doubles the wait, up to `longest` steps. A request admitted into a batch of at most `newcomer_batch` requests
    probes at its first step and restarts the back-off: acceptance differs far more between requests than between
    estimates of one request's rates, so a hard request must not keep an easy one from drafting. Where a
    prompt-length bucket's requests keep failing, its newcomers probe less often, down to one in
    `newcomer_longest` (newcomers.py)."""

    first: int = 16
    longest: int = 1024
    newcomer_batch: int = 4
    newcomer_longest: int = 16
    # above newcomer_batch, a probe drafts only lengths whose step costs at most this many plain steps (else one
    # draft): its verify costs every row k + 1 tokens, and short drafts still show the first positions' acceptance
    large_batch_cost: float = 2.0


def pick(rates: np.ndarray, min_gain: float) -> int:
    """[K + 1] expected tokens/s at draft length 0..K -> the best drafting length if it beats plain by min_gain,
    else 0 (the first maximum: ties go to the shorter draft, and to plain)."""
    if len(rates) < 2:
        return 0
    k = 1 + int(np.argmax(rates[1:]))
    return k if rates[k] > rates[0] and rates[k] >= min_gain * rates[0] else 0


class CostBasedDraftLen(DraftLenPolicy):
    """argmax over k of  sum_b E[tokens_b | k] / step_seconds(batch, k, context); in a batch of more than
    `probe.newcomer_batch` requests, drafting only where that beats the plain step's rate by `min_gain`."""

    name = "cost"

    def __init__(self, cost: CostModel | None = None, acceptance: AcceptanceSettings = AcceptanceSettings(),
                 probe: ProbeSettings = ProbeSettings(), calibrator=None, min_gain: float = MIN_GAIN):
        if not min_gain >= 1.0:
            raise ValueError(f"min_gain must be at least 1 (drafting never chosen below plain), got {min_gain}")
        self.cost, self.acceptance_settings, self.probe, self.min_gain = cost, acceptance, probe, min_gain
        self.calibrator = calibrator  # generator -> CostModel, used when `cost` is missing or too small
        self.acceptance: AcceptanceModel | None = None
        self.plain_run, self.wait = 0, probe.first
        self.last_rates: np.ndarray | None = None  # expected tokens/s per k at the last choice
        self.plain_streak = 0  # steps in a row whose best draft length was 0 (probes do not break it)
        self.streak_small: bool | None = None  # whether the last `choose` saw a small batch (None: no choice yet)
        self.newcomer = False  # a request was admitted into a small batch: its first step probes
        self.newcomer_waits = False  # ... or not: its prompt-length bucket's probes are backed off (not its turn)
        self.costs = StepCosts(cost)  # the step seconds `choose` reads: calibrated, corrected live
        self.kept, self.kept_key = 0, None  # steps a choice is still kept, for which batch (and evidence: plain)
        self.kept_choice, self.kept_gain = 0, 0.0  # a kept drafting choice, its gain over plain (`best`)
        self.kept_context: tuple = ((), None)  # (key, keeps_context) of the last call
        self.newcomers: NewcomerBackoff | None = None  # which newcomers probe, per prompt-length bucket
        self.crowd: NewcomerBackoff | None = None  # ... its verdicts from large batches, for large batches (`judges`)
        self.crowd_waits = False  # the newcomers' bucket is backed off by large batches' verdicts (not its turn)
        self.admitted: frozenset[int] = frozenset()  # the slots of the last `admit`'s requests
        # Whether a request ending now is judged as a small batch's (`small`). Small batches' verdicts back off
        # their bucket's newcomers everywhere (`newcomers`), large batches' only newcomers joining a large batch
        # (`crowd`): a large batch drafts rarely and short, so its verdicts rest on little evidence.
        # benchmarks/results/bucket_verdicts.json
        self.judges = True
        self.probing = False  # the step being chosen is a back-off probe (`probed`)

    def prepare(self, generator) -> None:
        slots, max_draft_len = generator.slots.usable, generator.block - 1
        self.acceptance = None  # calibration steps run junk requests: nothing to learn from them
        if self.cost is None or not self.cost.covers(slots, max_draft_len):
            if self.calibrator is None:
                raise ValueError("CostBasedDraftLen needs a cost model covering the batch, or a calibrator")
            self.cost = self.calibrator(generator)
        self.acceptance = AcceptanceModel(slots, max_draft_len, self.acceptance_settings)
        self.plain_run, self.wait, self.plain_streak, self.newcomer = 0, self.probe.first, 0, False
        self.streak_small = None
        self.newcomer_waits = False
        self.costs = StepCosts(self.cost)  # the cost model may be new
        self.kept, self.kept_key, self.kept_choice = 0, None, 0
        self.kept_context = ((), None)
        self.newcomers = NewcomerBackoff(slots, self.probe.newcomer_longest)
        self.crowd = NewcomerBackoff(slots, self.probe.newcomer_longest, history=False)
        self.judges, self.crowd_waits = True, False
        self.probing = False

    def admit(self, slots: list[int], contexts: list[int]) -> None:
        if self.acceptance is not None:
            self.acceptance.reset(slots, contexts)
            # whether they probe at their first step (`choose` and `drafts_for` see the batch size)
            self.newcomer = self.newcomers.admit(slots, contexts)
            self.newcomer_waits = not self.newcomer and self.newcomers.backed_off(contexts)
            self.crowd_waits = not self.crowd.admit(slots, contexts) and self.crowd.backed_off(contexts)
        self.admitted = frozenset(slots)
        self.kept = 0  # new requests may take finished ones' slots: the batch's key alone would not show it

    def expected_rates(self, batch: BatchView) -> np.ndarray:
        return expected_rates(self.acceptance, self.step_seconds(batch), batch)

    def choose(self, batch: BatchView) -> int:
        self.judges = self.small(batch)
        best = self.best(batch)
        self.plain_streak = 0 if best > 0 else self.plain_streak + 1
        self.streak_small = self.small(batch)
        newcomer, self.newcomer, self.newcomer_waits = self.newcomer_probe(batch), False, False
        self.crowd_waits = False
        if best > 0:  # drafting pays: probes start over from the first wait once it stops paying
            self.wait = self.probe.first
            return best
        if batch.max_draft_len == 0 or max(batch.remaining) < 2:  # nothing to draft: no probe, the back-off stays
            return 0
        if newcomer:  # probes now, and its probes start over from the first wait
            self.wait = self.probe.first
        elif self.plain_run + 1 < self.wait:  # this would be plain step plain_run + 1 in a row
            return 0
        else:
            self.wait = min(2 * self.wait, self.probe.longest)
        if not self.reachable(batch):  # no evidence could make a drafting step win: it counts as a failed probe
            return 0
        rates = self.last_rates = self.expected_rates(batch)
        self.probing = not newcomer
        return self.probe_len(batch, rates)

    def probe_len(self, batch: BatchView, rates: np.ndarray) -> int:
        """The least bad drafting length (evidence for the estimates); in a large batch only among the affordable
        ones (ProbeSettings.large_batch_cost)."""
        if self.small(batch):
            return 1 + int(np.argmax(rates[1:]))
        seconds = self.step_seconds(batch)
        affordable = max(1, int(np.sum(seconds[1:len(rates)] <= self.probe.large_batch_cost * seconds[0])))
        return 1 + int(np.argmax(rates[1:affordable + 1]))  # seconds grow with k: the affordable ones come first

    def best(self, batch: BatchView) -> int:
        """argmax over k of the expected rate; a plain choice kept PLAIN_KEPT_STEPS steps while the batch and the
        evidence stay the same, a clear drafting choice DRAFT_KEPT_STEPS while the batch does (`keeps_drafting`)."""
        key = (tuple(batch.slots), batch.drafting)
        if self.kept > 0 and self.kept_key == (key, self.acceptance.version if self.kept_choice == 0 else None):
            if self.kept_choice == 0 or self.keeps_drafting(batch):
                self.kept -= 1
                return self.kept_choice
        rates = self.last_rates = self.expected_rates(batch)
        best = pick(rates, self.margin(batch))
        self.kept, self.kept_key, self.kept_choice = 0, None, 0
        if best == 0:
            self.kept, self.kept_key = PLAIN_KEPT_STEPS - 1, (key, self.acceptance.version)
        else:
            plain, drafting = self.costs.correction.factors()
            self.kept_gain = rates[best] / rates[0] * drafting / plain  # the gain at live cost factors of 1
            if self.keeps_drafting(batch):
                self.kept, self.kept_key, self.kept_choice = DRAFT_KEPT_STEPS - 1, (key, None), best
        return best

    def keeps_drafting(self, batch: BatchView) -> bool:
        """Whether the last drafting choice, at the live cost factors now, still beats plain by DRAFT_KEPT_GAIN times
        the margin, with at most a quarter of the requests within a block of their end (their expected tokens
        shrink with their remaining budget)."""
        plain, drafting = self.costs.correction.factors()
        ending = sum(r <= batch.max_draft_len for r in batch.remaining)
        gain = self.kept_gain * plain / drafting
        return 4 * ending <= len(batch.slots) and gain >= DRAFT_KEPT_GAIN * self.margin(batch)

    def newcomer_probe(self, batch: BatchView) -> bool:
        """A request joined a batch small enough to probe for it (see ProbeSettings), and it is its turn."""
        return self.newcomer and self.small(batch)

    def small(self, batch: BatchView) -> bool:
        return len(batch.slots) <= self.probe.newcomer_batch

    def margin(self, batch: BatchView) -> float:
        """How many times plain's expected rate a drafting step must reach (see MIN_GAIN)."""
        return 1.0 if self.small(batch) else self.min_gain

    def observe(self, slots: list[int], draft_len: int, accepted: list[int], drafting: list[bool] | None = None) -> None:
        plain_run, self.plain_run = self.plain_run, self.plain_run + 1 if draft_len == 0 else 0  # toward the next probe
        if self.probing:
            self.probing = False
            if draft_len > 0:
                self.probed(slots, accepted, drafting, plain_run)
        if self.acceptance is not None:
            self.acceptance.observe(slots, draft_len, accepted, drafting)

    def probed(self, slots: list[int], accepted: list[int], drafting: list[bool] | None, plain_run: int) -> None:
        """A back-off probe after `plain_run` plain steps ran: for a request decoding alone, evidence that made its
        acceptance unlikely ages by the plain run before the probe's own evidence counts (SURPRISE)."""
        rows = [i for i in range(len(slots)) if (drafting is None or drafting[i]) and accepted[i] > 0]
        if rows and len(slots) == 1:  # alone (see SURPRISE)
            rates = self.acceptance.rates([slots[i] for i in rows])  # [R, K] mean rates of the evidence so far
            aged = [slots[i] for i, r in zip(rows, rates) if float(np.prod(r[: accepted[i]])) < SURPRISE]
            if aged:
                self.acceptance.age(aged, plain_run)

    def plain_only_step(self) -> None:
        """It counts toward the next probe like any plain step. Its time is not fed to the live cost correction:
        that factor prices the steps of batches that keep the drafter's context, the only ones `choose` sees."""
        self.plain_run += 1

    def move(self, src: int, dst: int) -> None:
        if self.acceptance is not None:
            self.acceptance.move(src, dst)
            self.newcomers.move(src, dst)
            self.crowd.move(src, dst)

    def release(self, slot: int, drafting: bool) -> None:
        """A request that ends still keeping the drafter's context, with enough drafting steps of its own, is
        judged for its prompt-length bucket by whether some draft length pays for it alone (see `pays_alone`),
        as a small or a large batch's request (`judges`)."""
        if self.acceptance is None:
            return
        if drafting and self.acceptance.tried[slot, 0] >= OWN_PROBES:
            context = int(self.acceptance.context[slot])
            self.verdict(slot, bool(self.pays_alone([slot], [self.acceptance.max_draft_len + 1], context)[0]),
                         self.judges)
        else:
            self.verdict(slot, None, True)

    def verdict(self, slot: int, paid: bool | None, small: bool) -> None:
        """The request in `slot` is judged (paid: whether drafting pays for it alone; None: no verdict) by the
        back-off of its batch's kind, and forgotten by the other (see `judges`)."""
        judge, other = (self.newcomers, self.crowd) if small else (self.crowd, self.newcomers)
        other.forget(slot)
        if paid is None:
            judge.forget(slot)
        else:
            judge.judged(slot, paid)

    def timed(self, rows: int, context: int, draft_len: int, seconds: float) -> None:
        if self.cost is None or self.acceptance is None:  # calibrating: its steps are the model itself
            return
        self.costs.observe(rows, context, self.acceptance.max_draft_len, draft_len, seconds)

    def step_seconds(self, batch: BatchView) -> np.ndarray:
        """[K + 1] the batch's step seconds at draft length 0..K, calibrated and corrected (StepCosts)."""
        return self.costs.seconds(len(batch.slots), batch.context, batch.max_draft_len)

    def drafts_for(self, batch: BatchView) -> bool:
        """Whether newcomers keep the drafter's context: not after PLAIN_ONLY_AFTER plain-best steps in a row when even
        the optimistic estimate loses to plain, nor while their bucket waits for its turn to probe (newcomers.py) and
        no running request keeps the context, nor where no evidence could make drafting win (`reachable`); yes once
        a probe is due. docs/draft-length-policy.md; benchmarks/results/newcomer_admission.json"""
        if self.cost is None or self.acceptance is None:  # calibrating, or not prepared: draft
            return True
        if not self.reachable(batch):
            return False
        if self.newcomer_probe(batch):  # a probe is due: it can only run once every running request drafts
            return True
        waits = self.newcomer_waits or (self.crowd_waits and not self.small(batch))  # large batches: either back-off
        if waits and not self.others_keep_context(batch):
            return False
        if self.plain_run + 1 >= self.wait and not (self.newcomer_waits and self.small(batch)):
            return True
        return self.streak_holds(batch) or pick(self.expected_rates(batch), self.margin(batch)) > 0

    def streak_holds(self, batch: BatchView) -> bool:
        """Whether the batch's recent drafting keeps newcomers' drafter context without asking the estimates: fewer
        than PLAIN_ONLY_AFTER plain-best steps in a row, counted on a batch of the newcomers' kind. Newcomers that
        turn a small batch into a large one ask the estimates: a small batch's probes say nothing of whether the
        large one would draft. benchmarks/results/lone_first.json"""
        if self.plain_streak >= PLAIN_ONLY_AFTER:
            return False
        return self.small(batch) or not self.streak_small

    def reachable(self, batch: BatchView) -> bool:
        return reachable(self.step_seconds(batch), batch, self.margin(batch))

    def others_keep_context(self, batch: BatchView) -> bool:
        """Whether a running request admitted before the newcomers (the last `admit`) keeps the drafter's context."""
        drafting = batch.drafting or (True,) * len(batch.slots)
        return any(d for slot, d in zip(batch.slots, drafting) if slot not in self.admitted)

    def keeps_context(self, batch: BatchView) -> list[bool]:
        """[B] whether each request keeps paying for the drafter's context. It stops once (1) a probe after a plain run
        has failed and `drafts_for` says no, (2) it has drafted in OWN_PROBES steps of its own (fewer in a large batch
        whose next probe comes after its end, `another_probe`), and (3) by its own estimate no draft length pays even
        alone (in a large batch: in a batch of its size all like it, `pays_in_kind`). A plain-only row verifies
        padding in a drafting step (per-row draft lengths). docs/draft-length-policy.md"""
        if self.cost is None or self.acceptance is None or self.wait <= self.probe.first:
            return [True] * len(batch.slots)
        context = batch.context - batch.context % CONTEXT_STEP
        due = self.plain_run + 1 >= self.wait or self.newcomer_probe(batch)  # what `drafts_for` reads besides
        key = (tuple(batch.slots), batch.drafting, self.acceptance.version, context, due,
               self.plain_streak < PLAIN_ONLY_AFTER)
        if self.kept_context[0] == key:  # a run of plain steps asks the same every step
            return self.kept_context[1]
        if self.drafts_for(batch):
            self.kept_context = (key, [True] * len(batch.slots))
        else:
            drafting = batch.drafting or (True,) * len(batch.slots)
            tried = self.acceptance.tried[batch.slots, 0]  # [B] each request's own decayed drafting steps
            alone = self.pays_alone(batch.slots, batch.remaining, context)
            pays = alone if self.small(batch) else alone & self.pays_in_kind(batch)
            another = self.another_probe(batch)
            keep = [not d or (t < OWN_PROBES and n) or bool(p) for d, t, n, p in zip(drafting, tried, another, pays)]
            for slot, d, kept, a, t in zip(batch.slots, drafting, keep, alone, tried):
                if not d or kept:
                    continue
                # only the batch's size stopped it (it pays alone), or it drafted too little to judge: no verdict;
                # else a failure for its bucket
                self.verdict(slot, None if a or t < OWN_PROBES else False, self.small(batch))
            self.kept_context = (key, keep)
        return self.kept_context[1]

    def another_probe(self, batch: BatchView) -> list[bool]:
        """[B] whether each request can still draft in a step of its own before it ends, short of the batch's drafting
        choice: in a small batch at any time (newcomers' probes, no margin); in a large one only if the policy's next
        probe comes within its remaining tokens (plain steps count down both alike, so a kept answer stays true).
        Else a request with fewer than OWN_PROBES drafting steps would pay the context's upkeep (the target's
        features captured at every step) for a probe that never comes."""
        if self.small(batch):
            return [True] * len(batch.slots)
        until = self.wait - self.plain_run  # plain steps until the next probe (`choose`)
        return [until <= r for r in batch.remaining]

    def pays_alone(self, slots: list[int], remaining: list[int], context: int) -> np.ndarray:
        """[B] bool: by each request's own (optimistic) acceptance estimate, some draft length beats a plain
        step even if it decoded alone at `context` tokens (the cheapest a drafting step gets)."""
        alone = self.costs.seconds(1, context, self.acceptance.max_draft_len)  # [K + 1] s
        return pays(self.acceptance, slots, remaining, alone, 1.0)

    def pays_in_kind(self, batch: BatchView) -> np.ndarray:
        """[B] bool: by each request's own (optimistic) acceptance estimate, a batch of as many requests as this one,
        each like it, would draft: some draft length beats a plain step by the batch's margin. Else a request that
        pays alone would keep the context in a large batch waiting for a shrink a loaded server never brings."""
        # a row's tokens over the batch's step seconds: its share of the rate of a batch all like it
        return pays(self.acceptance, batch.slots, batch.remaining, self.step_seconds(batch), self.margin(batch))

    def describe(self) -> dict:
        meta = self.cost.meta if self.cost else {}
        plain, drafting = self.costs.correction.factors()
        return {"policy": self.name, "calibration": {k: meta[k] for k in ("device", "threads") if k in meta},
                "min_gain_above_batch": {"min_gain": self.min_gain, "batch": self.probe.newcomer_batch},
                "live_cost_factors": {"plain": plain, "drafting": drafting},
                "newcomer_probes_backed_off": self.newcomers.describe() if self.newcomers else {},
                "large_batch_newcomers_backed_off": self.crowd.describe() if self.crowd else {}}


def expected_rates(acceptance: AcceptanceModel, seconds: np.ndarray, batch: BatchView) -> np.ndarray:
    """[K + 1] expected output tokens per second of the whole batch at draft length 0..K (`seconds`: [K + 1])."""
    tokens = acceptance.expected_tokens(batch.slots, batch.remaining)  # [B, K + 1]
    if batch.drafting is not None and not all(batch.drafting):
        tokens = np.where(np.asarray(batch.drafting)[:, None], tokens, 1.0)
    return tokens.sum(0)[: len(seconds)] / seconds


def reachable(seconds: np.ndarray, batch: BatchView, margin: float) -> bool:
    """Whether any evidence could make a drafting step win in this batch: accepting every draft (a row that keeps
    the drafter's context emits min(k + 1, remaining) tokens, a plain-only row 1), some draft length beats the
    plain step's rate (`seconds`: [K + 1]) by `margin`. Where none does, a probe or a newcomer's drafter context is
    pure cost. benchmarks/results/reachable_batches.json"""
    width = np.arange(1, len(seconds) + 1)[None, :]  # [1, K + 1] tokens per row at full acceptance
    tokens = np.minimum(width, np.maximum(np.asarray(batch.remaining)[:, None], 1))  # [B, K + 1]
    if batch.drafting is not None and not all(batch.drafting):
        tokens = np.where(np.asarray(batch.drafting)[:, None], tokens, 1)
    return pick(tokens.sum(0) / seconds, margin) > 0


def pays(acceptance: AcceptanceModel, slots: list[int], remaining: list[int], seconds: np.ndarray,
         margin: float) -> np.ndarray:
    """[B] bool: `pick`'s test row by row, on each request's own (optimistic) expected tokens and step seconds
    [K + 1]: some draft length beats a plain step, by `margin`."""
    rates = acceptance.expected_tokens(slots, remaining)[:, : len(seconds)] / seconds  # [B, K + 1]
    best, plain = rates[:, 1:].max(axis=1), rates[:, 0]
    return (best > plain) & (best >= margin * plain)
