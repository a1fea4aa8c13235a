"""Sampled speculative output follows the target's distribution (exact enumeration as the oracle)."""

import math

import pytest
import torch
from helpers.distribution import N_NEW, PROMPT, SAMPLES, V, chi_square_rejects, exact_distribution, sample
from helpers.tiny_models import drafter_config, make_hf_target, write_drafter
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.draft_length.policy import DraftLenPolicy
from trtllm_dflash.sample.sampling import SamplingParams
from trtllm_dflash.utils.errors import DFlashError

@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("smallvocab")
    hf = make_hf_target(root / "target", "qwen3", seed=7, vocab_size=V, eos_token_id=None)
    with torch.no_grad():
        hf.lm_head.weight.mul_(0.4)  # soften the logits: every token has real probability mass
    hf.save_pretrained(root / "target")
    cfg = drafter_config(block_size=4, mask_token_id=V - 1, vocab_size=V)
    write_drafter(root / "drafter", cfg, seed=8)
    return hf, root / "target", root / "drafter"


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_p=0.9, top_k=4)])
def test_speculative_sampling_follows_target_distribution(small_vocab_pair, params):
    hf, target_dir, drafter_dir = small_vocab_pair
    probs = exact_distribution(hf, params)
    counts, results = sample(load_pipeline(target_dir, drafter_dir).generator, params)
    drafted = sum(r.drafted_tokens for r in results)
    accepted = sum(r.accepted_tokens for r in results)
    assert 0.1 * drafted < accepted < 0.9 * drafted  # both acceptance and rejection were exercised
    rejects, stat, critical = chi_square_rejects(counts, probs, SAMPLES)
    assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}"


class FollowsAcceptance(DraftLenPolicy):
    """Each step's draft length depends on what the target accepted before (as the cost-based policy's
    does): the case where a careless implementation would bias the output. Row 0 steers every row."""

    def __init__(self):
        self.start = self.k = 0

    def prepare(self, generator):  # every batch starts elsewhere: each k in 0..3 (block 4) comes first
        self.start = self.k = (self.start + 1) % 4

    def choose(self, batch):
        return self.k

    def observe(self, slots, draft_len, accepted, drafting=None):
        self.k = (draft_len + accepted[0] + 1) % 4


def test_sampling_stays_lossless_when_the_draft_length_follows_acceptance(small_vocab_pair):
    hf, target_dir, drafter_dir = small_vocab_pair
    gen = load_pipeline(target_dir, drafter_dir).generator
    gen.policy = FollowsAcceptance()
    counts, results, batches = {}, [], 8
    for b in range(batches):  # a batch decodes all its rows with one k per step: vary k across batches
        requests = [Request(PROMPT, N_NEW, SamplingParams(1.0, seed=b * SAMPLES + i), ignore_eos=True)
                    for i in range(SAMPLES // batches)]
        results += gen.generate(requests)
    for r in results:
        counts[tuple(r.output_ids)] = counts.get(tuple(r.output_ids), 0) + 1
    assert {r.draft_lengths[0] for r in results} == {0, 1, 2, 3}
    assert sum(r.accepted_tokens for r in results) > 0.1 * sum(r.drafted_tokens for r in results) > 0
    rejects, stat, critical = chi_square_rejects(counts, exact_distribution(hf, SamplingParams(1.0)), len(results))
    assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}"


def test_the_check_detects_a_wrong_distribution(small_vocab_pair):
    """Power check: plain sampling at a different temperature must fail the same test."""
    hf, target_dir, _ = small_vocab_pair
    counts, _ = sample(load_pipeline(target_dir).generator, SamplingParams(1.4))
    assert chi_square_rejects(counts, exact_distribution(hf, SamplingParams(1.0)), SAMPLES)[0]


def test_seeded_sampling_is_reproducible(small_vocab_pair):
    _, target_dir, drafter_dir = small_vocab_pair
    gen = load_pipeline(target_dir, drafter_dir).generator
    run = lambda seed: gen.generate([Request(PROMPT, 20, SamplingParams(1.0, seed=seed), ignore_eos=True)])[0]  # noqa: E731
    assert run(5).output_ids == run(5).output_ids
    assert any(run(5).output_ids != run(s).output_ids for s in range(6, 10))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1.0), "temperature must be >= 0, got -1.0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    (dict(top_k=-2), "top_k must be >= 0, got -2"),
])
def test_bad_sampling_parameters(kwargs, message):
    with pytest.raises(DFlashError, match=message):
        SamplingParams(**kwargs)


