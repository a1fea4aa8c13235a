"""Gemma 4 targets (dense and MoE; text-only and multimodal checkpoints) against transformers 5.24.

Tiny random transformers models (tiny_models.GEMMA4_TEXT): a sliding window of 6 tokens, shorter than every
test sequence; full-attention layers with their own head_dim and one K/V head (attention_k_eq_v, proportional
RoPE); the last two layers sharing K/V with double-wide MLPs; per-layer input embeddings; a final soft-cap.
Greedy output is compared token for token with transformers' own greedy `generate`.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from helpers.host_traffic import host_traffic_of_steps
from helpers.oracle import ReferenceDrafter, reference_dflash_greedy
from safetensors.torch import load_file
from helpers.scripted import ScriptedProposer, scripted_results
from helpers.tiny_models import GEMMA4_TEXT, VOCAB, add_tokenizer, drafter_config, hf_generate, make_hf_gemma4, write_drafter
from trtllm_dflash.checkpoint.loader import load_target
from trtllm_dflash.config.model import TargetConfig
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.compilation.step_mode import StepMode, StepShapes
from trtllm_dflash.models.attention import ForwardContext
from trtllm_dflash.models.registry import parse_target_config
from trtllm_dflash.utils.errors import DFlashError

PROMPTS = [list(range(3, 21)), [7, 50, 2, 9], list(range(60, 85))]
N = 40
BLOCK = 8  # verify blocks wider than the window
ATOL, RTOL = 2e-5, 1e-5  # the residual stream reaches |x| ~ 5 (sqrt(hidden)-scaled embeddings): fp32 rounding
S, F_ = "sliding_attention", "full_attention"


@pytest.fixture(scope="module", params=[("text", False, 8), ("multimodal", True, 3)],
                ids=["text-dense", "multimodal-moe"])
def gemma(request, tmp_path_factory):
    """(transformers model, its directory, its greedy continuations of PROMPTS). Seeds whose continuations vary."""
    layout, moe, seed = request.param
    path = tmp_path_factory.mktemp("gemma4") / f"{layout}-{moe}"
    hf = make_hf_gemma4(path, layout, moe, seed=seed)
    add_tokenizer(path)
    return hf, path, [hf_generate(hf, p, N) for p in PROMPTS]


text_only = pytest.mark.parametrize("gemma", [("text", False, 8)], indirect=True, ids=["text-dense"])


@pytest.fixture(scope="module")
def drafter_cfg():
    cfg = drafter_config(target_layers=6)
    cfg["dflash_config"]["target_layer_ids"] = [1, 5]  # a middle layer's output and the last (after the norm)
    return cfg


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, drafter_cfg):
    return write_drafter(tmp_path_factory.mktemp("gemma4-drafter") / "d", drafter_cfg, seed=8)


def config_of(path) -> TargetConfig:
    return parse_target_config(json.loads((path / "config.json").read_text()), "c")


def test_config_reads_what_transformers_builds(gemma):
    hf, path, expected = gemma
    cfg, text = config_of(path), hf.config.get_text_config()
    g = cfg.gemma4
    assert cfg.layer_types == tuple(text.layer_types) == (S, S, F_) * 2 and cfg.sliding_window == 6
    for i in range(6):
        layer = text.per_layer_config[i]
        assert cfg.kv_heads_and_dim(i) == (layer.num_key_value_heads, layer.head_dim)
    assert (g.sliding.head_dim, g.full.head_dim, g.full.num_kv_heads) == (8, 16, 1)
    sources = [g.kv_source(i, cfg.layer_types) for i in range(6)]
    assert sources == [0, 1, 2, 3, 3, 2] and text.kv_sharing_modes == [None, None, "store", "store", "reuse", "reuse"]
    assert (g.k_eq_v, g.per_layer_input, g.per_layer_vocab, g.double_wide_mlp) == (True, 4, VOCAB, True)
    assert g.final_logit_softcapping == 30.0 and cfg.tie_word_embeddings
    assert (cfg.moe is not None) == text.enable_moe_block
    ours, theirs = load_target(path).model.rotary.by_kind, getattr(hf.model, "language_model", hf.model).rotary_emb
    for kind in (S, F_):
        torch.testing.assert_close(ours[kind].inv_freq, getattr(theirs, f"{kind}_inv_freq"), atol=0, rtol=0)
    assert len({tuple(e) for e in expected}) == len(PROMPTS) and all(len(set(e)) > 8 for e in expected)


@pytest.mark.parametrize("fields", [
    # as published checkpoints write the full-attention shapes (no per_layer_config)
    {k: v for k, v in GEMMA4_TEXT.items()},
    # every field transformers defaults left out: 7 layers (the last made full), PLE of 256, window 512, tied head
    dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=7, num_attention_heads=4,
         head_dim=8, layer_types=[S] * 7),
    dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
         num_key_value_heads=4, head_dim=8, attention_k_eq_v=False, num_global_key_value_heads=1, global_head_dim=32,
         rope_parameters={S: {"rope_type": "default", "rope_theta": 5.0},
                          F_: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 7.0,
                               "factor": 2.0}}),
], ids=["global-fields", "defaults", "no-k-eq-v"])
def test_config_fields_left_to_transformers_defaults(fields):
    """Configs as transformers reads them (AutoConfig: defaults, global_head_dim, num_global_key_value_heads only
    with attention_k_eq_v), and the inverse frequencies its rotary embedding computes."""
    from transformers import AutoConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    from trtllm_dflash.models.gemma4.layers import LayerTypeRotary

    text = AutoConfig.for_model("gemma4_text", **fields)
    cfg = parse_target_config({"model_type": "gemma4_text", **fields}, "c")
    layers = text.num_hidden_layers
    assert cfg.layer_types == tuple(text.layer_types) and cfg.sliding_window == text.sliding_window
    assert [cfg.kv_heads_and_dim(i) for i in range(layers)] == [
        (text.per_layer_config[i].num_key_value_heads, text.per_layer_config[i].head_dim) for i in range(layers)]
    assert (cfg.gemma4.per_layer_input, cfg.tie_word_embeddings, cfg.vocab_size) == (
        text.hidden_size_per_layer_input, text.tie_word_embeddings, text.vocab_size)
    ours, theirs = LayerTypeRotary(cfg.gemma4, set(cfg.layer_types)), Gemma4TextRotaryEmbedding(text)
    for kind in set(cfg.layer_types):
        torch.testing.assert_close(ours.by_kind[kind].inv_freq, getattr(theirs, f"{kind}_inv_freq"), atol=0, rtol=0)


@pytest.mark.parametrize("change, message", [
    ({"hidden_activation": "silu"}, "unsupported hidden_activation 'silu' (Gemma 4: 'gelu_pytorch_tanh')"),
    ({"rope_parameters": {S: {"rope_type": "yarn", "rope_theta": 1.0}, F_: {"rope_theta": 1.0}}},
     f"unsupported rope_type 'yarn' for {S}"),
    ({"num_kv_shared_layers": 6}, "num_kv_shared_layers 6 leaves no layer computing K/V"),
    ({"layer_types": [S] * 5 + [F_], "num_kv_shared_layers": 1}, f"shares {F_} layers but no layer before layer 5"),
    ({"per_layer_config": {"2": {"head_dim": 16}, "5": {"head_dim": 32}}}, "gives full_attention layers different"),
    ({"per_layer_config": {"2": {"intermediate_size": 16}}}, "unsupported per_layer_config entry '2'"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention 'all' makes a non-causal encoder"),
])
def test_bad_configs_name_the_field(change, message):
    with pytest.raises(DFlashError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_target_config({"model_type": "gemma4_text", **GEMMA4_TEXT, **change}, "c")


def test_logits_and_hidden_states_after_rollback(gemma):
    """Ragged prefill, verify a block that is mostly rejected, continue from the accepted prefix: every logit
    (soft-capped) and captured layer equals a full transformers pass: the sliding rings overwrote rejected K/V,
    and the layers sharing K/V read their source layer's cache."""
    hf, path, _ = gemma
    target = load_target(path).model
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, VOCAB, (2, 30), generator=g)
    cache = target.new_cache(2, 40, 8)
    lengths = torch.tensor([12, 9])  # row 1 is right-padded past its 9 prompt tokens
    junk = torch.randint(0, VOCAB, (2, 8), generator=g)
    starts = lengths + torch.tensor([2, 0])  # rows keep 2 and 0 tokens of the junk block
    cont = torch.stack([seq[0, 14:22], seq[1, 9:17]])
    layers = tuple(range(6))
    positions = starts[:, None] + torch.arange(8)
    with torch.no_grad():
        target(seq[:, :12], ForwardContext.prefill(torch.arange(12).expand(2, -1), cache, torch.arange(2), lengths))
        target(junk, ForwardContext.cached(lengths[:, None] + torch.arange(8), cache, int(lengths.max()) + 8))
        hidden, feats = target(cont, ForwardContext.cached(positions, cache, int(positions.max()) + 1,
                                                           capture_layer_ids=layers))
    fulls = [torch.cat([seq[0, :12], junk[0, :2], cont[0]]), torch.cat([seq[1, :9], cont[1]])]
    for row, full in enumerate(fulls):
        with torch.no_grad():
            ref = hf(full[None], output_hidden_states=True)
        torch.testing.assert_close(target.logits(hidden[row:row + 1]), ref.logits[:, -8:], atol=ATOL, rtol=RTOL)
        expected = torch.cat([ref.hidden_states[i + 1][:, -8:] for i in layers], dim=-1)
        torch.testing.assert_close(feats[row:row + 1], expected, atol=ATOL, rtol=RTOL)


