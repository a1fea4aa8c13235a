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
from .live_cost import StepCostCorrection
from .newcomers import NewcomerBackoff

__all__ = ["BatchView", "CostBasedDraftLen", "DraftLenPolicy", "FixedDraftLen", "ProbeSettings",
           "ScheduledDraftLen"]


PLAIN_ONLY_AFTER = 16  # plain-best steps in a row before newcomers are admitted plain-only
# A plain choice is kept for this many steps while the batch and the acceptance evidence stay the same: only
# its context and the live cost factors drift then, slowly. The host work of choosing, small alone (about 15
# us), runs several times slower between steps (the step has just evicted it from the caches) and was a few
# percent of a plain step of the built-in pair.
PLAIN_KEPT_STEPS = 8
# A drafting choice is kept for this many steps while the batch stays the same and the choice beats plain by
# DRAFT_KEPT_GAIN times the batch's margin at the live cost factors (`CostBasedDraftLen.keeps_drafting`). Only the
# kept steps' evidence and slow drifts (context, cost factors) change meanwhile; the acceptance model applies the
# evidence of those steps in one go at the next choice (`AcceptanceModel.folded`). Choosing at every drafting step
# cost the built-in pair's closed loop about 400 us of host time a step at 1 row and 580 at 16 on this project's
# CPU, with the H100's cost model (a one-off script, policy_host_time.py, not kept: the step has just evicted the policy's code and
# data from the caches, so the same work runs about four times slower than warm). Keeping choices took it to about
# 150 and 400 us. On an H100 a 1-row whole-block step of that pair took 2.5-3.6 ms always drafting 15 and 3.1-4.4
# ms under this policy (per-repeat medians, benchmarks/results/gpu_h100_policy/prefill_e1f6625).
DRAFT_KEPT_STEPS = 4
DRAFT_KEPT_GAIN = 1.1  # at concurrency 16 on the H100's cost model, 9 in 10 drafting choices beat plain by more
CONTEXT_STEP = 16  # tokens: the context granularity of the step-cost table the policy reads
# a request's own drafting steps (decayed trials of draft position 1: two steps are 0.9 + 1 = 1.9) before it may
# stop paying for the drafter's context (`CostBasedDraftLen.keeps_context`)
OWN_PROBES = 1.5
# A probe of a request decoding alone that accepted drafts its evidence gave less than this chance of (the product
# of its mean rates at the accepted positions) ages that evidence by the plain run before it counts
# (`AcceptanceModel.age`): it says the request changed since. Alone only: in a greedy replay of 16 held-out prompts
# in waves of 4 on a calibrated step-cost table, ageing at batches of 2-4 as well cost 2 % of the modelled rate (a
# probe's ageing made the whole batch explore). At 0.2 the hard long requests of tests/draft_length/test_acceptance_model.py (alpha_1
# 0.3) aged at their lucky probes and explored: 0.961-0.964 of plain's rate over three seeds against 0.964-0.972
# without ageing; at 0.1, 0.967-0.972, the same as without. Batch 1, one thread: auto 1.12x -> 1.16x always 15, the
# prompt that had dropped the drafter's context after its hard opening at tau 1.02 -> 2.95 (15: 3.63)
# (benchmarks/results/draft_len_batch1_threads1.json, and _962e462.json before).
SURPRISE = 0.1
# In a batch larger than ProbeSettings.newcomer_batch, a drafting step is chosen over a plain one only when its
# expected output tokens/s is at least this many times the plain step's. The models miss part of what a served
# step costs: served steps spread around the live cost factors, the acceptance estimate is optimistic, and a
# batch's requests finish apart. Drafting for a predicted few percent lost served: snippets at concurrency 16 gave
# 0.93 of plain with no margin, 0.97 with 1.1 and 0.98 with 1.25, the last with 99 % of its steps plain
# (`python benchmarks/serve_dflash_vs_plain.py --repeats 9 --warmup 4 --contexts short`, one run per value,
# 2026-11-26, the margin then at every batch size). Small batches keep no margin: they are where requests explore
# (newcomer probes, optimistic estimates), and a margin there let one early rejection of a drafter whose first
# draft is a coin flip hold it to plain steps for most of a request (tests/draft_length/test_policy.py).
MIN_GAIN = 1.25


