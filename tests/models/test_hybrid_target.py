"""Qwen3.5 hybrid targets (Gated DeltaNet + gated attention) against transformers, and the
speculative rollback of their recurrent state."""

import itertools
import json

import pytest
import torch
from helpers.host_traffic import host_traffic_of_steps
from helpers.scripted import ScriptedProposer, scripted_results
from safetensors.torch import load_file
from helpers.tiny_models import MOE_FIELDS, VOCAB, add_tokenizer, hf_generate, make_hf_hybrid, write_drafter
from trtllm_dflash.checkpoint.loader import load_target
from trtllm_dflash.engine.generator import Generator
from trtllm_dflash.engine.loader import generate_with_engine
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.builder.builder import build_engine
from trtllm_dflash.builder.spec import BuildSpec
from trtllm_dflash.compilation.step_mode import StepMode, StepShapes
from trtllm_dflash.draft_length.policy import DraftLenPolicy
from trtllm_dflash.models.attention import ForwardContext
from trtllm_dflash.models.registry import parse_target_config
from trtllm_dflash.utils.errors import DFlashError

ATOL = 2e-5
PROMPTS = [list(range(3, 15)), [7, 50, 2, 9, 33], list(range(60, 90))]
NEW = 48


@pytest.fixture(scope="module", params=["text", "multimodal"])
def hybrid(request, tmp_path_factory):
    """(transformers model, its directory, its greedy continuations of PROMPTS) for both published layouts."""
    path = tmp_path_factory.mktemp("hybrid") / request.param
    hf = make_hf_hybrid(path, request.param, seed=4)
    add_tokenizer(path)
    return hf, path, [hf_generate(hf, p, NEW) for p in PROMPTS]


text_only = pytest.mark.parametrize("hybrid", ["text"], indirect=True)


def run(model, cache, ids, starts, slots, commit, capture=()):
    """Prompts (starts all 0) into any slots, committing `commit` tokens per row; or a cached pass with
    slots a permutation of 0..B-1 (the runtime's layout: row b is slot b), run in slot order."""
    positions = starts[:, None] + torch.arange(ids.shape[1])
    if not starts.any():
        hidden, feats = model(ids, ForwardContext.prefill(positions, cache, slots, commit, capture_layer_ids=capture))
        return model.logits(hidden), feats
    order = slots.argsort()
    ctx = ForwardContext.cached(positions[order], cache, int(positions.max()) + 1,
                                commit=None if commit is None else commit[order], capture_layer_ids=capture)
    hidden, feats = model(ids[order], ctx)
    back = order.argsort()
    return model.logits(hidden)[back], None if feats is None else feats[back]


def test_both_layouts_parse_to_one_language_model(hybrid):
    _, path, _ = hybrid
    data = json.loads((path / "config.json").read_text())
    cfg = parse_target_config(data, "c")
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert cfg.rotary_dim == 4 and cfg.attn_output_gate and cfg.unit_offset_norms
    lin = cfg.linear_attention
    assert (lin.num_k_heads, lin.num_v_heads, lin.head_k_dim, lin.conv_dim) == (2, 4, 8, 64)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (32, 4, VOCAB)


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.update(layer_types=["linear_attention"] * 3), "field 'layer_types' must list 4 of"),
    (lambda t: t.update(linear_num_value_heads=3),
     "linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2"),
    (lambda t: t.update(linear_key_head_dim=0), "field 'linear_key_head_dim' must be positive, got 0"),
])
def test_bad_hybrid_configs_name_the_field(mutate, message):
    from helpers.tiny_models import hybrid_text_config

    text = hybrid_text_config(layer_types=["linear_attention"] * 3 + ["full_attention"])
    mutate(text)
    with pytest.raises(DFlashError, match=message):
        parse_target_config({"model_type": "qwen3_5_text", **text}, "cfg")
    with pytest.raises(DFlashError, match="needs a 'text_config' object"):
        parse_target_config({"model_type": "qwen3_5"}, "cfg")


