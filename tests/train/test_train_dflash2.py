"""dflash-train --method dflash2 against speculators 0.9.0: its initialisation, its selector loss, its convolution
over packed blocks (speculators/models/dflash2/); and that a short run learns and writes a DFlash2 drafter
(the defaults are speculators' DFlash2SpeculatorConfig's, dflash2/config.py)."""

import json

import pytest
import torch
from trtllm_dflash.checkpoint.loader import load_drafter, load_target
from trtllm_dflash.models.dflash2 import grouped_dynamic_conv
from trtllm_dflash.models.registry import parse_drafter_config
from trtllm_dflash.train.data import stdlib_prompts
from trtllm_dflash.train.dflash2 import selector_ce, training_candidates
from trtllm_dflash.train.objective import GAMMA, decay_weights, weighted_mean
from trtllm_dflash.train.spec import TrainSpec
from trtllm_dflash.train.trainer import Progress, drafter_config, new_drafter, train
from trtllm_dflash.utils.errors import DFlashError

pytest.importorskip("speculators", reason="the test set-up installs speculators (Makefile)")

DFLASH2_DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
SMALL = dict(num_layers=1, block_size=8, max_new_tokens=40, max_prompt_tokens=24, eval_prompts=4, eval_every=1000,
             batch_tokens=256, anchors=4, lr=3e-3, method="dflash2")


@pytest.fixture(scope="module")
def fresh(builtin):
    """(a fresh DFlash2 drafter as dflash-train makes it for the tiny target, that target)."""
    target = load_target(builtin[0])
    config = drafter_config(TrainSpec(str(builtin[0]), "unused", **SMALL), target)
    torch.manual_seed(0)
    return new_drafter(parse_drafter_config(config, "test"), target), target


def test_initialisation_is_speculators(fresh):
    """Convolutions equal the library's freshly made ones (its identity init); the selector's three tensors are
    N(0, initializer_range) like the library's own CandidateSelector (compared by moments: the draws differ)."""
    from speculators.models.dflash2.model_definitions import CandidateSelector, GroupedDynamicCausalConv

    drafter, target = fresh
    d2, hidden, vocab = drafter.config.dflash2, drafter.config.hidden_size, drafter.config.vocab_size
    library = GroupedDynamicCausalConv(hidden, block_size=8, kernel_size=d2.conv_kernel_size,
                                       group_size=d2.conv_group_size)
    for conv in (drafter.layers[0].attention_conv, drafter.layers[0].mlp_conv):
        assert torch.equal(conv.base_kernel, library.base_kernel)
        assert torch.equal(conv.kernel_projection.weight, library.kernel_projection.weight)
    torch.manual_seed(1)
    ref = CandidateSelector(vocab_size=vocab, hidden_size=hidden, rank=d2.selector_rank, top_k=d2.selector_top_k,
                            initializer_range=0.02)  # the tiny target's config.json says 0.02
    ours = drafter.candidate_selector
    for name in ("predecessor_codebook", "successor_codebook", "hidden_projection.weight"):
        a, b = ours.get_parameter(name), ref.get_parameter(name)
        assert a.shape == b.shape and abs(a.mean().item()) < 2e-3, name
        assert abs(a.std().item() / b.std().item() - 1) < 0.05, (name, a.std().item(), b.std().item())


