"""Live correction of the calibrated step cost: bounded, shrunk, and deaf to noise inside its own spread."""

import random

import numpy as np
import pytest

from trtllm_dflash.draft_length.policy import (
    DRAFT_KEPT_STEPS,
    PLAIN_ONLY_AFTER,
    ProbeSettings,
)
from helpers.policy_sim import K, feed, linear_cost, prepared, view


def test_live_correction_learns_each_kind_bounded_and_shrunk():
    import math

    from trtllm_dflash.draft_length.live_cost import CorrectionSettings, StepCostCorrection

    c = StepCostCorrection(CorrectionSettings(decay=0.9, prior_weight=1.0, bounds=(0.5, 3.0), noise=0.0))
    assert c.factors() == (1.0, 1.0)
    c.observe(4, measured_s=2.0, predicted_s=1.0)  # one drafting step at twice its prediction
    plain, drafting = c.factors()
    assert plain == 1.0 and drafting == pytest.approx(math.exp(math.log(2.0) / 2))  # shrunk: 1 step vs 1 prior
    for _ in range(200):
        c.observe(0, 0.9, 1.0)
        c.observe(7, 2.0, 1.0)
    plain, drafting = c.factors()
    # steady state: 10 decayed steps of evidence beside 1 prior step of ratio 1
    assert plain == pytest.approx(0.9 ** (10 / 11)) and drafting == pytest.approx(2.0 ** (10 / 11))
    c.observe(7, 1000.0, 1.0)  # a stray step counts as bounds[1] = 3x, not 1000x
    assert c.factors()[1] == pytest.approx(math.exp((9 * math.log(2.0) + math.log(3.0)) / 11))
    corrected = c.apply(np.array([1.0, 2.0, 3.0]))
    assert corrected[0] == pytest.approx(plain) and list(corrected[1:] / np.array([2.0, 3.0])) == \
        pytest.approx([c.factors()[1]] * 2)


def test_measured_steps_turn_a_policy_that_drafts_on_an_underestimated_cost_to_plain():
    """Calibrated: a draft of any length costs 1.2 plain steps, so at acceptance 0.5 (E[tokens] ~ 2) drafting
    wins. Served, drafting steps take 3x their calibrated seconds and plain steps what was calibrated: once the
    policy has timed a few of each it decodes plainly, as the true costs say it should."""
    cost = linear_cost(plain=1.0, per_draft=0.0, draft_overhead=0.2)
    policy = prepared(cost, probe=ProbeSettings(first=10**9))
    feed(policy.acceptance, [0], 0.5, steps=50)
    assert policy.choose(view([0])) > 0
    for _ in range(20):
        policy.timed(1, 100, 8, 3 * 1.2)
        policy.timed(1, 100, 0, 1.0)
    assert policy.choose(view([0])) == 0
    weight = (1 - 0.9 ** 20) / (1 - 0.9)  # 20 timed drafting steps, decayed, beside 1 prior step
    assert policy.describe()["live_cost_factors"]["drafting"] == pytest.approx(3.0 ** (weight / (weight + 1)))


def reference_log_factor(ratios, decay, prior_weight, bounds, noise):
    """Independent reference for one kind's live factor: explicit weights decay^age, the weighted mean of the log
    ratios shrunk by prior_weight pseudo-steps of 0, minus `noise` standard errors (Kish effective steps)."""
    import math

    x = [math.log(min(bounds[1], max(bounds[0], r))) for r in ratios]
    w = [decay ** (len(x) - 1 - i) for i in range(len(x))]
    total, weight = sum(a * b for a, b in zip(w, x)), sum(w)
    shrunk = total / (weight + prior_weight)
    if noise == 0:
        return shrunk
    if len(x) < 2:
        return 0.0
    mean = total / weight
    effective = weight ** 2 / sum(a * a for a in w)
    variance = sum(a * (b - mean) ** 2 for a, b in zip(w, x)) / weight * effective / (effective - 1)
    band = noise * math.sqrt(variance / effective)
    return math.copysign(max(abs(shrunk) - band, 0.0), shrunk)


