"""DFlash2 drafting against speculators 0.9.0 (the drafter's forward and selector) and transformers (the target).

A tiny DFlash2 drafter made by the library, its convolutions off the identity and its codebooks large enough that
the selector moves the unary argmax, over a tiny Qwen3 target: every step's proposals are the library's greedy walk
for that anchor, and the output is the target's greedy output token for token, alone and batched. Sampling keeps
the target's distribution (Pearson's test against exact enumeration, as tests/sample/test_sampling.py does for v1).
"""

import pytest
import torch
from helpers.dflash2 import (SLIDING, library_blocks, library_dflash2, reference_walk, write_zlab_dflash2,
                             zlab_dflash2_config)
from helpers.distribution import PROMPT, SAMPLES, V, chi_square_rejects, exact_distribution, sample
from helpers.oracle import hf_greedy
from helpers.scripted import Scripted
from helpers.tiny_models import hf_config, make_hf_target
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request
from trtllm_dflash.sample.sampling import SamplingParams
from trtllm_dflash.speculative import DFlash2Proposer

pytest.importorskip("speculators", reason="the test set-up installs speculators (Makefile)")

PROMPTS = [[5, 9, 13, 2, 77, 31, 8], list(range(40, 52))]
N = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers target, its dir, the library's DFlash2 drafter dir): a non-causal sliding layer and a full one."""
    root = tmp_path_factory.mktemp("dflash2")
    hf = make_hf_target(root / "target", "qwen3", seed=21)
    drafter = library_dflash2(root / "drafter", root / "target", hf_config("qwen3", num_hidden_layers=2, **SLIDING))
    return hf, root / "target", drafter


def recording(proposer):
    """Wraps propose: every step's drafts of row 0."""
    steps, propose = [], proposer.propose

    def wrapped(*args):
        drafts, probs = propose(*args)
        steps.append(drafts[0].tolist())
        return drafts, probs

    proposer.propose = wrapped
    return steps


@pytest.mark.slow  # the library's forward per prompt, transformers' greedy by recomputation
def test_proposals_are_the_library_walk_and_output_is_the_targets(pair):
    hf, target_dir, drafter_dir = pair
    pipe = load_pipeline(target_dir, drafter_dir)
    assert isinstance(pipe.generator.proposer, DFlash2Proposer)
    moved = compared = 0
    for prompt in PROMPTS:
        steps = recording(pipe.generator.proposer)
        result = pipe.generator.generate([Request(tuple(prompt), N, ignore_eos=True)])[0]
        assert result.output_ids == hf_greedy(hf, prompt, N)
        sequence = prompt + result.output_ids
        hidden, logits, selector = library_blocks(drafter_dir, sequence, hf)
        start = len(prompt)
        for drafts, accepted in zip(steps, result.acceptance_lengths):
            if start < len(logits):
                n = len(drafts)
                walk, changed = reference_walk(selector, logits[start, 1:n + 1], hidden[start, 1:n + 1],
                                               sequence[start])
                assert drafts == walk, (start, drafts, walk)
                moved, compared = moved + changed, compared + 1
            start += accepted
    # the selector moved some drafts off the unary argmax (a random drafter's drafts are rarely accepted: the
    # sampling test below exercises acceptance)
    assert compared >= 4 and moved > 0


def test_batched_greedy_output_is_the_targets(pair):
    """Three rows of different lengths, whole blocks, then draft lengths that change every step (plain steps too)."""
    hf, target_dir, drafter_dir = pair
    pipe = load_pipeline(target_dir, drafter_dir)
    prompts = PROMPTS + [[3, 4, 5]]
    expected = [hf_greedy(hf, p, N) for p in prompts]
    for policy in (None, Scripted([3, 0, 7, 1, 0, 0, 5])):
        if policy is not None:
            pipe.generator.policy = policy
        results = pipe.generator.generate([Request(tuple(p), N, ignore_eos=True) for p in prompts])
        assert [r.output_ids for r in results] == expected
    assert {k for r in results for k in r.draft_lengths} == {0, 1, 3, 5, 7}


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    """A 6-token target and a DFlash2 drafter over it in z-lab's layout: K = 4 of 6 candidates, so q is sparse."""
    root = tmp_path_factory.mktemp("dflash2-small")
    hf = make_hf_target(root / "target", "qwen3", seed=7, vocab_size=V, eos_token_id=None)
    with torch.no_grad():
        hf.lm_head.weight.mul_(0.4)  # soften the logits: every token has real probability mass
    hf.save_pretrained(root / "target")
    write_zlab_dflash2(root / "drafter", zlab_dflash2_config(vocab=V, block_size=4, mask_token_id=V - 1), seed=8)
    return hf, root / "target", root / "drafter"


@pytest.mark.slow  # thousands of sampled requests
def test_sampling_follows_the_target_distribution(small_vocab_pair):
    hf, target_dir, drafter_dir = small_vocab_pair
    params, n_new, samples = SamplingParams(1.0), 2, SAMPLES // 2  # 36 cells, about 55 samples each
    gen = load_pipeline(target_dir, drafter_dir).generator
    assert isinstance(gen.proposer, DFlash2Proposer)
    counts, results = sample(gen, params, n_new, samples)
    drafted = sum(r.drafted_tokens for r in results)
    accepted = sum(r.accepted_tokens for r in results)
    assert 0.1 * drafted < accepted < 0.9 * drafted  # both acceptance and rejection were exercised
    rejects, stat, critical = chi_square_rejects(counts, exact_distribution(hf, params, n_new), samples)
    assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}"


def test_sampled_q_is_the_softmax_over_the_candidates(small_vocab_pair):
    """q puts mass on exactly K tokens a position, sums to 1, and holds the drawn draft."""
    _, target_dir, drafter_dir = small_vocab_pair
    gen = load_pipeline(target_dir, drafter_dir).generator
    seen = []
    propose = gen.proposer.propose
    gen.proposer.propose = lambda *a: seen.append(propose(*a)) or seen[-1]
    gen.generate([Request(PROMPT, 6, SamplingParams(0.8, seed=s), ignore_eos=True) for s in range(3)]
                 + [Request(PROMPT, 6, SamplingParams(0.0), ignore_eos=True)])
    drafts, q = seen[0]
    assert ((q > 0).sum(-1)[:3] == 4).all() and torch.allclose(q.sum(-1), torch.ones(q.shape[:2]))
    assert (q.gather(-1, drafts[..., None]) > 0).all()
    assert ((q[3] == 1).sum(-1) == 1).all()  # the greedy row's proposal is one-hot


@pytest.mark.slow  # compiles the target's and the drafter's steps
def test_compiled_steps_decode_exactly(pair):
    hf, target_dir, drafter_dir = pair
    gen = load_pipeline(target_dir, drafter_dir, step_mode="compile").generator
    result = gen.generate([Request(tuple(PROMPTS[1]), 12, ignore_eos=True)])[0]
    assert result.output_ids == hf_greedy(hf, PROMPTS[1], 12)
