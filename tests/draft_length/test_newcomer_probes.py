"""Newcomers' probes per prompt-length bucket: back-off, restarts, and when a newcomer keeps the drafter context."""

import random


from trtllm_dflash.draft_length.acceptance import context_buckets
from trtllm_dflash.draft_length.cost import CostModel
from trtllm_dflash.draft_length.newcomers import NewcomerBackoff
from trtllm_dflash.draft_length.policy import (
    MIN_GAIN,
    PLAIN_ONLY_AFTER,
    BatchView,
    CostBasedDraftLen,
    ProbeSettings,
)
from helpers.policy_sim import K, feed, linear_cost, prepared, view


def test_newcomer_probes_back_off_per_bucket_after_two_failures_and_restart_on_a_success():
    """One newcomer in 2^(n-1) probes after n >= 2 failures in a row (at most one in `longest`); each bucket
    keeps its own count; a request that pays restarts its bucket; unjudged requests change nothing."""
    backoff = NewcomerBackoff(num_slots=4, longest=4)
    probes = []
    for _ in range(12):  # 1024-token requests: each one that probes fails, the others end unjudged
        probes.append(backoff.admit([0], [1024]))
        backoff.judged(0, paid=False) if probes[-1] else backoff.forget(0)
    #               n = 0, 1   n = 2        n = 3: 1 in 4   n >= 4: at most 1 in 4
    assert probes == [True, True, False, True, False, False, False, True, False, False, False, True]
    assert backoff.admit([1], [100]) is True  # a short prompt's bucket has no failures
    backoff.forget(1)
    assert backoff.describe() == {"1024": 4}
    assert backoff.admit([2], [1100]) is False  # same bucket [1024, 2048): waits
    backoff.move(2, 3)  # the generator moved the request: its judgement follows it
    backoff.judged(2, paid=True)  # nothing left in slot 2
    assert backoff.every(context_buckets([1024])[0]) == 4
    backoff.judged(3, paid=True)
    assert backoff.describe() == {} and backoff.admit([0], [1024]) is True
    backoff.judged(0, paid=True)
    backoff.judged(0, paid=False)  # judged once per request: a second call does nothing
    assert backoff.admit([0], [1024]) is True


def test_a_bucket_that_mostly_paid_lately_is_not_backed_off_by_a_run_of_hard_requests():
    """Eight requests of a bucket paid, then four failed in a row: its decayed verdicts (0.9 per verdict) still
    paid as often as they failed (3.74 against 3.44), so every newcomer probes; a fifth failure tips them (3.36
    against 4.10) and the run of five backs it off to one newcomer in `longest`. A bucket with no history backs
    off after two failures, as before (`make demo`'s snippets: four hard ones in a row held a point plain). Large
    batches' back-off keeps the run rule alone."""
    backoff = NewcomerBackoff(num_slots=2, longest=4)
    for paid in [True] * 8 + [False] * 4:
        assert backoff.admit([0], [100]) is True
        backoff.judged(0, paid)
    assert backoff.every(0) == 1 and backoff.describe() == {}
    backoff.admit([0], [100])
    backoff.judged(0, False)
    assert backoff.describe() == {"0": 4}
    fresh = NewcomerBackoff(num_slots=2, longest=4)
    for _ in range(2):
        fresh.admit([0], [100])
        fresh.judged(0, False)
    assert fresh.describe() == {"0": 2}
    streak = NewcomerBackoff(num_slots=2, longest=4, history=False)  # large batches' back-off: the run alone
    for paid in [True] * 8 + [False] * 4:
        streak.admit([0], [100])
        streak.judged(0, paid)
    assert streak.describe() == {"0": 4}
    assert prepared(linear_cost(plain=1.0, per_draft=0.1)).crowd.use_history is False


def serve_alone(policy, slot: int, context: int, alpha: float, steps: int, seed: int) -> bool:
    """One request alone, the way the generator runs it: admitted (drafting as `drafts_for` says), each step
    the policy's draft length unless it is plain-only, its drafter context dropped when `keeps_context` says,
    released at the end; each draft accepted with probability alpha. -> whether it was admitted drafting."""
    rng = random.Random(seed)
    policy.admit([slot], [context])
    admitted = drafting = policy.drafts_for(view([slot], context))
    for step in range(steps):
        batch = BatchView([slot], context + step, [steps - step], K, None if drafting else (False,))
        k = policy.choose(batch) if drafting else 0
        if drafting and k == 0 and policy.keeps_context(batch) == [False]:
            drafting = False
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        policy.observe([slot], k, [accepted], None if drafting or k == 0 else [False])
    policy.release(slot, drafting)
    return admitted