@pytest.mark.parametrize("noise", [0.0, 2.0])
def test_live_correction_matches_a_reference_and_ignores_evidence_inside_its_own_spread(noise):
    import math

    from trtllm_dflash.draft_length.live_cost import CorrectionSettings, StepCostCorrection

    settings = CorrectionSettings(decay=0.9, prior_weight=1.0, bounds=(0.5, 3.0), noise=noise)
    rng = random.Random(1)
    for ratios in ([2.0], [2.0, 2.0], [1.3, 0.8, 1.6, 0.9, 1.1], [rng.lognormvariate(0.2, 0.3) for _ in range(40)],
                   [5.0, 0.1, 1.0]):
        c = StepCostCorrection(settings)
        for r in ratios:
            c.observe(3, measured_s=r * 0.01, predicted_s=0.01)
        want = reference_log_factor(ratios, 0.9, 1.0, (0.5, 3.0), noise)
        assert c.factors()[0] == 1.0 and math.log(c.factors()[1]) == pytest.approx(want, abs=1e-6)
    if noise:
        c = StepCostCorrection(settings)
        c.observe(0, 2.0, 1.0)  # one step: no spread known, no correction
        assert c.factors() == (1.0, 1.0)
        for r in (1.3, 0.8, 1.6, 0.9, 1.1):  # a busy machine's steps around the calibration: inside their spread
            c.observe(0, r, 1.0)
        assert c.factors() == (1.0, 1.0)
        for _ in range(20):  # a steady 2x overrun (served overhead): learned nearly as the plain shrunk mean
            c.observe(5, 2.0 * rng.uniform(0.97, 1.03), 1.0)
        assert 1.8 < c.factors()[1] < 2.0 ** (10 / 11) * 1.03


@pytest.mark.parametrize("noise", [0.0, 2.0])
def test_a_busy_machines_step_noise_does_not_flip_a_clear_drafting_choice(noise, monkeypatch):
    """Calibrated: drafting at acceptance 0.7 beats plain by about 1.25x. Timed steps then scatter around the
    calibration with no bias (log-normal, sigma 0.5: another process's load comes and goes). The noise-blind
    correction (noise 0) follows a run of slow drafting steps to plain, and there it stays until a drafting step
    is timed again (plain choices are kept, no probe is due): in 6 seeded runs of 300 steps it ran hundreds of
    plain steps. With its dead band every step drafts, as the unbiased truth says it should."""
    from trtllm_dflash.draft_length.live_cost import CorrectionSettings, StepCostCorrection

    monkeypatch.setattr("trtllm_dflash.draft_length.step_costs.StepCostCorrection",
                        lambda: StepCostCorrection(CorrectionSettings(noise=noise)))
    cost = linear_cost(plain=1.0, per_draft=0.05, draft_overhead=1.6)
    seconds, plain_steps = cost.step_seconds(1, 100, K), 0
    for seed in range(6):
        policy = prepared(cost, probe=ProbeSettings(first=10**9))
        feed(policy.acceptance, [0], 0.7, steps=50)
        rates = policy.expected_rates(view([0]))
        assert 1.2 < rates[1:].max() / rates[0] < 1.3
        rng = random.Random(seed)
        for _ in range(300):
            k = policy.choose(view([0]))
            plain_steps += k == 0
            policy.timed(1, 100, k, seconds[k] * rng.lognormvariate(0.0, 0.5))
    assert (plain_steps == 0) if noise else (plain_steps > 100)

def rejections_until_plain(policy, batch: int, steps: int = 200) -> tuple[int, int]:
    """A batch drafting at acceptance 0.9 for 40 steps, then rejecting every draft: -> (the first step of the
    second phase that chose plain, how often the first phase evaluated the expected rates)."""
    rng, evaluations = random.Random(0), []
    real = policy.expected_rates
    policy.expected_rates = lambda view_: evaluations.append(1) or real(view_)
    rows = list(range(batch))
    for _ in range(40):
        k = policy.choose(view(rows))
        accepted = []
        for _ in rows:
            n = 0
            while n < k and rng.random() < 0.9:
                n += 1
            accepted.append(n)
        policy.observe(rows, k, accepted)
    first_phase = len(evaluations)
    for step in range(steps):
        k = policy.choose(view(rows))
        if k == 0:
            return step, first_phase
        policy.observe(rows, k, [0] * batch)  # whatever k, only position 1 is reached and rejected
    return steps, first_phase


