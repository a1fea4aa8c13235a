"""MiniMax-M2 and Laguna targets against transformers 5.24 (their sigmoid-routed experts with a correction bias).

Tiny random transformers models, every feature on within a short test:
- MiniMax-M2: q/k RMSNorm over the whole projection (norm weights off 1), partial RoPE (rotary_dim 8 of head_dim 16),
  eight experts (top 2) in every layer, a random e_score_correction_bias.
- Laguna: a dense first layer then experts with a shared expert, a router soft-cap and a routed scaling factor;
  per-layer query heads; softplus per-head output gates; a 6-token window on the layers listed sliding (shorter
  than every test sequence); RoPE per layer type (half of head_dim on full-attention layers).
Greedy output is compared token for token with transformers' own greedy `generate`.
"""

import json

import pytest
import torch
from helpers.scripted import ScriptedProposer, scripted_results
from helpers.tiny_models import VOCAB, add_tokenizer, hf_generate, randomize, write_drafter, write_laguna_drafter
from safetensors.torch import load_file
from trtllm_dflash.checkpoint.loader import load_target
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request
from trtllm_dflash.models.attention import ForwardContext
from trtllm_dflash.models.registry import parse_target_config

PROMPTS = [list(range(3, 21)), [7, 50, 2, 9], list(range(60, 85))]
N = 32
BLOCK = 8  # verify blocks longer than Laguna's window
ATOL = 2e-5
S, F_ = "sliding_attention", "full_attention"
COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-6, eos_token_id=1, bos_token_id=2, pad_token_id=0,
              tie_word_embeddings=False)
CONFIGS = {
    "minimax_m2": dict(COMMON, head_dim=16, rotary_dim=8, intermediate_size=32, num_local_experts=8,
                       num_experts_per_tok=2, rope_theta=10000.0),
    "laguna": dict(COMMON, head_dim=8, intermediate_size=64, num_attention_heads_per_layer=[4, 8, 2, 4],
                   layer_types=[F_, S, S, F_], sliding_window=6, num_experts=8, num_experts_per_tok=2,
                   moe_intermediate_size=16, shared_expert_intermediate_size=24, moe_routed_scaling_factor=1.5,
                   moe_router_logit_softcapping=2.0,
                   rope_parameters={F_: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                                    S: {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 1.0}}),
}
SEEDS = {"minimax_m2": 1, "laguna": 3}  # seeds whose greedy continuations vary


def make_hf(path, model_type: str, seed: int = 0):
    """A random transformers model of `model_type` (CONFIGS), saved; norms, gates and correction biases off their
    neutral values."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **CONFIGS[model_type]),
                                             attn_implementation="eager")
    randomize(model)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("e_score_correction_bias"):
                t.normal_(0, 0.1)
    model.eval().save_pretrained(path)
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def target(request, tmp_path_factory):
    """(transformers model, its directory, its greedy continuations of PROMPTS)."""
    path = tmp_path_factory.mktemp("sigmoid") / request.param
    hf = make_hf(path, request.param, seed=SEEDS[request.param])
    add_tokenizer(path)
    return hf, path, [hf_generate(hf, p, N) for p in PROMPTS]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return write_drafter(tmp_path_factory.mktemp("sigmoid-drafter") / "d", seed=8)


@pytest.fixture(scope="module")
def laguna_drafter(tmp_path_factory):
    """Laguna's own DFlash drafter (helpers/tiny_models.py laguna_drafter_config), layer 0's q/k/v fused."""
    return write_laguna_drafter(tmp_path_factory.mktemp("laguna-drafter") / "d", seed=9)


def routed_experts(hf, seq: torch.Tensor) -> set[tuple[int, ...]]:
    """The expert sets transformers' routers chose over seq [1, T] (every MoE layer, every token)."""
    chosen = set()
    hooks = [m.register_forward_hook(lambda m, a, out: chosen.update(map(tuple, out[2].sort(-1).values.tolist())))
             for name, m in hf.named_modules() if name.endswith("mlp.gate")]
    try:
        with torch.no_grad():
            hf(seq)
    finally:
        for h in hooks:
            h.remove()
    return chosen