def test_cache_keeps_the_window_and_nothing_for_shared_layers(gemma):
    """Layers 0-3 compute K/V: sliding 0, 1, 3 in rings of window + block - 1 (and a spare) with head_dim 8,
    full layer 2 paged (pool blocks for the whole capacity of both rows, and a null block) with head_dim 16 and its
    one K/V head; layers 4 and 5 keep nothing."""
    from trtllm_dflash.cache.kv_cache import BLOCK, blocks_for

    _, path, _ = gemma
    target = load_target(path).model
    cache = target.new_cache(2, 1000, 16)
    assert [layer.kind for layer in cache.layers] == ["window", "window", "full", "window"]
    pool = (2 * blocks_for(1000 + 1) + 1, BLOCK, 1, 16)  # positions 0..capacity per row
    assert [layer.k.shape for layer in cache.layers] == [(2, 2, 6 + 16 - 1 + 1, 8)] * 2 + [pool] + [
        (2, 2, 6 + 16 - 1 + 1, 8)]
    assert [layer.cache_index for layer in target.model.layers] == [0, 1, 2, 3, 3, 2]


def test_plain_greedy_equals_transformers(gemma):
    hf, path, expected = gemma
    results = load_pipeline(path).generator.generate([Request(tuple(p), N, ignore_eos=True) for p in PROMPTS])
    assert [r.output_ids for r in results] == expected


