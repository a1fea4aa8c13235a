"""The live draft-length policy on scripted step times and acceptances (no model, no clock).

Every closed-loop test runs the policy and every fixed draft length on the same texts (helpers/policy_sim.py)
and compares tokens per unit of scripted time with the best fixed length chosen in hindsight.
"""

import math

import numpy as np
import pytest

from trtllm_dflash.draft_length.cost import CostModel
from trtllm_dflash.draft_length.policy import AutoDraftLen, FixedDraftLen, ScheduledDraftLen, best_length
from trtllm_dflash.draft_length.schedule import DraftLenSchedule
from trtllm_dflash.draft_length.step_times import StepTimes, analytic_shape, stored_shape
from helpers.policy_sim import K, best_fixed, prepared, simulate, view


def cpu(step, rows, k):
    """A CPU-like step: a drafting step costs 1.6 plain ones plus 2 % a draft."""
    return 1.0 if k == 0 else 1.6 + 0.02 * k


def check(seconds, easy, seeds=range(4), **kw):
    for seed in seeds:
        k, best = best_fixed(seconds, easy, seed=seed, **kw)
        auto = simulate(AutoDraftLen(), seconds, easy, seed=seed, **kw)
        plain = simulate(FixedDraftLen(0), seconds, easy, seed=seed, **kw)
        assert auto >= 0.95 * best, (seed, k, auto, best)
        if k > 0:
            assert auto >= plain, (seed, auto, plain)


def test_a_hard_opening_then_an_easy_stretch_is_drafted_again():
    """32 tokens the drafter rarely gets, then text it gets 9 times in 10: the opening's rejections fade and the
    policy drafts the easy stretch."""
    check(cpu, lambda t: 0.1 if t < 32 else 0.9)


def test_a_machine_that_turns_twice_as_slow_mid_run():
    check(lambda step, rows, k: cpu(step, rows, k) * (2.0 if step >= 100 else 1.0), lambda t: 0.7, tokens=512)


def test_drafting_that_turns_dear_mid_run_is_given_up():
    """Another process takes the cores a drafting step needs: it costs 3 plain steps from step 60 on."""
    check(lambda step, rows, k: cpu(step, rows, k) if step < 60 or k == 0 else 3.0 + 0.1 * k, lambda t: 0.6)


def test_a_batch_whose_verify_costs_more_than_its_tokens_stops_drafting():
    """16 rows: a step of k drafts costs 1.5 + 1.1 k plain steps, more than the k + 1 tokens a row could gain."""
    def dear(step, rows, k):
        return 1.0 if k == 0 else 1.5 + 1.1 * k

    check(dear, lambda t: 0.9, seeds=range(2), rows=16, requests=96, tokens=96)


def test_a_served_batch_drafts_where_its_rows_pay():
    def gpu(step, rows, k):  # verify nearly free in tokens, the drafter's pass a fifth of a step
        return 1.0 + 0.2 * (k > 0) + 0.01 * k * rows

    check(gpu, lambda t: 0.7, rows=8, requests=64, tokens=96)


def test_poor_acceptance_at_batch_one_stays_near_plain():
    check(cpu, lambda t: 0.05)


def test_step_times_follow_what_runs_and_a_stale_kind_looks_cheap_not_dear():
    times = StepTimes(analytic_shape(K))
    for _ in range(3):
        times.observe(1, 0, 0.010)
        times.observe(1, K, 0.030)
    assert math.exp(times.log_seconds(0)[K] - times.log_seconds(0)[0]) == pytest.approx(3.0, rel=0.05)
    for _ in range(10):  # twice as slow while only drafting steps run: drafting now looks dearer than plain ...
        times.observe(1, K, 0.060)
    seconds = np.exp(times.log_seconds(0))
    assert seconds[K] == pytest.approx(0.060, rel=0.02) and seconds[0] == pytest.approx(0.010)
    for _ in range(8):  # ... so plain steps run, and show the slowdown within a few
        times.observe(1, 0, 0.020)
    assert math.exp(times.log_seconds(0)[0]) == pytest.approx(0.020, rel=0.15)
    # a drafting length not run keeps the prior's ratio to the one run (1.66 / 1.9 plain steps)
    assert seconds[3] / seconds[K] == pytest.approx(1.66 / 1.9)
    times.observe(1, K, 6.0)  # one stray step moves the estimate by at most log 2 x (its gains)
    assert math.exp(times.log_seconds(0)[K]) < 0.060 * 1.5