@dataclass(frozen=True)
class ProbeSettings:
    """After `first` plain steps in a row a drafting step is tried; each probe that does not make
    drafting win doubles the wait, up to `longest` steps (the cost of probing shrinks with it).
    A request admitted into a batch of at most `newcomer_batch` requests (it included) probes at its
    first step and restarts the back-off (probes after 16, 32, ... plain steps again): acceptance differs
    far more between requests than between estimates of one context's rates (the built-in pair's
    held-out snippets range from nearly every draft rejected to most of the block accepted), so after a
    hard request a backed-off wait would keep an easy one from ever drafting (seen: a server whose first
    request was hard decoded every later one plainly), and one probe is not enough (the built-in
    drafter's first draft is a coin flip). A few small drafting steps per request cost a small batch
    little; a large one would pay them for every row at every admission, and its rows' own drafting
    steps teach it anyway. Where every request of a prompt-length bucket fails, newcomers of that bucket
    probe less often, down to one in `newcomer_longest` (newcomers.py)."""

    first: int = 16
    longest: int = 1024
    newcomer_batch: int = 4
    newcomer_longest: int = 16
    # In a batch larger than newcomer_batch a probe drafts the least bad length among those whose step costs at
    # most this many plain steps (one draft if none does). A probe's verify costs every row its k + 1 tokens: on
    # the built-in pair at batch 16 the whole block cost 4.6 plain steps and 2 drafts 1.9, and the few
    # probes a closed loop at concurrency 16 ran cost it a few percent of its throughput. Short drafts still show
    # whether the first positions are accepted, which deep positions' estimates follow (acceptance.py).
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
        self.correction = StepCostCorrection()
        self.table: tuple = ((), None)  # (key, step_table) of the last call
        self.kept, self.kept_key = 0, None  # steps a choice is still kept, for which batch (and evidence: plain)
        self.kept_choice, self.kept_gain = 0, 0.0  # a kept drafting choice, its gain over plain (`best`)
        self.kept_context: tuple = ((), None)  # (key, keeps_context) of the last call
        self.newcomers: NewcomerBackoff | None = None  # which newcomers probe, per prompt-length bucket
        self.crowd: NewcomerBackoff | None = None  # ... its verdicts from large batches, for large batches (`judges`)
        self.crowd_waits = False  # the newcomers' bucket is backed off by large batches' verdicts (not its turn)
        self.admitted: frozenset[int] = frozenset()  # the slots of the last `admit`'s requests
        # Whether a request ending now is judged as one of a small batch, as one stopping in the last `choose`'s
        # batch is (`judging`). Verdicts from a batch of at most `probe.newcomer_batch` back off its bucket's
        # newcomers everywhere (`newcomers`); those from a larger batch only newcomers joining a large batch
        # (`crowd`). A large batch drafts rarely and short (its probes cost at most `large_batch_cost` plain
        # steps: one or two drafts), so its requests' own evidence is mostly the first draft's, a coin flip for
        # the built-in drafter. Counted for every newcomer, a closed loop of snippets at concurrency 16 backed their
        # bucket off to one newcomer in 16 in most repeats, and the concurrency-4 point after it admitted all 24
        # of its requests plain-only in 6 of 8 repeats, offline (benchmarks/results/bucket_verdicts.json).
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
        self.correction = StepCostCorrection()
        self.table = ((), None)  # the cost model may be new
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
        """[K + 1] expected output tokens per second of the whole batch at draft length 0..K."""
        seconds = self.step_seconds(batch)
        tokens = self.acceptance.expected_tokens(batch.slots, batch.remaining)  # [B, K + 1]
        if batch.drafting is not None and not all(batch.drafting):
            tokens = np.where(np.asarray(batch.drafting)[:, None], tokens, 1.0)
        return tokens.sum(0)[: len(seconds)] / seconds

    def choose(self, batch: BatchView) -> int:
        self.judges = self.judging(batch)
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
            plain, drafting = self.correction.factors()
            self.kept_gain = rates[best] / rates[0] * drafting / plain  # the gain at live cost factors of 1
            if self.keeps_drafting(batch):
                self.kept, self.kept_key, self.kept_choice = DRAFT_KEPT_STEPS - 1, (key, None), best
        return best

    def keeps_drafting(self, batch: BatchView) -> bool:
        """Whether the last drafting choice, at the live cost factors now, still beats plain by DRAFT_KEPT_GAIN times
        the margin, with at most a quarter of the requests within a block of their end (whose expected tokens
        shrink with their remaining budget: at concurrency 16 one or more of them are in most steps)."""
        plain, drafting = self.correction.factors()
        ending = sum(r <= batch.max_draft_len for r in batch.remaining)
        gain = self.kept_gain * plain / drafting
        return 4 * ending <= len(batch.slots) and gain >= DRAFT_KEPT_GAIN * self.margin(batch)

    def newcomer_probe(self, batch: BatchView) -> bool:
        """A request joined a batch small enough to probe for it (see ProbeSettings), and it is its turn."""
        return self.newcomer and self.small(batch)

    def small(self, batch: BatchView) -> bool:
        return len(batch.slots) <= self.probe.newcomer_batch

    def judging(self, batch: BatchView) -> bool:
        """Whether requests stopping or ending in this batch are judged as a small batch's (see `judges`)."""
        return self.small(batch)

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
        # the table `choose` read for this step (one per batch size, not one per draft length)
        predicted = self.step_table(rows, context, self.acceptance.max_draft_len)
        self.correction.observe(draft_len, seconds, float(predicted[min(draft_len, len(predicted) - 1)]))

    def step_seconds(self, batch: BatchView) -> np.ndarray:
        """[K + 1] the batch's step seconds at draft length 0..K: calibrated, corrected by what steps measure."""
        return self.correction.apply(self.step_table(len(batch.slots), batch.context, batch.max_draft_len))

    def step_table(self, rows: int, context: int, max_draft_len: int) -> np.ndarray:
        """[K + 1] calibrated seconds at draft length 0..K, at the context rounded down to CONTEXT_STEP tokens
        (a step's cost moves by well under 1 % in that span); the last one kept, so `timed` and the steps of
        a plain run mostly read it instead of interpolating the grid again."""
        key = (rows, context - context % CONTEXT_STEP, max_draft_len)
        if self.table[0] != key:
            self.table = (key, self.cost.step_seconds(*key))
        return self.table[1]

    def drafts_for(self, batch: BatchView) -> bool:
        """Plain-only when plain steps have been best for PLAIN_ONLY_AFTER steps in a row and, with the
        newcomers, even the optimistic acceptance estimate makes every draft length lose to a plain step:
        the drafter's context K/V would be computed for drafts that will not run. The streak keeps a batch that
        alternates plain and drafting steps drafting. A batch of plain-only requests alone probes nothing: once a
        probe is due, newcomers keep their drafter context again (else a server at concurrency 1, whose every
        request arrives alone, would never draft again after one failed probe).
        Newcomers whose prompt-length bucket waits for its turn to probe (newcomers.py: its last requests failed
        in a row) are plain-only whatever the estimates say when no other running request keeps the drafter's
        context: their turn is their probe, and drafting for them alone would cost every row its verify. The
        bucket's rates overstate a newcomer's: an easy request drafts for many steps and adds most of the
        bucket's evidence, a hard one stops after two, so after one easy 1024-token window of the built-in pair
        and three hard ones the optimistic rates still had each new window draft at its first step and again at
        the probe after it (at concurrency 1, 0.96 of plain decoding's rate against 1.01 without that:
        benchmarks/results/newcomer_admission.json). Beside requests that keep the context the estimates decide: those
        requests' drafting steps verify every row's k + 1 tokens anyway. Nor does a due probe of the policy's own hand such newcomers in a small batch the context's upkeep for
        a single drafting step (too few to judge them by). Nothing does where no evidence could make a drafting
        step win (`reachable`)."""
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
        than PLAIN_ONLY_AFTER plain-best steps in a row, counted on a batch of its kind. Newcomers that turn a small
        batch into a large one ask the estimates at the large batch and its margin: a small batch drafts with no
        margin and probes for every newcomer, which says nothing of whether the large one would draft. In the
        served `make demo` a one-wave point's first request was often admitted alone a few steps before the other
        15 (one admission call, then one for the rest); its probe broke the streak and the 15 kept the drafter's
        context beside it, on a CPU where 16 rows of snippets never draft: 739 of the wave's 2032 request-steps
        offline, 18 with this rule (benchmarks/results/lone_first.json; tokens/s moved within a one-wave point's spread)."""
        if self.plain_streak >= PLAIN_ONLY_AFTER:
            return False
        return self.small(batch) or not self.streak_small

    def reachable(self, batch: BatchView) -> bool:
        """Whether any evidence could make a drafting step win in this batch: accepting every draft (a row that keeps
        the drafter's context emits min(k + 1, remaining) tokens, a plain-only row 1), some draft length beats the
        plain step's rate by the batch's margin. Where none does, a probe or a newcomer's drafter context is pure
        cost: on the built-in pair at batch 16 (k drafts cost about 1.8 to 4.4 plain steps at 128 tokens,
        benchmarks/results/reachable_batches.json) a request keeping the context beside 15 plain-only ones emits at
        best 15 + k + 1 tokens in a step that costs what 28 to 70 plain tokens do, and must beat 1.25 times that;
        yet a served closed loop at concurrency 16 probed such batches every repeat
        (benchmarks/results/serve_step_trace/trace.json: 1 to 4 rows of 14-15 keeping it, 10-13 ms each, and those
        rows' plain steps capturing the target's features). On a GPU, whose verify of a block costs
        little more than a plain step, the same batch is reachable. Requests admitted
        plain-only beside the others there stay so (as any plain-only admission does) when the batch later shrinks."""
        seconds = self.step_seconds(batch)  # [K + 1]
        width = np.arange(1, len(seconds) + 1)[None, :]  # [1, K + 1] tokens per row at full acceptance
        tokens = np.minimum(width, np.maximum(np.asarray(batch.remaining)[:, None], 1))  # [B, K + 1]
        if batch.drafting is not None and not all(batch.drafting):
            tokens = np.where(np.asarray(batch.drafting)[:, None], tokens, 1)
        return pick(tokens.sum(0) / seconds, self.margin(batch)) > 0

    def others_keep_context(self, batch: BatchView) -> bool:
        """Whether a running request admitted before the newcomers (the last `admit`) keeps the drafter's context."""
        drafting = batch.drafting or (True,) * len(batch.slots)
        return any(d for slot, d in zip(batch.slots, drafting) if slot not in self.admitted)

    def keeps_context(self, batch: BatchView) -> list[bool]:
        """A request stops paying for the drafter's context once (1) a probe after a plain run has failed since
        the last newcomer's probe or drafting step (the wait has doubled past the first) and `drafts_for` says
        no for the batch, (2) it has drafted in at least two steps of its own (the built-in drafter's first
        draft is a coin flip, and acceptance differs far more between requests than between contexts), or in a
        large batch one, where the next probe would come after its end (`another_probe`), and
        (3) by its own acceptance estimate no draft length would pay even if it decoded alone (the cheapest a
        drafting step gets: a request that would draft alone may yet draft when the batch shrinks), or, in a
        batch larger than `ProbeSettings.newcomer_batch`, none would in a batch of its size whose requests were
        all like it (`pays_in_kind`: it may wait for a shrink that a loaded server does not bring; such a stop
        is no failure for its prompt's bucket, whose newcomers in small batches still probe). Keeping
        its context costs a plain step the captured features it holds; the context K/V of its tokens are
        written at the next drafting step (deferred, speculative/dflash.py), so dropping it saves that
        catch-up and its target features' capture (the context K/V projection is about 6 % of the built-in
        target's FLOPs per token; for Qwen3-8B with a 5-layer drafter about 2 %).
        Any batch: a plain-only request no longer holds the others' drafting back (its row verifies padding
        in their drafting steps; before per-row draft lengths, served at concurrency 4 on snippets, stopping
        at any batch made the DFlash server run 57 % of its steps plain instead of about 30 %)."""
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
                self.verdict(slot, None if a or t < OWN_PROBES else False, self.judging(batch))
            self.kept_context = (key, keep)
        return self.kept_context[1]

    def another_probe(self, batch: BatchView) -> list[bool]:
        """[B] whether each request can still draft in a step of its own before it ends, short of the batch's drafting
        choice: in a small batch at any time (newcomers' probes, no margin); in a large one only if the policy's next
        probe comes within its remaining tokens (plain steps count down both alike, so a kept answer stays true).
        A request with fewer than OWN_PROBES drafting steps keeps the drafter's context only for that step: in
        a large batch whose probes have backed off past its end it would pay the context's upkeep (the target's
        features captured at every step, about 3 % of a 16-row plain step on this project's CPU) for nothing. In
        `make demo`'s one-wave points (16 requests arriving together after the concurrency-8 point's probes
        failed) each wave probed once at admission and then kept the context for all its 128 steps."""
        if self.small(batch):
            return [True] * len(batch.slots)
        until = self.wait - self.plain_run  # plain steps until the next probe (`choose`)
        return [until <= r for r in batch.remaining]

    def pays_alone(self, slots: list[int], remaining: list[int], context: int) -> np.ndarray:
        """[B] bool: by each request's own (optimistic) acceptance estimate, some draft length beats a plain
        step even if it decoded alone at `context` tokens (the cheapest a drafting step gets)."""
        alone = self.correction.apply(self.cost.step_seconds(1, context - context % CONTEXT_STEP,
                                                             self.acceptance.max_draft_len))  # [K + 1] s
        return self.pays(slots, remaining, alone, 1.0)

    def pays(self, slots: list[int], remaining: list[int], seconds: np.ndarray, margin: float) -> np.ndarray:
        """[B] bool: `pick`'s test row by row, on each request's own (optimistic) expected tokens and step seconds
        [K + 1]: some draft length beats a plain step, by `margin`."""
        rates = self.acceptance.expected_tokens(slots, remaining)[:, : len(seconds)] / seconds  # [B, K + 1]
        best, plain = rates[:, 1:].max(axis=1), rates[:, 0]
        return (best > plain) & (best >= margin * plain)

    def pays_in_kind(self, batch: BatchView) -> np.ndarray:
        """[B] bool: by each request's own (optimistic) acceptance estimate, a batch of as many requests as this one,
        each like it, would draft: some draft length beats a plain step by the batch's margin. In a large batch a
        request that would pay alone but not so keeps the drafter's context for a batch that may never shrink: in
        a served closed loop of snippets at concurrency 16 the first wave's requests kept it for most of their
        128 steps (116-238 of a point's ~767 steps), each such step about 3 % slower than the plain server's at the
        same step index (median over 6 repeats +0.16 ms, -0.20 to +0.90: the target's features captured and held,
        the policy's bookkeeping; benchmarks/results/serve_step_trace/trace_77e4b73.json); with this rule 16-138
        (trace_2dd0068.json)."""
        # a row's tokens over the batch's step seconds: its share of the rate of a batch all like it
        return self.pays(batch.slots, batch.remaining, self.step_seconds(batch), self.margin(batch))

    def describe(self) -> dict:
        meta = self.cost.meta if self.cost else {}
        plain, drafting = self.correction.factors()
        return {"policy": self.name, "calibration": {k: meta[k] for k in ("device", "threads") if k in meta},
                "min_gain_above_batch": {"min_gain": self.min_gain, "batch": self.probe.newcomer_batch},
                "live_cost_factors": {"plain": plain, "drafting": drafting},
                "newcomer_probes_backed_off": self.newcomers.describe() if self.newcomers else {},
                "large_batch_newcomers_backed_off": self.crowd.describe() if self.crowd else {}}