def test_dflash_greedy_equals_transformers(gemma, drafter):
    """A ragged batch whose first request ends early (the last moves into its slot with its rings), and one
    request alone."""
    hf, path, expected = gemma
    gen = load_pipeline(path, drafter).generator
    lengths = (6, N, N)
    results = gen.generate([Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)], BLOCK)
    assert [r.output_ids for r in results] == [e[:n] for e, n in zip(expected, lengths)]
    assert gen.generate([Request(tuple(PROMPTS[2]), N, ignore_eos=True)], BLOCK)[0].output_ids == expected[2]


def test_every_acceptance_length_stays_exact(gemma):
    """Drafts right up to a per-row, per-step offset: rows accept different lengths in one step."""
    hf, path, expected = gemma
    results = scripted_results(path, expected, PROMPTS, N)
    assert len({a for r in results for a in r.acceptance_lengths}) == ScriptedProposer.max_block_size


@text_only
def test_drafts_match_the_reference_drafter(gemma, drafter, drafter_cfg):
    """The drafter reads decoder-layer outputs at target_layer_ids (the last after the final norm) and embeds its
    block with the raw embedding rows (vLLM's DFlash shares the target's unscaled embed_tokens): its drafts and
    acceptance equal the reference loop's, which recomputes everything with transformers."""
    hf, path, _ = gemma
    weights = load_file(str(drafter / "model.safetensors"))
    raw = lambda ids: F.embedding(ids, hf.get_input_embeddings().weight)  # noqa: E731
    prompt = PROMPTS[0]
    ref_out, ref_lengths, ref_drafts = reference_dflash_greedy(hf, ReferenceDrafter(drafter_cfg, weights), prompt, 24,
                                                              BLOCK, embed=raw)
    gen = load_pipeline(path, drafter).generator
    drafts = []
    propose = gen.proposer.propose
    gen.proposer.propose = lambda *a: drafts.append(propose(*a)) or drafts[-1]
    result = gen.generate([Request(tuple(prompt), 24, ignore_eos=True)], BLOCK)[0]
    assert [d[0][0].tolist() for d in drafts] == ref_drafts
    assert result.output_ids == ref_out and result.acceptance_lengths == ref_lengths