def test_a_newcomer_waiting_for_its_buckets_turn_is_plain_only_where_the_buckets_rates_favour_drafting():
    """One easy 1024-token request drafts for its whole length and pays; the two hard ones after it stop after a
    couple of drafting steps and fail. The bucket's pooled rates are still mostly the easy one's, and say that a
    newcomer should draft, yet two failures in a row back the bucket off: the next newcomer is admitted plain-only
    where no other running request keeps the drafter's context, the one after it (its turn) probes. Without the back-off taking precedence every newcomer drafted on those
    rates (the served 1024-token point at concurrency 1 lost about 3 % so)."""
    policy = prepared(linear_cost(plain=1.0, per_draft=0.03, draft_overhead=0.5))
    assert serve_alone(policy, 0, 1024, 0.95, 128, seed=1)  # drafted the whole way, paid
    assert [serve_alone(policy, 0, 1024, 0.0, 64, seed) for seed in (2, 3)] == [True, True]  # probed, failed
    assert policy.describe()["newcomer_probes_backed_off"] == {"1024": 2}
    policy.admit([2], [100])  # a short request, admitted earlier: its bucket has no failures
    policy.admit([1], [1024])
    rates = policy.expected_rates(view([1], 1024))  # [K + 1] tokens/s: the newcomer planned on its bucket's rates
    assert rates[1:].max() > 1.2 * rates[0]  # drafting looks a fifth better than a plain step
    assert policy.drafts_for(view([1], 1024)) is False  # alone
    assert policy.drafts_for(BatchView([2, 1], 1024, [1000, 1000], K, (False, True))) is False  # beside a plain-only one
    # beside a request that keeps the drafter's context its drafting steps verify the newcomer's row anyway: the
    # estimates decide
    assert policy.drafts_for(BatchView([2, 1], 1024, [1000, 1000], K)) is True
    policy.release(1, drafting=False)
    policy.admit([1], [1024])  # one in 2^(2 - 1): this one's turn
    assert policy.drafts_for(view([1], 1024)) is True and policy.choose(view([1], 1024)) > 0


def test_hard_prompt_lengths_stop_paying_for_newcomer_probes_and_easy_ones_restart_them():
    """Concurrency 1: every 1024-token request is hard (nothing accepted). Without the back-off (newcomer_longest
    1) each one is admitted with the drafter's context and probes; with it, after two failures most are admitted
    plain-only. Short requests beside them still probe every time. An easy long request, once one drafts (a
    probe of the policy's own, or its bucket's turn), restarts its bucket's probes."""
    cost = linear_cost(plain=1.0, per_draft=0.03, draft_overhead=0.5)
    counts = {}
    for longest in (1, 16):
        policy = prepared(cost, probe=ProbeSettings(newcomer_longest=longest))
        counts[longest] = [serve_alone(policy, 0, 1024, 0.0, 128, seed) for seed in range(24)]
    assert all(counts[1])
    assert counts[16][:2] == [True, True] and sum(counts[16]) <= 8
    assert policy.describe()["newcomer_probes_backed_off"] == {"1024": 16}
    assert [serve_alone(policy, 0, 100, 0.0, 32, seed) for seed in range(2)] == [True, True]  # their own count
    easy = [serve_alone(policy, 0, 1024, 0.95, 128, 100 + seed) for seed in range(20)]
    first = easy.index(True)
    assert first < 16 and all(easy[first:])  # it paid: every newcomer of the bucket probes again
    assert policy.describe()["newcomer_probes_backed_off"] == {"0": 2}  # the two hard short ones' bucket


def test_a_batch_that_could_not_win_even_accepting_every_draft_neither_probes_nor_keeps_a_newcomers_context():
    """A probe is evidence for a later choice. In a batch of 16 whose other 15 requests are plain-only, on a CPU-like
    cost (k drafts: 1.9 + 0.1 k plain steps), even every draft of the one request keeping the drafter's context
    accepted would not make a drafting step beat a plain one by the margin: its due probe does not run (and backs
    off like a failed one) and a newcomer is admitted plain-only. With all 16 keeping it, or on a GPU-like flat cost,
    the same probe runs and newcomers keep the context."""
    cpu = linear_cost(plain=1.0, per_draft=0.1, draft_overhead=0.9)
    gpu = linear_cost(plain=1.0, per_draft=0.01)
    slots = list(range(16))
    one = tuple([False] * 15 + [True])
    for cost, drafting, reachable in ((cpu, one, False), (cpu, None, True), (gpu, one, True), (gpu, None, True)):
        policy = prepared(cost, probe=ProbeSettings(first=4))
        feed(policy.acceptance, slots, 0.0, steps=30)  # nothing accepted: plain is best, probes run when due
        batch = BatchView(slots, 100, [1000] * 16, K, drafting)
        assert policy.drafts_for(batch) is reachable  # the plain streak is short: only reachability says no
        choices = []
        for _ in range(20):
            k = policy.choose(batch)
            choices.append(k)
            policy.observe(slots, k, [0] * 16, list(drafting) if drafting and k else None)
        probes = [i for i, k in enumerate(choices) if k]
        assert (probes == [3, 11]) if reachable else (probes == [] and policy.wait == 32)  # waits 4, 8; 4, 8, 16, 32