def test_logits_and_hidden_states_match_transformers(hybrid):
    """A right-padded batch (rows of different lengths) through every layer kind, float32."""
    hf, path, _ = hybrid
    target = load_target(path).model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 30), generator=g)
    lengths = torch.tensor([30, 17])
    cache = target.new_cache(2, 40, 8)
    logits, feats = run(target, cache, ids, torch.zeros(2, dtype=torch.long), torch.tensor([1, 0]), lengths, (0, 1, 3))
    for row, n in enumerate(lengths.tolist()):
        with torch.no_grad():
            ref = hf(ids[row : row + 1, :n], output_hidden_states=True)
        torch.testing.assert_close(logits[row, :n], ref.logits[0], atol=ATOL, rtol=0)
        expected = torch.cat([ref.hidden_states[i + 1][0] for i in (0, 1, 3)], dim=-1)
        torch.testing.assert_close(feats[row, :n], expected, atol=ATOL, rtol=0)


@text_only
def test_rollback_keeps_exactly_the_accepted_tokens(hybrid):
    """Verify K tokens, accept a different j < K per row: the state equals feeding only the accepted
    tokens, and the next pass's logits equal transformers' on the accepted sequence."""
    hf, path, _ = hybrid
    target = load_target(path).model
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (3, 10), generator=g)
    block = torch.randint(0, VOCAB, (3, 8), generator=g)
    slots, zero, ten = torch.tensor([2, 0, 1]), torch.zeros(3, dtype=torch.long), torch.full((3,), 10)
    spec = target.new_cache(3, 40, 8)
    run(target, spec, prompt, zero, slots, torch.full((3,), 10))
    before = spec.state.ssm.clone(), spec.state.conv.clone()
    run(target, spec, block, ten, slots, None)  # verify: deferred
    assert torch.equal(spec.state.ssm, before[0]) and torch.equal(spec.state.conv, before[1])
    kept = torch.tensor([3, 1, 8])  # accepted + 1 per row: some drafts, the anchor alone, the whole block
    target.commit(spec, slots, kept, 8)
    for row, n in enumerate(kept.tolist()):
        fresh = target.new_cache(1, 40, 8)
        seq = torch.cat([prompt[row], block[row, :n]])[None]
        run(target, fresh, seq, zero[:1], torch.tensor([0]), torch.tensor([10 + n]))
        torch.testing.assert_close(spec.state.ssm[:, slots[row]], fresh.state.ssm[:, 0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(spec.state.conv[:, slots[row]], fresh.state.conv[:, 0], atol=1e-5, rtol=1e-4)
    nxt = torch.randint(0, VOCAB, (3, 4), generator=g)
    logits, _ = run(target, spec, nxt, ten + kept, slots, None)
    for row, n in enumerate(kept.tolist()):
        seq = torch.cat([prompt[row], block[row, :n], nxt[row]])[None]
        with torch.no_grad():
            ref = hf(seq).logits[0, -4:]
        torch.testing.assert_close(logits[row], ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("drafted", [False, True])
def test_greedy_equals_transformers_generate(hybrid, tmp_path, drafted):
    _, path, expected = hybrid
    assert greedy(path, write_drafter(tmp_path / "drafter", seed=2) if drafted else None) == expected


def greedy(path, drafter=None) -> list[list[int]]:
    """PROMPTS decoded greedily in one batch, plainly or with `drafter`."""
    requests = [Request(tuple(p), NEW, ignore_eos=True) for p in PROMPTS]
    return [r.output_ids for r in load_pipeline(path, drafter).generator.generate(requests)]


def scripted_batch(path, expected) -> list[tuple[int, ...]]:
    """scripted_results of PROMPTS; -> the acceptance lengths of each step (one per row)."""
    return list(zip(*(r.acceptance_lengths for r in scripted_results(path, expected, PROMPTS, NEW))))


def test_batch_with_different_acceptance_in_one_step_stays_exact(hybrid):
    _, path, expected = hybrid
    steps = scripted_batch(path, expected)
    assert any(len(set(step)) == 3 for step in steps)  # three different acceptances in one step
    assert max(max(s) for s in steps) == 6 and min(min(s) for s in steps) == 1


class CyclingDraftLen(DraftLenPolicy):
    def __init__(self, lengths):
        self.lengths = itertools.cycle(lengths)

    def choose(self, batch):
        return next(self.lengths)


@text_only
def test_draft_length_chosen_per_step_stays_exact(hybrid):
    """Plain steps (a lone anchor, committed in the pass) between shorter and full blocks: the
    recurrent state rolls back right whatever width each step verifies."""
    _, path, expected = hybrid
    gen = Generator(load_target(path).model, ScriptedProposer([p + e for p, e in zip(PROMPTS, expected)]))
    gen.policy = CyclingDraftLen([0, 5, 2, 0, 1, 4, 3])
    results = gen.generate([Request(tuple(p), NEW, ignore_eos=True) for p in PROMPTS])
    assert [r.output_ids for r in results] == expected
    assert set(results[0].draft_lengths) == {0, 1, 2, 3, 4, 5}
    assert any(a > 1 for a in results[0].acceptance_lengths)  # drafts were accepted, not only rejected


@text_only
def test_cuda_graph_buckets_stay_exact(hybrid):
    """cuda-graphs' padding (`step_mode.GRAPH_SHAPES`: rows and width from 2), run eagerly: a plain step verifies
    its anchor and a padding token, which the recurrent state must not keep; three requests step as four rows
    and a lone one as two."""
    _, path, expected = hybrid
    gen = Generator(load_target(path).model, ScriptedProposer([p + e for p, e in zip(PROMPTS, expected)]))
    gen.set_step_mode(StepMode("eager", StepShapes(min_span=16, min_rows=2, min_width=2)))
    widths = []
    verify = gen.verify_pass
    gen.verify_pass = lambda ids, ctx: widths.append(ids.shape) or verify(ids, ctx)
    gen.policy = CyclingDraftLen([0, 5, 2, 0, 1, 4, 3])
    results = gen.generate([Request(tuple(p), NEW, ignore_eos=True) for p in PROMPTS])
    assert [r.output_ids for r in results] == expected
    lone = gen.generate([Request(tuple(PROMPTS[0]), NEW, ignore_eos=True)])[0]
    assert lone.output_ids == expected[0] and 0 in lone.draft_lengths
    assert {w for _, w in widths} == {2, 4, 6} and min(rows for rows, _ in widths) == 2


@text_only
def test_compiled_prefill_stays_exact(hybrid):
    """Compiled modes prefill through torch.compile, each prompt right-padded to `step_mode.PREFILL_ALIGN` tokens:
    the recurrent layers fold only each row's real tokens (12, 5 and 30 of 16, 16 and 32), alone or batched, and
    prompt lengths are symbolic: one graph for a lone prompt, one for several (the cached passes run eager here:
    this is the prefill's test, and compiling them would add minutes)."""
    _, path, expected = hybrid
    gen = Generator(load_target(path).model, ScriptedProposer([p + e for p, e in zip(PROMPTS, expected)]))
    gen.set_step_mode(StepMode("compile"))
    gen.verify_pass, prefill, widths = gen.target, gen.prefill_pass, []
    gen.prefill_pass = lambda ids, ctx: widths.append(ids.shape) or prefill(ids, ctx)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    alone = [gen.generate([Request(tuple(p), NEW, ignore_eos=True)])[0].output_ids for p in PROMPTS]
    batched = gen.generate([Request(tuple(p), NEW, ignore_eos=True) for p in PROMPTS])
    assert alone == expected and [r.output_ids for r in batched] == expected
    assert not prefill.failed and torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 2
    assert widths == [(1, 16), (1, 16), (1, 32), (3, 32)]


def tp_engines_give(path, expected, tmp_path) -> None:
    """dflash-build torch engines of `path` at TP=1 and TP=2 (under tmp_path/tp1, tp2) decode the first two
    PROMPTS greedily into `expected`."""
    drafter = write_drafter(tmp_path / "drafter", seed=2)
    requests = [Request(tuple(p), NEW, ignore_eos=True) for p in PROMPTS[:2]]
    for tp in (1, 2):
        engine = build_engine(BuildSpec(target=str(path), drafter=str(drafter), output=str(tmp_path / f"tp{tp}"),
                                        tp=tp, dtype="float32"), "test")
        assert [r.output_ids for r in generate_with_engine(engine, requests)] == expected[:2]


@pytest.mark.parametrize("hybrid", ["multimodal"], indirect=True)
def test_tp2_engine_from_the_multimodal_checkpoint_is_exact(hybrid, tmp_path):
    """dflash-build torch engines at TP=1 and TP=2 (Gated DeltaNet heads and their state split over
    ranks): the language model alone, shards reassembling to its tensors, greedy output as transformers."""
    from trtllm_dflash.checkpoint.sharding import unshard_state

    hf, path, expected = hybrid
    tp_engines_give(path, expected, tmp_path)
    cfg = parse_target_config(json.loads((path / "config.json").read_text()), "c")
    shards = [load_file(str(tmp_path / "tp2" / "target" / f"rank{r}.safetensors")) for r in range(2)]
    assert shards[0]["model.layers.0.linear_attn.in_proj_qkv.weight"].shape[0] == 32  # half of q|k|v
    full = unshard_state(shards, cfg, cfg.vocab_size)
    checkpoint = load_file(str(path / "model.safetensors"))
    original = {k.replace("model.language_model.", "model."): v for k, v in checkpoint.items()
                if not k.startswith("model.visual.")}
    assert full.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(full[name], tensor), name


def test_sampled_output_follows_the_hybrid_targets_distribution(tmp_path):
    """Speculative sampling over a hybrid target (rollback at every rejection) is lossless: 2000 seeded
    requests of 3 tokens (the third comes after a rolled-back state) against the exact distribution
    enumerated with transformers (tests/sample/test_sampling.py's chi-square check, power-checked there)."""
    from helpers.distribution import PROMPT, V, chi_square_rejects, exact_distribution, sample
    from helpers.tiny_models import drafter_config

    from trtllm_dflash.sample.sampling import SamplingParams

    hf = make_hf_hybrid(tmp_path / "target", "text", seed=7, vocab_size=V, eos_token_id=None)
    with torch.no_grad():
        hf.lm_head.weight.mul_(0.4)  # soften the logits: every token has real probability mass
    hf.save_pretrained(tmp_path / "target")
    write_drafter(tmp_path / "drafter", drafter_config(block_size=3, mask_token_id=V - 1, vocab_size=V), seed=8)
    params, n_new, samples = SamplingParams(1.0), 3, 2000
    counts, results = sample(load_pipeline(tmp_path / "target", tmp_path / "drafter").generator, params, n_new, samples)
    drafted, accepted = sum(r.drafted_tokens for r in results), sum(r.accepted_tokens for r in results)
    assert 0.1 * drafted < accepted < 0.9 * drafted
    assert all(len(r.output_ids) == n_new for r in results) and len(PROMPT) == 5
    rejects, stat, critical = chi_square_rejects(counts, exact_distribution(hf, params, n_new), samples)
    assert not rejects, f"chi-square {stat:.1f} > {critical:.1f}"


def qwen3_next(path, **fields):
    from helpers.tiny_models import hybrid_text_config, randomize
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    torch.manual_seed(6)
    hf = AutoModelForCausalLM.from_config(Qwen3NextConfig(**hybrid_text_config(), **fields),
                                          attn_implementation="eager").eval()
    randomize(hf)
    hf.save_pretrained(path)
    return hf


@pytest.mark.parametrize("fields", [dict(num_experts=0), dict(MOE_FIELDS, mlp_only_layers=[1])],
                         ids=["dense", "moe"])
def test_qwen3_next(tmp_path, fields):
    """Qwen3-Next: the same layers behind fused in_proj_qkvz / in_proj_ba (regrouped at load) and plain
    RoPE; dense, or experts with a gated shared expert in every layer but mlp_only_layers (here layer 1)."""
    hf = qwen3_next(tmp_path / "next", **fields)
    cfg = parse_target_config(json.loads((tmp_path / "next" / "config.json").read_text()), "c")
    assert (cfg.moe is None) if not fields.get("num_experts") else cfg.moe.layers == (0, 2, 3)
    target = load_target(tmp_path / "next").model
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(3))
    logits, _ = run(target, target.new_cache(1, 32), ids, torch.zeros(1, dtype=torch.long), torch.tensor([0]),
                    torch.tensor([24]))
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(ids).logits, atol=1e-4, rtol=0)
    drafter = write_drafter(tmp_path / "drafter", seed=2)
    gen = load_pipeline(tmp_path / "next", drafter).generator
    result = gen.generate([Request(tuple(PROMPTS[0]), NEW, ignore_eos=True)])
    assert result[0].output_ids == hf_generate(hf, PROMPTS[0], NEW)


@pytest.fixture(scope="module", params=["text", "multimodal"])
def hybrid_moe(request, tmp_path_factory):
    """Qwen3.5-MoE (Qwen3_5MoeForCausalLM / ...ForConditionalGeneration): its greedy continuations of PROMPTS."""
    path = tmp_path_factory.mktemp("hybrid-moe") / request.param
    hf = make_hf_hybrid(path, request.param, seed=5, moe=True)
    add_tokenizer(path)
    return hf, path, [hf_generate(hf, p, NEW) for p in PROMPTS]


def test_moe_config_is_transformers(hybrid_moe):
    """Experts in every layer, routing renormalised (Qwen3_5MoeTopKRouter always does), a gated shared expert."""
    hf, path, _ = hybrid_moe
    cfg = parse_target_config(json.loads((path / "config.json").read_text()), "c").moe
    assert (cfg.num_experts, cfg.top_k, cfg.intermediate_size, cfg.shared_expert_intermediate_size) == (4, 2, 16, 24)
    assert cfg.norm_topk_prob and cfg.shared_expert_gate and cfg.layers == (0, 1, 2, 3)


def test_moe_greedy_equals_transformers_generate(hybrid_moe, tmp_path):
    """Plain and DFlash decoding of Qwen3.5-MoE, 48 tokens, three prompts in one batch."""
    _, path, expected = hybrid_moe
    for drafter in (None, write_drafter(tmp_path / "drafter", seed=2)):
        assert greedy(path, drafter) == expected


@pytest.mark.parametrize("hybrid_moe", ["text"], indirect=True)
def test_moe_batch_with_different_acceptance_in_one_step_stays_exact(hybrid_moe):
    _, path, expected = hybrid_moe
    assert any(len(set(step)) == 3 for step in scripted_batch(path, expected))


@pytest.mark.parametrize("hybrid_moe", ["multimodal"], indirect=True)
def test_moe_tp2_engine_is_exact(hybrid_moe, tmp_path):
    """dflash-build torch engines of the multimodal Qwen3.5-MoE checkpoint at TP=1 and TP=2 (experts split
    inside each expert, linear-attention heads split): greedy output as transformers."""
    _, path, expected = hybrid_moe
    tp_engines_give(path, expected, tmp_path)


@text_only
def test_requests_that_change_slot_keep_their_recurrent_state(hybrid, tmp_path):
    """The first request finishes early and the last moves into its slot (K/V of the attention layers, the
    linear-attention layers' state and the drafter's context go along); greedy output stays transformers'."""
    _, path, expected = hybrid
    gen = load_pipeline(path, write_drafter(tmp_path / "drafter", seed=2)).generator
    lengths = [5, NEW, NEW]
    moved, move = [], gen.caches.move

    def recording(seq, dst):  # the state the request had in its old slot is the state it has in the new one
        state = gen.cache.state
        before = state.conv[:, seq.slot].clone(), state.ssm[:, seq.slot].clone()
        moved.append((seq.slot, dst))
        move(seq, dst)
        assert torch.equal(state.conv[:, dst], before[0]) and torch.equal(state.ssm[:, dst], before[1])

    gen.caches.move = recording
    results = gen.generate([Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)])
    assert moved[0] == (2, 0)  # (and a later one, when the moved request ends before the one in slot 1)
    assert [r.output_ids for r in results] == [e[:n] for e, n in zip(expected, lengths)]


@text_only
def test_a_decode_step_reads_the_device_once(hybrid, tmp_path, monkeypatch):
    """Gated DeltaNet layers included (verify, rollback commit, plain steps, a move): no tensor built from host
    data, one device read per step (tests/helpers/host_traffic.py)."""
    _, path, _ = hybrid
    gen = load_pipeline(path, write_drafter(tmp_path / "drafter", seed=2)).generator
    gen.allocate(3, 100, gen.block)
    gen.admit([Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, (2, NEW, NEW))])
    calls = host_traffic_of_steps(gen, (3, 0, 3, 0), monkeypatch)
    assert calls == ["tolist"] * 4 and sorted(gen.slots.running) == [0, 1]  # the last request moved to slot 0
