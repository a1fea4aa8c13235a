"""The acceptance model: per-slot and per-context-bucket rates against the geometric closed form
(constant acceptance alpha: E[tokens | k] = (1 - alpha^(k+1)) / (1 - alpha)) and against simulation."""

import random

import numpy as np
import pytest

from trtllm_dflash.draft_length.acceptance import AcceptanceModel, AcceptanceSettings
from helpers.policy_sim import K, feed, geometric_tokens, linear_cost, position_tokens, prepared, view


def test_expected_tokens_match_the_geometric_closed_form():
    model = AcceptanceModel(4, K, AcceptanceSettings(prior=0.7, prior_weight=1e9, optimism=0.0))  # rates pinned at 0.7
    tokens = model.expected_tokens([0, 1], [1000, 1000])
    assert tokens.shape == (2, K + 1)
    assert tokens[0] == pytest.approx([geometric_tokens(0.7, k) for k in range(K + 1)])


def test_expected_tokens_stop_at_the_remaining_budget():
    model = AcceptanceModel(2, K, AcceptanceSettings(prior=0.99, prior_weight=1e9, optimism=0.0))
    tokens = model.expected_tokens([0, 1], [1, 3])
    assert tokens[0] == pytest.approx([1.0] * (K + 1))  # one token left: drafting cannot add any
    assert tokens[1, 2:] == pytest.approx([tokens[1, 2]] * (K - 1)) and tokens[1, 2] < 3


def test_estimates_converge_to_the_true_per_slot_rates():
    model = AcceptanceModel(3, K)
    feed(model, [0, 2], [0.9, 0.2], steps=400)
    rates = model.rates([0, 2])
    assert rates[0, :4] == pytest.approx([0.9] * 4, abs=0.08)  # deep positions are reached often at 0.9
    assert rates[1, 0] == pytest.approx(0.2, abs=0.12)
    pooled = model.pooled_rates()[0]
    assert 0.2 < pooled < 0.9  # a mixture of both requests


def test_a_new_request_starts_from_its_context_buckets_rates():
    """Short prompts accept 0.9, 1024-token ones 0.2 (the built-in pair's drift, exaggerated). A new request
    starts from the rates measured at its own prompt's length, not from the mixture."""
    model = AcceptanceModel(4, K)
    model.reset([0, 1], [100, 1024])
    for step in range(300):
        for slot, alpha in ((0, 0.9), (1, 0.2)):  # separate calls: each its own acceptance
            feed(model, [slot], alpha, steps=1, seed=step)
        model.context[[0, 1]] = [100, 1024]  # both stay in their buckets
    model.reset([2, 3], [150, 1100])
    short, long = model.rates([2, 3])[:, 0]
    assert short == pytest.approx(model.bucket_rates()[0, 0]) and long == pytest.approx(model.bucket_rates()[3, 0])
    assert short == pytest.approx(0.9, abs=0.08) and long == pytest.approx(0.2, abs=0.08)
    pooled = model.pooled_rates()[0]
    assert long < pooled < short  # the mixture would have misled both


@pytest.mark.parametrize("seed", range(3))
def test_long_requests_after_short_ones_do_not_plan_on_the_short_ones_deep_acceptance(seed):
    """Short prompts accept 0.9 at every position; 1024-token ones 0.3 at position 1, 0.4 at 2, 0.5 after
    (the built-in pair's shape at 1024 tokens, rounded). There every draft length loses to a plain step. The
    long prompts' deep positions are rarely reached, so while they borrowed the short prompts' evidence they
    were planned near 0.9 and the whole block was drafted step after step (0.93-0.96 of plain's rate over
    these seeds with that code); now the borrowed deep acceptances are scaled by the long prompts' alpha_1
    relative to the short ones'."""
    cost = linear_cost(plain=1.0, per_draft=0.03, draft_overhead=0.5)
    seconds = cost.step_seconds(1, 1024, K)
    long = [0.3, 0.4] + [0.5] * (K - 2)
    policy, rng = prepared(cost), random.Random(seed)

    def serve(context: int, alphas: list[float], steps: int) -> tuple[int, float]:
        policy.admit([0], [context])
        tokens, elapsed = 0, 0.0
        for _ in range(steps):
            k, n = policy.choose(view([0], context)), 0
            while n < k and rng.random() < alphas[n]:
                n += 1
            policy.observe([0], k, [n])
            policy.acceptance.context[0] = context  # the request stays in its context bucket
            tokens, elapsed = tokens + n + 1, elapsed + seconds[k]
        return tokens, elapsed

    for _ in range(3):
        serve(100, [0.9] * K, 60)
    tokens, elapsed = map(sum, zip(*(serve(1024, long, 128) for _ in range(4))))
    fixed = [position_tokens(long, k) / seconds[k] for k in range(K + 1)]
    assert int(np.argmax(fixed)) == 0  # truly no draft length pays at the long context
    assert tokens / elapsed >= 0.965 * fixed[0]  # the rest: probes (each new request's first step)