def test_seeded_request_draws_the_same_tokens_in_any_batch(small_vocab_pair):
    """Random numbers are a function of (seed, step, purpose, lane): batch neighbours and the slot
    a request lands in change nothing."""
    _, target_dir, drafter_dir = small_vocab_pair
    gen = load_pipeline(target_dir, drafter_dir).generator
    mine = Request(PROMPT, 16, SamplingParams(1.0, seed=3), ignore_eos=True)
    others = [Request(PROMPT[: k + 2], 16, SamplingParams(0.8, top_k=3, seed=100 + k), ignore_eos=True)
              for k in range(3)]
    alone = gen.generate([mine])[0].output_ids
    assert gen.generate(others[:2] + [mine] + others[2:])[2].output_ids == alone


def test_sampler_draws_each_token_with_its_probability():
    """The inverse-CDF sampler over counter-based uniforms: zero-mass tokens never, the rest at their
    rates (the chi-square check above); rows need not be normalised."""
    from trtllm_dflash.sample.sampling import FIRST, SamplingBatch, sample, uniforms

    n = 20000
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0, 1e-3])
    batch = SamplingBatch.of([SamplingParams(1.0)] * n, list(range(n)), torch.zeros(n, dtype=torch.long))
    tokens = sample((probs * 3)[None, None].expand(n, 1, -1), uniforms(batch, FIRST, 1))[:, 0]
    counts = {(t,): c for t, c in enumerate(torch.bincount(tokens, minlength=len(probs)).tolist())}
    assert counts[(0,)] == counts[(2,)] == counts[(5,)] == 0
    expected = {(t,): float(p) / float(probs.sum()) for t, p in enumerate(probs)}
    assert not chi_square_rejects(counts, expected, n)[0]


def test_uniforms_are_uniform_and_distinct_per_stream():
    from trtllm_dflash.sample.sampling import ACCEPT, BONUS, PROPOSE, SamplingBatch, uniforms

    n = 4000
    batch = SamplingBatch.of([SamplingParams(1.0)] * n, list(range(n)), torch.arange(n) % 7)
    u = uniforms(batch, PROPOSE, 8)
    assert u.shape == (n, 8) and u.dtype == torch.float64 and 0 <= u.min() and u.max() < 1
    flat = u.flatten().sort().values
    ks = (flat - torch.arange(1, len(flat) + 1, dtype=torch.float64) / len(flat)).abs().max()
    assert ks < 1.95 / math.sqrt(len(flat))  # Kolmogorov-Smirnov at alpha = 0.1 %
    assert abs(torch.corrcoef(torch.stack([u[:, 0], u[:, 1]]))[0, 1]) < 0.06  # neighbouring lanes
    others = [uniforms(batch, ACCEPT, 8), uniforms(SamplingBatch.of([SamplingParams(1.0)] * n, list(range(n)),
                                                                   torch.arange(n) % 7 + 1), PROPOSE, 8)]
    for other in others:  # another purpose, the next step: different numbers
        assert (other != u).float().mean() > 0.99
    assert torch.equal(uniforms(batch, BONUS, 1), uniforms(batch, BONUS, 1))