def test_selector_loss_is_speculators(fresh):
    """The K-way loss and its candidates (gold injected at rank K where missing) equal the library's
    selector_training_candidates / CandidateSelector.score_candidates / compute_selector_loss on the same tensors.
    The library's mean is over every slot (sum w ce / (A B)), ours per block (sum w ce / (A sum w)): one factor."""
    from speculators.models.dflash2.metrics import compute_selector_loss, selector_training_candidates
    from speculators.models.dflash2.model_definitions import CandidateSelector

    drafter, _ = fresh
    selector, (a, b) = drafter.candidate_selector, (5, 8)
    vocab, hidden, top_k = drafter.config.vocab_size, drafter.config.hidden_size, selector.top_k
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, a, b, vocab, generator=g) * 3
    states = torch.randn(1, a, b, hidden, generator=g)
    tokens = torch.randint(vocab, (1, a, b), generator=g)
    tokens[0, :2, 1:] = logits[0, :2, 1:].topk(3, dim=-1).indices[..., 2]  # two blocks' gold among the top-K
    with torch.no_grad():
        selector.successor_codebook.normal_(0, 0.5, generator=g)  # large enough to move ranks
    ref = CandidateSelector(vocab_size=vocab, hidden_size=hidden, rank=selector.predecessor_codebook.shape[1],
                            top_k=top_k)
    ref.load_state_dict(selector.state_dict())
    flat = lambda t: t.reshape(1, a * b, *t.shape[3:])  # noqa: E731  the library's [1, A*B, ...] rows
    candidates, rank = training_candidates(logits[:, :, 1:], tokens[..., 1:], top_k)
    ref_candidates, ref_rank, present = selector_training_candidates(flat(logits).topk(top_k, dim=-1).indices,
                                                                     flat(tokens))
    assert 0 < present.view(a, b)[:, 1:].sum() < a * (b - 1)  # both cases occur
    assert torch.equal(candidates, ref_candidates.view(1, a, b, top_k)[:, :, 1:])
    assert torch.equal(rank, ref_rank.view(1, a, b)[:, :, 1:])
    prev = torch.cat([tokens[..., :1], tokens[..., :-1]], dim=-1)  # the library's teacher-forced predecessors
    scores = ref.score_candidates(flat(logits), flat(states), flat(prev), ref_candidates)
    expected = compute_selector_loss(scores, ref_rank, torch.ones(1, a * b), b, gamma=GAMMA[b],
                                     per_position_loss_weight="fixed-exp-decay", dpace_alpha=0.5)
    weights = decay_weights(b)
    with torch.no_grad():
        ours = weighted_mean(selector_ce(selector, logits[:, :, 1:], states[:, :, 1:], tokens), weights)
    torch.testing.assert_close(ours, expected * b / weights.sum(), rtol=1e-5, atol=1e-6)


def test_convolution_restarts_at_every_packed_block():
    """A training row holds A blocks back to back: the library's grouped_dynamic_conv over them (slot = index mod B)."""
    from speculators.models.dflash2.model_definitions import grouped_dynamic_conv as library

    g = torch.Generator().manual_seed(0)
    a, b, h, k, group = 3, 4, 32, 3, 8
    x, delta = torch.randn(1, a * b, h, generator=g), torch.randn(1, a * b, k, h // group, generator=g)
    base = torch.randn(k, h, generator=g)
    torch.testing.assert_close(grouped_dynamic_conv(x, delta, base, b),
                               library(x, delta, base, block_size=b, group_size=group), rtol=1e-6, atol=1e-6)


def test_a_short_run_learns_and_writes_a_dflash2_drafter(builtin, tmp_path):
    """Twelve steps lower the loss; the written drafter is DFlash2 in z-lab's layout with speculators' default
    fields, its convolutions trained off the identity, and the runtime loads and drafts with it (the run's held-out
    tau is DFlash2 decoding; greedy exactness of DFlash2 decoding is tests/speculative/test_dflash2.py's)."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in stdlib_prompts(24, seed=3)))
    out = tmp_path / "drafter"
    state = train(TrainSpec(str(builtin[0]), str(out), str(data), steps=12, **SMALL), Progress(log=lambda m: None))
    assert sum(state.losses[-5:]) / 5 < sum(state.losses[:5]) / 5 - 0.5, state.losses
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"]
    assert {k: config["dflash_config"][k] for k in DFLASH2_DEFAULTS} == DFLASH2_DEFAULTS
    drafter = load_drafter(out)
    assert drafter.config.method == "dflash2" and state.evals[-1]["tau"] >= 1.0
    assert drafter.model.layers[0].mlp_conv.kernel_projection.weight.abs().sum() > 0


def test_an_unknown_method_is_refused_naming_it():
    with pytest.raises(DFlashError, match=r"^--method must be one of dflash, dflash2, got 'eagle3'$"):
        TrainSpec("t", "o", method="eagle3")