def test_a_stored_calibration_is_only_a_prior():
    """A stored model that says drafting is nearly free, on a machine where it costs 4 plain steps: after one
    step of each kind the policy prices what it measured."""
    lens = tuple(range(K + 1))
    model = CostModel((1, 16), lens, (128,), [[[0.01 + 1e-5 * k for k in lens]] * 2])
    policy = prepared(1, prior=lambda generator: model)
    assert np.allclose(policy.times.shape, stored_shape(model, K))
    policy.timed(1, 100, 0, 0.01)
    policy.timed(1, 100, K, 0.04)
    assert math.exp(policy.times.log_seconds(0)[K]) == pytest.approx(0.04)
    assert math.exp(policy.times.log_seconds(0)[0]) == pytest.approx(0.01)


def test_the_first_step_of_a_batch_size_is_plain_then_the_evidence_decides():
    policy = prepared(4)
    assert policy.choose(view([0])) == 0
    policy.timed(1, 100, 0, 0.01)
    assert policy.choose(view([0])) > 0  # the pooled prior: drafting may pay, so it is tried
    policy.timed(1, 100, K, 0.016)
    for _ in range(6):  # every draft rejected
        policy.observe([0], K, [0])
    assert policy.choose(view([0])) == 0
    assert policy.choose(view([0], remaining=[1])) == 0  # nothing left to draft for


def test_rows_near_their_end_or_plain_only_count_no_drafts():
    policy = prepared(4)
    mean, _ = policy.acceptance.tokens([0, 1], [1, 3])
    assert np.all(mean[0] == 1.0) and np.all(mean[1, 3:] == mean[1, 2]) and mean[1, 2] > mean[1, 1] > 1.0


def test_evidence_for_a_position_comes_from_every_step_that_drafted_it():
    policy = prepared(2)
    policy.observe([0, 1], 4, [2, 4])  # slot 0: 1, 2 accepted, 3 rejected; slot 1: all 4 accepted
    trials, hits = policy.acceptance.counts
    assert trials[0, :5].tolist() == [1, 1, 1, 0, 0] and hits[0, :5].tolist() == [1, 1, 0, 0, 0]
    assert trials[1, :5].tolist() == [1, 1, 1, 1, 0] and hits[1, :5].tolist() == [1, 1, 1, 1, 0]
    policy.observe([0, 1], 0, [0, 0])  # a plain step: evidence fades, nothing added
    assert policy.acceptance.counts[0, 0, 0] < 1.0


def test_admission_and_context_stop_where_full_acceptance_cannot_beat_plain():
    policy = prepared(16)
    rows = list(range(16))
    policy.timed(16, 100, 0, 0.01)
    assert policy.drafts_for(view(rows))  # the prior: not measured yet
    policy.timed(16, 100, K, 0.01 * 40)  # 40 plain steps for at most 16 tokens a row
    assert not policy.drafts_for(view(rows)) and policy.keeps_context(view(rows)) == [False] * 16
    assert policy.drafts_for(view([0]))  # alone it may still pay: another bucket


def test_best_length_prefers_the_shorter_and_plain_on_ties():
    assert best_length([0, 3, 7], [10.0, 12.0, 12.0]) == 3
    assert best_length([0, 3], [10.0, 10.0]) == 0


def test_fixed_and_scheduled_policies():
    assert FixedDraftLen(5).choose(view([0])) == 5 and FixedDraftLen(99).choose(view([0])) == K
    assert not FixedDraftLen(0).drafts_for(view([0]))
    schedule = ScheduledDraftLen(DraftLenSchedule(((1, 15), (8, 7))))
    assert [schedule.choose(view(range(b))) for b in (1, 4, 9)] == [15, 7, 0]