def test_in_a_large_batch_a_request_stops_keeping_the_drafter_context_where_its_kind_would_not_draft_there():
    """Requests that accept their first draft and never a second, on a cost where one draft takes 1.7 plain steps at
    any batch size: drafting pays alone (2 tokens for 1.7 steps) but not by the margin a batch of 16 needs. Once a
    probe after the plain run fails they stop keeping the drafter's context in a batch of 16; a batch of 4 drafts and
    keeps it; their prompt-length bucket is not backed off for it (its newcomers in small batches still probe)."""
    cost = linear_cost(plain=1.0, per_draft=0.2, draft_overhead=0.5)
    for size, kept in ((16, False), (4, True)):
        policy = prepared(cost, probe=ProbeSettings(first=4))
        slots = list(range(size))
        policy.admit(slots, [100] * size)
        for _ in range(40):  # probes (the first draft accepted), plain runs between them
            k = policy.choose(view(slots))
            policy.observe(slots, k, [min(k, 1)] * size)
        assert all(policy.acceptance.tried[slots, 0] >= 1.5) and all(policy.pays_alone(slots, [1000] * size, 100))
        if size == 16:  # its probes failed (plain runs back off) and its kind would not draft at this size
            assert policy.wait > policy.probe.first and not any(policy.pays_in_kind(view(slots)))
        else:  # a batch of 4 needs no margin: it drafts on
            assert policy.choose(view(slots)) == 1
        assert policy.keeps_context(view(slots)) == [kept] * size
        assert policy.describe()["newcomer_probes_backed_off"] == {}


def test_in_a_large_batch_one_probe_keeps_the_drafter_context_only_where_another_probe_can_come():
    """A wave of 16 requests joins after the batch's probes have failed long enough to back off to 512 plain steps,
    on a cost where drafting loses at 16 rows. Their probe at admission rejects every draft. A request with fewer
    than OWN_PROBES drafting steps normally keeps the drafter's context for its next one; in a large batch, one
    that ends before the next probe, 1024 plain steps away (100 tokens left), drops it now; one that will see it
    (2000 left) keeps it.
    Too few drafting steps to judge: the drop backs off no newcomers (`make demo`'s one-wave points kept the
    context for all 128 steps of each request before)."""
    cost = linear_cost(plain=1.0, per_draft=0.2, draft_overhead=0.5)
    slots = list(range(16))
    for remaining, kept in ((100, False), (2000, True)):
        policy = prepared(cost, probe=ProbeSettings(first=4))
        policy.admit(slots, [100] * 16)
        while policy.wait < 512:  # probes fail, the back-off doubles: 4, 8, ..., 512
            policy.observe(slots, policy.choose(view(slots)), [0] * 16)
        while policy.plain_run + 1 < policy.wait:  # plain steps until a probe is due
            policy.observe(slots, 0, [0] * 16)
        policy.admit(slots, [100] * 16)  # a new wave in the same slots
        k = policy.choose(view(slots, remaining=[remaining] * 16))
        assert k > 0  # the due probe
        policy.observe(slots, k, [0] * 16)
        batch = view(slots, 101, [remaining - 1] * 16)
        assert policy.choose(batch) == 0 and policy.wait == 1024
        assert all(policy.acceptance.tried[slots, 0] < 1.5)
        assert policy.keeps_context(batch) == [kept] * 16
        assert policy.describe()["large_batch_newcomers_backed_off"] == {}