def test_a_context_bucket_borrows_deep_rates_in_proportion_to_its_first():
    """Short prompts: alpha_1 0.6, deeper positions 0.9, well measured. A bucket whose own first drafts accept
    as often keeps the short prompts' deep rates (a request crossing into it at unchanged acceptance plans as
    before); one whose first drafts accept half as often borrows them halved, not at face value."""
    model = AcceptanceModel(1, K)
    rng = random.Random(0)
    alphas = [0.6] + [0.9] * (K - 1)
    for _ in range(400):
        n = 0
        while n < K and rng.random() < alphas[n]:
            n += 1
        model.context[0] = 100
        model.observe([0], K, [n])
    short = model.bucket_rates()[0]
    for context, accepted in ((300, [1, 0, 1, 1, 0]), (1024, [1, 0, 0, 0, 0, 1, 0, 0, 0, 0])):
        for a in accepted:  # position 1 only: accepted 1 means position 2 was reached and rejected
            model.context[0] = context
            model.observe([0], K, [a])
    rates = model.bucket_rates()
    assert short[0] == pytest.approx(0.6, abs=0.15) and np.all(short[1:4] > 0.8)
    assert rates[1, 3:] == pytest.approx(short[3:], abs=0.05)  # alpha_1 about the same: deep rates kept
    assert rates[3, 0] < 0.45 and np.all(rates[3, 3:] < 0.65)  # alpha_1 halved: deep rates about halved


def test_positions_past_the_draft_length_learn_nothing():
    model = AcceptanceModel(1, K)
    before = model.rates([0])[0, 3:].copy()
    model.observe([0], 3, [3])
    assert model.rates([0])[0, 0] > 0.5 and model.tried[0, 3:].sum() == 0
    model.observe([0], 0, [0])  # a plain step is no evidence
    assert model.tried[0, :3] == pytest.approx([1, 1, 1])
    assert before.shape == (K - 3,)


def test_ageing_by_a_plain_run_forgets_as_that_many_drafting_steps_of_nothing_would():
    """`age(slots, n)`: the slots' own counts as if n drafting steps had passed with no evidence (slot_decay^n per
    position), the pooled and the context buckets' as n drafting steps would make them (pooled_decay^n), other slots
    untouched; counted here by hand from the fed steps, not read back from the model before ageing."""
    s = AcceptanceSettings()
    model = AcceptanceModel(2, K)
    model.observe([0, 1], K, [2, 0])  # slot 0 reaches positions 1-3 (accepts 1, 2), slot 1 position 1 (rejects)
    model.age([0], 5)
    assert model.tried[0, :4] == pytest.approx([s.slot_decay ** 5] * 3 + [0])
    assert model.accepted[0, :3] == pytest.approx([s.slot_decay ** 5] * 2 + [0])
    assert model.tried[1, :2] == pytest.approx([1, 0]) and model.accepted[1, 0] == 0  # not aged
    pooled = s.pooled_decay ** 5
    assert model.pooled_tried[:4] == pytest.approx([2 * pooled, pooled, pooled, 0])
    assert model.bucket_tried[0, 0] == pytest.approx(2 * pooled)

def test_shrunk_rates_follow_the_position_by_position_recurrence():
    """The chain's closed form against the definition, one position after another in Python floats: mean_j =
    (accepted_j + w * mean_(j-1)) / (tried_j + w), mean_0 = prior; counts from nothing to thousands of trials."""
    settings = AcceptanceSettings(prior=0.6, prior_weight=2.0)
    model = AcceptanceModel(1, K, settings)
    rng = np.random.default_rng(3)
    for scale in (0.0, 1.0, 30.0, 3000.0):
        tried = np.sort(rng.random(K) * scale)[::-1]
        accepted = tried * rng.random(K)
        previous, expected = 0.6, []
        for t, a in zip(tried.tolist(), accepted.tolist()):
            previous = (a + 2.0 * previous) / (t + 2.0)
            expected.append(previous)
        assert model.chain(tried, accepted, bound=False) == pytest.approx(expected, rel=1e-9)