def test_padded_steps_equal_transformers(gemma, drafter):
    """CUDA-graph steps' padding, run eagerly: rows, verify width and key span padded to buckets (padding rows are
    free slots, padding drafts never accepted, keys past a row's queries never visible), windows and shared K/V
    included."""
    hf, path, expected = gemma
    gen = load_pipeline(path, drafter).generator
    gen.set_step_mode(StepMode("eager", StepShapes(min_span=16, min_rows=2, min_width=2)))
    results = gen.generate([Request(tuple(p), N, ignore_eos=True) for p in PROMPTS], BLOCK)
    assert [r.output_ids for r in results] == expected


@text_only
def test_compiled_steps_equal_transformers(gemma, drafter):
    """torch.compile on the CPU: the load compiles every graph (per-layer-type RoPE, shared K/V and per-layer
    inputs inside one graph per pass), then greedy DFlash output is transformers'. (The MoE variant's experts run
    torch's grouped GEMM, whose compiled kernel takes bf16 only: in float32 they would run eager, as
    tests/compilation/test_step_mode.py checks for gpt-oss.)"""
    hf, path, expected = gemma
    gen = load_pipeline(path, drafter, step_mode="compile").generator
    results = gen.generate([Request(tuple(p), N, ignore_eos=True) for p in PROMPTS], BLOCK)
    assert [r.output_ids for r in results] == expected
    assert not (gen.verify_pass.failed or gen.prefill_pass.failed or gen.proposer.draft_pass.failed)


def test_tp2_engine_equals_transformers(gemma, drafter, tmp_path):
    """dflash-build --backend torch at TP=2 (heads, MLPs and experts split; the full layers' one K/V head
    replicated; per-layer embeddings and routers replicated), generated on two ranks (gloo on loopback). The rank
    shards reassemble to the checkpoint's language model."""
    from trtllm_dflash.checkpoint.layout import target_tensors
    from trtllm_dflash.checkpoint.sharding import unshard_state
    from trtllm_dflash.engine.loader import generate_with_engine

    from trtllm_dflash.cli.build import main as build_main

    hf, path, expected = gemma
    out = tmp_path / "tp2"
    assert build_main(["--target", str(path), "--drafter", str(drafter), "--output", str(out), "--tp", "2",
                       "--dtype", "float32"]) == 0
    assert build_main(["verify", str(out)]) == 0
    lengths = (6, N, N)
    results = generate_with_engine(out, [Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)])
    assert [r.output_ids for r in results] == [e[:n] for e, n in zip(expected, lengths)]
    cfg = config_of(path)
    shards = [load_file(str(out / "target" / f"rank{r}.safetensors")) for r in range(2)]
    assert shards[0]["model.layers.2.self_attn.k_proj.weight"].shape == (16, 32)  # the one head, on both ranks
    full = unshard_state(shards, cfg, cfg.vocab_size)
    checkpoint = target_tensors(cfg, load_file(str(path / "model.safetensors")))  # the language model's, as loaded
    assert full.keys() == checkpoint.keys()
    for name, tensor in checkpoint.items():
        assert torch.equal(full[name], tensor), name


@pytest.mark.parametrize("layout", ["text", "multimodal"])
def test_trtllm_backend_refuses_gemma4(layout, tmp_path, capsys, drafter):
    from trtllm_dflash.cli.build import main as build_main

    make_hf_gemma4(tmp_path / "t", layout, seed=1)
    add_tokenizer(tmp_path / "t")
    capsys.readouterr()
    assert build_main(["--target", str(tmp_path / "t"), "--drafter", str(drafter), "--output", str(tmp_path / "e"),
                       "--backend", "trtllm"]) == 2
    err = capsys.readouterr().err.splitlines()
    arch = {"text": "Gemma4ForCausalLM (gemma4_text)", "multimodal": "Gemma4ForConditionalGeneration (gemma4)"}[layout]
    assert len(err) == 1 and f"{arch} has no DFlash in TensorRT-LLM (supported-models.md@00b6d5a2" in err[0], err
    assert not (tmp_path / "e").exists()


def test_a_decode_step_reads_the_device_once(gemma, drafter, monkeypatch):
    """Scaled embeddings, per-layer inputs, shared K/V and expert routing included: drafting and plain steps, and a
    move into a free slot, build no tensor from host data and read the device once per step."""
    _, path, _ = gemma
    gen = load_pipeline(path, drafter).generator
    gen.allocate(3, 100, BLOCK)
    gen.admit([Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, (2, 40, 40))])
    calls = host_traffic_of_steps(gen, (2, 0, 2, 0), monkeypatch)
    assert calls == ["tolist"] * 4 and sorted(gen.slots.running) == [0, 1]