@pytest.mark.parametrize("batch", [1, 16])
def test_a_clear_drafting_choice_is_kept_a_few_steps_and_given_up_as_late_as_that(batch, monkeypatch):
    """Where drafting clearly wins, the policy evaluates the expected rates about once in DRAFT_KEPT_STEPS steps (each
    evaluation runs cold between steps); when the drafts start failing it turns plain at most DRAFT_KEPT_STEPS - 1
    steps later than a policy that evaluates every step (rejected steps teach the same whatever their k)."""
    cost = linear_cost(plain=1.0, per_draft=0.01, draft_overhead=0.2, per_batch=0.05)
    kept_at, kept_evaluations = rejections_until_plain(prepared(cost), batch)
    monkeypatch.setattr("trtllm_dflash.draft_length.policy.DRAFT_KEPT_STEPS", 1)
    every_at, every_evaluations = rejections_until_plain(prepared(cost), batch)
    assert DRAFT_KEPT_STEPS > 1 and every_evaluations == 40 and kept_evaluations <= 40 // DRAFT_KEPT_STEPS + 1
    assert 0 < every_at <= kept_at <= every_at + DRAFT_KEPT_STEPS - 1


def test_a_kept_drafting_choice_ends_with_the_batch_or_an_admission():
    cost = linear_cost(plain=1.0, per_draft=0.01, draft_overhead=0.2, per_batch=0.05)
    policy = prepared(cost)
    feed(policy.acceptance, [0, 1], 0.9, steps=30)
    evaluations = []
    real = policy.expected_rates
    policy.expected_rates = lambda view_: evaluations.append(1) or real(view_)
    assert policy.choose(view([0, 1])) > 0 and len(evaluations) == 1
    assert policy.choose(view([0, 1])) > 0 and len(evaluations) == 1  # kept
    policy.choose(view([0]))  # the batch changed
    assert len(evaluations) == 2
    policy.choose(view([0, 1]))
    policy.choose(view([0, 1]))  # kept again
    assert len(evaluations) == 3
    policy.admit([1], [100])  # a new request in slot 1: the same slots, another batch
    policy.choose(view([0, 1]))
    assert len(evaluations) == 4
    policy.choose(view([0, 1], remaining=[5, 1000]))  # half the batch within a block of its end
    assert len(evaluations) == 5


def test_plain_only_admission_gives_way_when_a_probe_is_due():
    """At concurrency 1 every request arrives alone. Admitted plain-only, it forces plain steps, and a probe
    runs only when every running request drafts: without giving way the policy would never draft again. Its
    forced plain steps count toward the probe's wait; once the probe is due a newcomer keeps its drafter
    context, the next step probes, and a good drafter is found again."""
    steep = linear_cost(plain=1.0, per_draft=0.0, draft_overhead=1.5)  # drafting pays only at high acceptance
    policy = prepared(steep, slots=1, probe=ProbeSettings(first=8, longest=64))
    k, steps = 0, 0
    while k == 0 or policy.plain_streak < PLAIN_ONLY_AFTER:  # plain steps and failed probes, up to a probe
        k = policy.choose(view([0]))
        policy.observe([0], k, [0])
        steps += 1
    assert steps < 200 and policy.wait > 8  # the probes backed off
    assert policy.drafts_for(view([0])) is False  # the newcomer is admitted plain-only
    for _ in range(policy.wait - 2):
        policy.plain_only_step()  # its forced plain steps (the generator asks nothing and reports only this)
        assert policy.drafts_for(view([0])) is False
    policy.plain_only_step()
    assert policy.drafts_for(view([0])) is True  # the probe is due: the next newcomer drafts
    k = policy.choose(view([0]))
    assert k > 0  # ... and its first step is the probe
    for _ in range(60):  # the drafter now accepts everything: the probes find it
        policy.observe([0], k, [k])
        k = policy.choose(view([0]))
    assert k == K


def test_a_request_that_changes_slot_keeps_its_acceptance_evidence():
    """The generator moves requests into lower free slots; the policy's per-slot evidence and context go along."""
    policy = prepared(linear_cost(plain=1.0, per_draft=0.03, draft_overhead=0.5))
    policy.admit([0, 3], [100, 600])
    for _ in range(10):
        policy.observe([0, 3], 4, [0, 4])
    before = policy.acceptance.expected_tokens([3], [1000]).copy()
    policy.move(3, 1)
    assert np.array_equal(policy.acceptance.expected_tokens([1], [1000]), before)
    assert policy.acceptance.context[1] == 600 + 10 * 5