def test_large_batches_verdicts_back_off_only_newcomers_of_large_batches():
    """A request that ends keeping the drafter's context after failing drafts is a failure for its prompt's
    bucket. Two in a row in a batch of at most newcomer_batch back off that bucket's newcomers everywhere; in a
    batch of 16, whose own drafting is rare and short, only newcomers joining a large batch (plain-only there
    where nobody else keeps the context), while a newcomer of a small batch still probes. Counted for every batch,
    the verdicts of a closed loop at concurrency 16 admitted the next concurrency-4 point plain-only
    (benchmarks/bucket_verdicts.py)."""
    cost = linear_cost(plain=1.0, per_draft=0.05, draft_overhead=0.2, per_batch=0.0)

    def fail_and_end(policy, slots):
        policy.admit(slots, [100] * len(slots))
        policy.choose(view(slots))
        for _ in range(2):  # two own drafting steps, nothing accepted: tried[slot, 0] = 1.9 >= OWN_PROBES
            policy.observe(slots, 2, [0] * len(slots))
        for slot in slots:
            policy.release(slot, drafting=True)

    large = prepared(cost)
    fail_and_end(large, list(range(16)))
    fail_and_end(large, list(range(16)))
    described = large.describe()
    assert described["newcomer_probes_backed_off"] == {}
    assert described["large_batch_newcomers_backed_off"] == {"0": 16}
    large.admit([0, 1], [100, 100])
    assert large.newcomer_probe(view([0, 1]))  # a newcomer in a small batch still probes
    large.choose(view([0, 1]))
    large.admit(list(range(16)), [100] * 16)
    assert large.drafts_for(view(range(16))) is False  # newcomers of a large batch: plain-only
    small = prepared(cost)
    fail_and_end(small, [0, 1])
    fail_and_end(small, [0, 1])
    assert small.describe()["newcomer_probes_backed_off"] == {"0": 8}  # four failures: one newcomer in 2^3
    assert small.describe()["large_batch_newcomers_backed_off"] == {}


def cpu_like_cost() -> CostModel:
    """Drafting pays alone (k drafts: 1.3 + 0.05 k plain steps at one row) but costs a 16-row verify every row's
    k + 1 tokens (2 + 0.5 k plain-row units over a plain step of 2), as the built-in pair's steps do on a CPU."""
    lens = tuple(range(K + 1))
    one = [1.0 + (0.3 + 0.05 * k if k else 0.0) for k in lens]
    sixteen = [2.0 + (2.0 + 0.5 * k if k else 0.0) for k in lens]
    return CostModel((1, 16), lens, (128, 1024), [[one, sixteen], [one, sixteen]])


def test_newcomers_that_make_a_small_batch_large_keep_the_drafter_context_only_where_the_large_batch_would_draft():
    """A wave of 16 whose first request arrived alone a few steps before the rest (two admission calls, as the
    served `make demo` showed): alone it probes and drafts (no margin), so the plain streak is short; the other 15
    then join. Asked at 16 rows and the margin, the estimates say no draft length pays, so they join plain-only
    instead of keeping the drafter's context on the small batch's streak (before: about 740 request-steps of the
    wave kept it, offline). The first keeps its own; with 15 plain-only rows beside it the batch cannot draft. A
    large batch's own short streak still keeps its newcomers' context, and the same arrival on a cost where 16 rows
    draft keeps it too."""
    policy = prepared(cpu_like_cost())
    policy.admit([0], [100])
    rng = random.Random(0)
    for _ in range(3):  # alone: its probe, then its own drafting (accepting about 0.6 of each draft)
        k = policy.choose(view([0]))
        accepted = 0
        while accepted < k and rng.random() < 0.6:
            accepted += 1
        policy.observe([0], k, [accepted])
        assert k > 0
    assert policy.plain_streak < PLAIN_ONLY_AFTER
    policy.admit(list(range(1, 16)), [100] * 15)
    wave = view(range(16))
    assert pick_rate_ratio(policy, wave) < MIN_GAIN  # the estimates at 16 rows: no draft length pays by the margin
    assert policy.drafts_for(wave) is False
    mixed = BatchView(list(range(16)), 103, [125] + [127] * 15, K, (True,) + (False,) * 15)
    assert policy.choose(mixed) == 0 and policy.keeps_context(mixed)[0] is True
    for _ in range(3):  # the large batch's own choices: its streak is its own, and short
        policy.observe(list(range(16)), policy.choose(mixed), [0] * 16, None)
    policy.admit([15], [100])  # a newcomer replaces one of them
    assert policy.streak_holds(view(range(16))) and policy.drafts_for(view(range(16))) is True
    flat = prepared(linear_cost(plain=1.0, per_draft=0.01))  # a GPU-like verify: 16 rows draft too
    flat.admit([0], [100])
    for _ in range(3):
        flat.observe([0], flat.choose(view([0])), [2])
    flat.admit(list(range(1, 16)), [100] * 15)
    assert flat.drafts_for(view(range(16))) is True


def pick_rate_ratio(policy: CostBasedDraftLen, batch: BatchView) -> float:
    """The best drafting length's expected tokens/s over the plain step's, from the policy's own estimates."""
    rates = policy.expected_rates(batch)
    return float(rates[1:].max() / rates[0])