def test_config_reads_what_transformers_builds(target):
    hf, path, expected = target
    cfg = parse_target_config(json.loads((path / "config.json").read_text()), "c")
    assert cfg.moe.routing == "sigmoid_topk" and (cfg.moe.num_experts, cfg.moe.top_k) == (8, 2)
    if cfg.model_type == "minimax_m2":
        assert cfg.partial_rotary_factor == hf.config.rope_parameters["partial_rotary_factor"] == 0.5
        assert cfg.moe.layers == (0, 1, 2, 3) and cfg.moe.intermediate_size == 32 and cfg.sliding_window is None
    else:
        lg = cfg.laguna
        assert lg.heads == (4, 8, 2, 4) and lg.gating == "per-head" and cfg.layer_types == (F_, S, S, F_)
        assert cfg.moe.layers == (1, 2, 3) and cfg.moe.shared_expert_intermediate_size == 24
        assert (cfg.moe.routed_scaling_factor, cfg.moe.router_softcap, cfg.sliding_window) == (1.5, 2.0, 6)
        assert {kind: share for kind, (_, share) in lg.ropes.items()} == {F_: 0.5, S: 1.0}
    assert len(routed_experts(hf, torch.tensor([PROMPTS[2]]))) > 8  # routing changes from token to token
    assert len({tuple(e) for e in expected}) == len(PROMPTS) and all(len(set(e)) > 6 for e in expected)


@pytest.mark.parametrize("model_type, change, message", [
    ("laguna", {"moe_apply_router_weight_on_input": True}, "unsupported moe_apply_router_weight_on_input true"),
    ("laguna", {"num_attention_heads_per_layer": [4, 3, 4, 4]}, "field 'num_attention_heads_per_layer' must list 4"),
    ("laguna", {"gating": "per-token"}, "unsupported gating 'per-token'"),
    ("laguna", {"mlp_layer_types": ["dense", "moe", "sparse", "sparse"]}, "field 'mlp_layer_types' must list 4"),
    ("minimax_m2", {"rotary_dim": 3}, "partial_rotary_factor must be in (0, 1] and turn an even number"),
])
def test_bad_configs_name_the_field(model_type, change, message):
    from trtllm_dflash.utils.errors import DFlashError

    with pytest.raises(DFlashError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_target_config({"model_type": model_type, **CONFIGS[model_type], **change}, "c")


def test_logits_and_hidden_states_after_rollback(target):
    """Ragged prefill, a verify block that is mostly rejected, then the accepted prefix continued: every logit and
    captured layer equals a full transformers pass."""
    hf, path, _ = target
    model = load_target(path).model
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, VOCAB, (2, 30), generator=g)
    cache = model.new_cache(2, 40, 8)
    lengths = torch.tensor([12, 9])  # row 1 is right-padded past its 9 prompt tokens
    junk = torch.randint(0, VOCAB, (2, 8), generator=g)
    starts = lengths + torch.tensor([2, 0])  # rows keep 2 and 0 tokens of the junk block
    cont = torch.stack([seq[0, 14:22], seq[1, 9:17]])
    layers = tuple(range(model.config.num_hidden_layers))
    positions = starts[:, None] + torch.arange(8)
    with torch.no_grad():
        model(seq[:, :12], ForwardContext.prefill(torch.arange(12).expand(2, -1), cache, torch.arange(2), lengths))
        model(junk, ForwardContext.cached(lengths[:, None] + torch.arange(8), cache, int(lengths.max()) + 8))
        hidden, feats = model(cont, ForwardContext.cached(positions, cache, int(positions.max()) + 1,
                                                          capture_layer_ids=layers))
    fulls = [torch.cat([seq[0, :12], junk[0, :2], cont[0]]), torch.cat([seq[1, :9], cont[1]])]
    for row, full in enumerate(fulls):
        with torch.no_grad():
            ref = hf(full[None], output_hidden_states=True)
        torch.testing.assert_close(model.logits(hidden[row:row + 1]), ref.logits[:, -8:], atol=ATOL, rtol=0)
        expected = torch.cat([ref.hidden_states[i + 1][:, -8:] for i in layers], dim=-1)
        torch.testing.assert_close(feats[row:row + 1], expected, atol=ATOL, rtol=0)


def test_plain_greedy_equals_transformers(target):
    hf, path, expected = target
    results = load_pipeline(path).generator.generate([Request(tuple(p), N, ignore_eos=True) for p in PROMPTS])
    assert [r.output_ids for r in results] == expected


def test_dflash_greedy_equals_transformers(target, drafter):
    """A ragged batch whose first request ends early (the last moves into its slot)."""
    hf, path, expected = target
    gen = load_pipeline(path, drafter).generator
    lengths = (6, N, N)
    results = gen.generate([Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)], BLOCK)
    assert [r.output_ids for r in results] == [e[:n] for e, n in zip(expected, lengths)]


def test_every_acceptance_length_stays_exact(target):
    """Drafts right up to a per-row, per-step offset (the oracle's own greedy continuation, then wrong): each step
    accepts exactly the drafts that continuation implies, rows accepting different lengths in one step."""
    hf, path, expected = target
    results = scripted_results(path, expected, PROMPTS, N)
    assert len({a for r in results for a in r.acceptance_lengths}) == ScriptedProposer.max_block_size