def test_rarely_reached_positions_get_no_more_optimism_than_position_one():
    """alpha = 0.45 at every position, whole blocks drafted: position 1 is tried every step, position 5 about
    once in 25. The bound planned with may exceed each mean by at most position 1's bonus; before that cap
    positions 4-6 were planned near certain and the policy drafted where it lost."""
    model = AcceptanceModel(1, K)
    feed(model, [0], 0.45, steps=60)
    mean, bound = model.bucket_rates(False)[0], model.bucket_rates(True)[0]
    bonus = bound - mean
    assert model.bucket_tried[0, 0] > 10 * model.bucket_tried[0, 4]  # deep positions are rarely reached
    assert bonus[0] > 0 and np.all(bonus <= bonus[0] + 1e-12)
    policy = prepared(linear_cost(plain=1.0, per_draft=0.02, draft_overhead=0.8))  # k costs 1.8 + 0.02 k plain steps
    feed(policy.acceptance, [0], 0.45, steps=60)  # truly k drafts yield (1 - 0.45^(k+1)) / 0.55 < 1.82 tokens
    assert policy.choose(view([0])) == 0


def test_bucket_rates_follow_every_drafting_step():
    """The bucket rates are kept between drafting steps (plain steps do not change them); a drafting step's
    evidence shows at once."""
    model = AcceptanceModel(2, K)
    feed(model, [0], 0.9, steps=20)
    before = model.bucket_rates(True).copy()
    model.observe([0, 1], 0, [0, 0])  # plain: no evidence
    assert np.array_equal(model.bucket_rates(True), before)
    feed(model, [1], 0.1, steps=5, seed=1)
    assert model.bucket_rates(True)[0, 0] < before[0, 0] - 0.05
    assert np.allclose(model.bucket_rates(True), model.estimate_bucket_rates(True))


def test_observed_steps_reach_the_counts_in_order_however_late_they_are_read():
    """Steps are applied when the counts are next read (`AcceptanceModel.folded`); whatever the reads' timing the
    counts equal the documented recurrence, run here in Python floats step by step: a step of k drafts of which a
    are accepted reaches positions 1..min(a + 1, k) and accepts 1..a; a slot's reached positions and those past k
    (not drafted) decay by slot_decay, the pooled counts of every position by pooled_decay; a plain-only row
    (drafting False) only moves its context by one token; a move carries a request's counts to its new slot; a
    reset zeroes them."""
    settings = AcceptanceSettings()
    k_max, slots = 4, 3
    rng = random.Random(5)
    steps = []
    for _ in range(60):
        k = rng.choice([0, 1, 2, 4, 6])  # 6: more than the block allows, counted as 4
        rows = sorted(rng.sample(range(slots), rng.randint(1, slots)))
        drafting = [rng.random() < 0.8 for _ in rows] if rng.random() < 0.3 else None
        steps.append(("observe", rows, k, [rng.randint(0, min(k, k_max)) for _ in rows], drafting))
    steps[20] = ("move", 2, 0)
    steps[40] = ("reset", [1], [300])
    tried = [[0.0] * k_max for _ in range(slots)]
    hit = [[0.0] * k_max for _ in range(slots)]
    pooled = [0.0] * k_max
    length = [0.0] * slots
    for step in steps:
        if step[0] == "move":
            _, src, dst = step
            tried[dst], hit[dst], length[dst] = list(tried[src]), list(hit[src]), length[src]
            continue
        if step[0] == "reset":
            tried[1], hit[1], length[1] = [0.0] * k_max, [0.0] * k_max, 300.0
            continue
        _, rows, k, accepted, drafting = step
        k = min(k, k_max)
        live = [(r, a) for i, (r, a) in enumerate(zip(rows, accepted)) if drafting is None or drafting[i]]
        for i, r in enumerate(rows):
            if drafting is not None and not drafting[i]:
                length[r] += 1
        if k == 0 or not live:
            for r, _ in live:
                length[r] += 1
            continue
        pooled = [settings.pooled_decay * p for p in pooled]
        for r, a in live:
            for j in range(min(a + 1, k)):
                tried[r][j] = settings.slot_decay * tried[r][j] + 1.0
                pooled[j] += 1.0
                hit[r][j] = settings.slot_decay * hit[r][j] + (1.0 if j < a else 0.0)
            for j in range(k, k_max):
                tried[r][j] *= settings.slot_decay
                hit[r][j] *= settings.slot_decay
            length[r] += a + 1
    for read_every in (1, 7, 1000):  # read after every step, now and then, and only at the end
        model = AcceptanceModel(slots, k_max, settings)
        for i, step in enumerate(steps):
            if step[0] == "move":
                model.move(step[1], step[2])
            elif step[0] == "reset":
                model.reset(step[1], step[2])
            else:
                model.observe(*step[1:])
            if i % read_every == 0:
                model.rates(list(range(slots)), bound=True)
        np.testing.assert_allclose(model.tried, tried, rtol=1e-12)
        np.testing.assert_allclose(model.accepted, hit, rtol=1e-12)
        np.testing.assert_allclose(model.pooled_tried, pooled, rtol=1e-12)
        assert model.context.tolist() == length