def test_greedy_rows_get_one_hot_rows_beside_sampled_ones():
    from trtllm_dflash.sample.sampling import SamplingBatch, token_probs

    logits = torch.randn(3, 2, 9, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(), SamplingParams(0.5), SamplingParams(0.5, top_k=2)]
    probs = token_probs(logits, SamplingBatch.of(params, [0, 1, 2], torch.zeros(3, dtype=torch.long)))
    torch.testing.assert_close(probs[0], torch.nn.functional.one_hot(logits[0].argmax(-1), 9).float())
    torch.testing.assert_close(probs[1], torch.softmax(logits[1] / 0.5, -1))
    top2 = torch.softmax((logits[2] / 0.5).masked_fill(logits[2] < logits[2].topk(2).values[:, -1:], -torch.inf), -1)
    torch.testing.assert_close(probs[2], top2)


def test_mul32_is_the_exact_product_mod_2_32():
    """The hash's 32-bit multiply on int64 tensors, against Python's exact integers, at the edges and at random,
    for multipliers below and above 2^31 (those are taken as c - 2^32 to stay clear of int64 overflow)."""
    import random as stdlib_random

    from trtllm_dflash.sample.sampling import MASK32, _mul32

    rng = stdlib_random.Random(0)
    values = [0, 1, 2 ** 31 - 1, 2 ** 31, MASK32] + [rng.getrandbits(32) for _ in range(5000)]
    x = torch.tensor(values, dtype=torch.long)
    for c in (0x7FEB352D, 0x846CA68B, 1, 2 ** 31 - 1, 2 ** 31, MASK32):
        assert _mul32(x, c).tolist() == [(v * c) & MASK32 for v in values]


def test_per_row_draft_lengths_accept_as_speculative_sampling_of_each_rows_own_drafts():
    """accept(..., lengths): row b is speculative sampling of its first L_b drafts only, written out here as the
    textbook loop (accept draft j if u_j q_j(d_j) < p_j(d_j); at the first rejection draw from max(0, p - q); all
    L_b accepted: the bonus from p at L_b), with the same uniforms. Greedy rows: the accepted prefix capped at L_b."""
    from trtllm_dflash.sample.sampling import ACCEPT, BONUS, SamplingBatch, sample, token_probs, uniforms
    from trtllm_dflash.speculative.accept import accept

    gen = torch.Generator().manual_seed(0)
    b, k, v = 8, 5, 6
    lengths = torch.tensor([0, 1, 2, 5, 3, 0, 4, 5])
    params = [SamplingParams(1.0, seed=i) if i != 2 else SamplingParams() for i in range(b)]
    sampling = SamplingBatch.of(params, [p.key() for p in params], torch.arange(b) * 7)
    logits = torch.randn(b, k + 1, v, generator=gen) * 2
    q = torch.softmax(torch.randn(b, k, v, generator=gen), -1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=gen).reshape(b, k)
    drafts[3] = logits[3, :-1].argmax(-1)  # a row that accepts deep
    q[2] = torch.nn.functional.one_hot(drafts[2], v).float()  # the greedy row proposes one-hot
    num_accepted, bonus = accept(drafts, q, logits, sampling, lengths)
    p = token_probs(logits, sampling)
    u_accept, u_bonus = uniforms(sampling, ACCEPT, k), uniforms(sampling, BONUS, 1)
    for row in range(b):
        taken = 0
        while taken < lengths[row] and u_accept[row, taken] * q[row, taken, drafts[row, taken]] < p[row, taken, drafts[row, taken]]:
            taken += 1
        rejected = taken < lengths[row]
        dist = (p[row, taken] - q[row, taken]).clamp_min(0) if rejected else p[row, taken]
        want = sample(dist[None, None], u_bonus[row:row + 1])[0, 0]
        assert (num_accepted[row], bonus[row]) == (taken, want), row
    greedy_rows = SamplingBatch.of([SamplingParams()] * b, [0] * b, torch.zeros(b, dtype=torch.long))
    greedy_accepted, greedy_bonus = accept(drafts, None, logits, greedy_rows, lengths)
    best = logits.argmax(-1)
    for row in range(b):
        taken = 0
        while taken < lengths[row] and drafts[row, taken] == best[row, taken]:
            taken += 1
        assert (greedy_accepted[row], greedy_bonus[row]) == (taken, best[row, taken])
    assert (num_accepted > 0).any() and (num_accepted < lengths).any() and (num_accepted == lengths).any()