@pytest.mark.slow  # two rank processes
def test_tp2_engine_equals_transformers(target, drafter, tmp_path):
    """dflash-build --backend torch at TP 2 (heads, their norms or gates, experts split; MiniMax-M2's full-width
    QK-norm from the all-reduced sum of squares), generated on two ranks (gloo on loopback): DFlash output equals
    transformers', and the rank shards reassemble to the checkpoint as loaded."""
    from trtllm_dflash.checkpoint.layout import target_tensors
    from trtllm_dflash.checkpoint.sharding import unshard_state
    from trtllm_dflash.cli.build import main as build_main
    from trtllm_dflash.engine.loader import generate_with_engine

    hf, path, expected = target
    out = tmp_path / "tp2"
    assert build_main(["--target", str(path), "--drafter", str(drafter), "--output", str(out), "--tp", "2",
                       "--dtype", "float32"]) == 0
    results = generate_with_engine(out, [Request(tuple(p), N, ignore_eos=True) for p in PROMPTS])
    assert [r.output_ids for r in results] == expected
    cfg = parse_target_config(json.loads((path / "config.json").read_text()), "c")
    shards = [load_file(str(out / "target" / f"rank{r}.safetensors")) for r in range(2)]
    full = unshard_state(shards, cfg, cfg.vocab_size)
    checkpoint = target_tensors(cfg, load_file(str(path / "model.safetensors")))
    assert full.keys() == checkpoint.keys()
    for name, tensor in checkpoint.items():
        assert torch.equal(full[name], tensor), name


def test_trtllm_backend_builds_with_its_evidence(target, drafter, tmp_path):
    """--backend trtllm accepts both (upstream DFlash runs on them: builder/trtllm/targets.py) and writes an engine
    directory that verifies."""
    from trtllm_dflash.builder.trtllm.targets import TrtllmTarget
    from trtllm_dflash.cli.build import main as build_main

    _, path, _ = target
    t = TrtllmTarget.from_dict(json.loads((path / "config.json").read_text()), "c")
    assert t.status == "tested" and t.moe and ("MiniMax-M2.5" in t.source or "#15666" in t.source)
    out = tmp_path / "engine"
    assert build_main(["--target", str(path), "--drafter", str(drafter), "--output", str(out), "--backend", "trtllm",
                       "--gpu", "b200"]) == 0
    assert build_main(["verify", str(out)]) == 0


@pytest.mark.parametrize("target", ["laguna"], indirect=True)  # the drafter is trained for Laguna targets
def test_laguna_drafter_greedy_equals_transformers(target, laguna_drafter):
    """Laguna's drafter (aux norms, gates, context input_layernorm, a causal sliding layer) over the Laguna target:
    alone and batched, DFlash output equals transformers' greedy output."""
    _, path, expected = target
    gen = load_pipeline(path, laguna_drafter).generator
    assert type(gen.proposer.drafter).__name__ == "LagunaDrafter"
    alone = gen.generate([Request(tuple(PROMPTS[2]), N, ignore_eos=True)], BLOCK)
    assert alone[0].output_ids == expected[2]
    batched = gen.generate([Request(tuple(p), N, ignore_eos=True) for p in PROMPTS], BLOCK)
    assert [r.output_ids for r in batched] == expected


@pytest.mark.parametrize("target", ["laguna"], indirect=True)  # the drafter is trained for Laguna targets
def test_laguna_drafter_builds_for_both_backends(target, laguna_drafter, tmp_path):
    """dflash-build --backend torch (TP 2: the gates' rows split with the heads, each rank's shard checked against
    its model) and --backend trtllm accept the pair (TensorRT-LLM's DFlashLagunaForCausalLM reads its architectures
    and the aux_hidden_norms); both engines verify."""
    from trtllm_dflash.cli.build import main as build_main

    _, path, _ = target
    for backend in ("torch", "trtllm"):
        out = tmp_path / backend
        extra = ["--gpu", "b200"] if backend == "trtllm" else ["--dtype", "float32", "--tp", "2"]
        assert build_main(["--target", str(path), "--drafter", str(laguna_drafter), "--output", str(out),
                           "--backend", backend, *extra]) == 0
        assert build_main(["verify", str(out)]) == 0
    written = load_file(str(tmp_path / "trtllm" / "drafter" / "model.safetensors"))
    assert "aux_hidden_norms.0.weight" in written and "layers.0.self_attn.g_proj.weight" in written
    gates_name = "layers.1.self_attn.g_proj.weight"  # [heads, hidden]: rank r holds heads 2r, 2r + 1
    gates = [load_file(str(tmp_path / "torch" / "drafter" / f"rank{r}.safetensors"))[gates_name] for r in range(2)]
    assert torch.equal(torch.cat(gates), load_file(str(laguna_drafter / "model.safetensors"))[gates_name])
