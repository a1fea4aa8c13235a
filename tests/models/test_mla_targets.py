"""DeepSeek-V3 targets and Kimi-K2.5's language model against transformers 5.24 (multi-head latent attention).

Tiny random transformers models, every feature on within a short test: q through the low-rank path (DeepSeek-V3)
or a plain q_proj (the Kimi-K2.5 fixture), kv low-rank with a decoupled shared RoPE key, interleaved RoPE (and
halves), YaRN with mscale / mscale_all_dim (softmax scale and cos / sin factor), one dense layer then experts routed
by sigmoid scores within 2 of 4 expert groups, with a shared expert and a routed scaling factor. Kimi-K2.5's
checkpoint is the multimodal one, in the published layout (`language_model.model.*` beside a vision tower). Greedy output is compared token
for token with transformers' own greedy `generate`.
"""

import copy
import json

import pytest
import torch
from helpers.scripted import ScriptedProposer, scripted_results
from helpers.tiny_models import VOCAB, add_tokenizer, hf_generate, randomize, write_drafter
from safetensors.torch import load_file, save_file
from trtllm_dflash.checkpoint.loader import load_target
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request
from trtllm_dflash.models.attention import ForwardContext
from trtllm_dflash.models.registry import parse_target_config

PROMPTS = [list(range(3, 21)), [7, 50, 2, 9], list(range(60, 85))]
N = 32
BLOCK = 8
ATOL = 2e-5
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
            routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=8, v_head_dim=8,
            qk_nope_head_dim=8, n_group=4, topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1,
            max_position_embeddings=256, eos_token_id=1, tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                             "mscale": 1.0, "mscale_all_dim": 0.8})
VISION = dict(patch_size=4, pos_emb_height=4, pos_emb_width=4, pos_emb_time=1, num_attention_heads=2,
              num_hidden_layers=1, hidden_size=16, intermediate_size=32)
KIMI_TEXT = dict(TEXT, q_lora_rank=None, rope_interleave=False)


def make_hf(path, model_type: str, seed: int = 0):
    """A random DeepseekV3ForCausalLM, or Kimi_K25ForConditionalGeneration with an untied head, saved; norms off 1,
    the routers' correction biases random."""
    import transformers as tf

    torch.manual_seed(seed)
    if model_type == "deepseek_v3":
        model = tf.AutoModelForCausalLM.from_config(tf.DeepseekV3Config(**TEXT), attn_implementation="eager")
    else:
        config = tf.Kimi_K25Config(text_config=KIMI_TEXT, vision_config=VISION, projection_hidden_size=16,
                                   tie_word_embeddings=False)
        model = tf.Kimi_K25ForConditionalGeneration._from_config(config, attn_implementation="eager")
    randomize(model)
    with torch.no_grad():
        for name, t in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                t.normal_(0, 0.1)
    model.eval().save_pretrained(path)
    if model_type == "kimi_k25":  # as moonshotai publishes it (transformers' writer renames the language model's
        save_file(published_kimi(model.state_dict()), str(path / "model.safetensors"))  # layers as vision blocks)
    return model


def published_kimi(state: dict) -> dict:
    """transformers' in-memory Kimi-K2.5 names -> the published `language_model.model.*` / `language_model.lm_head`
    (the vision tower kept under its in-memory names: the runtime skips it either way)."""
    out = {}
    for name, t in state.items():
        if name.startswith("model.language_model."):
            name = "language_model.model." + name[len("model.language_model."):]
        elif name == "lm_head.weight":
            name = "language_model.lm_head.weight"
        out[name] = t.contiguous()
    return out


@pytest.fixture(scope="module", params=["deepseek_v3", "kimi_k25"])
def target(request, tmp_path_factory):
    """(transformers model, its directory, its greedy continuations of PROMPTS)."""
    path = tmp_path_factory.mktemp("mla") / request.param
    hf = make_hf(path, request.param, seed=3)
    add_tokenizer(path)
    return hf, path, [hf_generate(hf, p, N) for p in PROMPTS]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return write_drafter(tmp_path_factory.mktemp("mla-drafter") / "d", seed=8)


def config_of(path):
    return parse_target_config(json.loads((path / "config.json").read_text()), "c")


def test_config_reads_what_transformers_builds(target):
    hf, path, expected = target
    cfg, text = config_of(path), hf.config.get_text_config()
    m = cfg.deepseek_v3
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim, m.v_head_dim) == (text.q_lora_rank, 16, 16, 8)
    assert m.rope_interleave == text.rope_interleave and cfg.head_dim == 8
    attention = (hf.model.language_model if cfg.model_type == "kimi_k25" else hf.model).layers[0].self_attn
    assert m.softmax_scale == pytest.approx(attention.scaling, rel=1e-12) and m.softmax_scale != 16 ** -0.5
    moe = cfg.moe
    assert moe.layers == (1, 2, 3) and (moe.n_group, moe.topk_group, moe.routed_scaling_factor) == (4, 2, 2.5)
    assert moe.shared_expert_intermediate_size == 16 and not cfg.tie_word_embeddings
    assert len({tuple(e) for e in expected}) == len(PROMPTS) and all(len(set(e)) > 6 for e in expected)


@pytest.mark.parametrize("change, message", [
    ({"n_routed_experts": 4}, "n_group 4 must divide n_routed_experts 4 into groups of at least 2"),
    ({"head_dim": 16}, "head_dim 16 must equal qk_rope_head_dim 8"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [4]}},
     "quantization_config.weight_block_size must be two positive ints"),
])
def test_bad_configs_name_the_field(change, message):
    from trtllm_dflash.utils.errors import DFlashError

    with pytest.raises(DFlashError, match=message):
        parse_target_config({"model_type": "deepseek_v3", **TEXT, **change}, "c")


def test_logits_and_hidden_states_after_rollback(target):
    """Ragged prefill, a verify block that is mostly rejected, then the accepted prefix continued: every logit and
    captured layer equals a full transformers pass (latents read back from the paged pool)."""
    hf, path, _ = target
    model = load_target(path).model
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, VOCAB, (2, 30), generator=g)
    cache = model.new_cache(2, 40, 8)
    lengths = torch.tensor([12, 9])
    junk = torch.randint(0, VOCAB, (2, 8), generator=g)
    starts = lengths + torch.tensor([2, 0])
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
        states = ref.hidden_states
        expected = torch.cat([states[i + 1][:, -8:] for i in layers], dim=-1)
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


def quantize(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [O, I] -> float8_e4m3fn weight and the fp32 scale of each block x block tile (its max / 448)."""
    rows, cols = -(-w.shape[0] // block), -(-w.shape[1] // block)
    scale = torch.zeros(rows, cols)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    for r in range(rows):
        for c in range(cols):
            tile = (slice(r * block, (r + 1) * block), slice(c * block, (c + 1) * block))
            scale[r, c] = w[tile].abs().max().clamp(min=1e-12) / 448.0
            q[tile] = (w[tile] / scale[r, c]).to(torch.float8_e4m3fn)
    return q, scale


def test_fp8_block_scaled_checkpoint_loads_dequantized(target, tmp_path):
    """As DeepSeek-V3 publishes: projections and experts float8_e4m3fn with `weight_scale_inv` per 4 x 4 block
    (partial blocks at the edges), an MTP layer at index num_hidden_layers: the model loads each weight as fp8 x its
    block's scale, drops the MTP layer, and its logits equal transformers' on that dequantized checkpoint. Kimi-K2.5
    in that format keeps its quantization_config on the wrapper (top level), beside text_config."""
    import transformers as tf

    hf, path, _ = target
    kimi = hf.config.model_type == "kimi_k25"
    tensors = load_file(str(path / "model.safetensors"))
    fp8, plain = {}, {}
    for name, t in tensors.items():
        if name.endswith("proj.weight") and t.dim() == 2:
            q, s = quantize(t, 4)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            plain[name] = q.float() * s.repeat_interleave(4, 0)[:t.shape[0]].repeat_interleave(4, 1)[:, :t.shape[1]]
        else:
            fp8[name] = plain[name] = t
    mtp = {} if kimi else {"model.layers.4.self_attn.kv_b_proj.weight": torch.zeros(32, 16)}
    config = json.loads((path / "config.json").read_text())
    quant = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [4, 4]}
    for d, weights, extra in (("fp8", {**fp8, **mtp}, {"quantization_config": quant}), ("plain", plain, {})):
        (tmp_path / d).mkdir()
        save_file(weights, str(tmp_path / d / "model.safetensors"))
        (tmp_path / d / "config.json").write_text(json.dumps({**config, **extra}))
    ours = load_target(tmp_path / "fp8").model
    if kimi:  # transformers' in-memory names (published_kimi reversed)
        theirs = copy.deepcopy(hf)
        theirs.load_state_dict({in_memory_kimi(k): v for k, v in plain.items()}, strict=True)
    else:
        theirs = tf.DeepseekV3ForCausalLM.from_pretrained(tmp_path / "plain", attn_implementation="eager").eval()
    seq = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        hidden, _ = ours(seq, ForwardContext.prefill(torch.arange(seq.shape[1])[None], ours.new_cache(1, 32),
                                                     torch.arange(1), torch.tensor([seq.shape[1]])))
        torch.testing.assert_close(ours.logits(hidden), theirs(seq).logits, atol=ATOL, rtol=0)
    assert any(not torch.equal(plain[k], tensors[k]) for k in plain if k.endswith("kv_b_proj.weight"))


def in_memory_kimi(name: str) -> str:
    if name.startswith("language_model.model."):
        return "model.language_model." + name[len("language_model.model."):]
    return "lm_head.weight" if name == "language_model.lm_head.weight" else name


# moonshotai/Kimi-K2.5's scheme: routed experts compressed-tensors pack-quantized int4, groups of 32 (see
# models/deepseek_v3/config.py check_quantization for the source)
KIMI_INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
             "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                           "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                       "strategy": "group", "group_size": 32, "dynamic": False}}},
             "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"]}


def test_int4_compressed_tensors_is_refused_naming_the_scheme(target, drafter, tmp_path, capsys):
    """Kimi-K2.5's published quantization_config (on the wrapper; DeepSeek-V3's at the top level too): dflash-build
    exits 2 with one line naming the scheme, before any weight is read."""
    from trtllm_dflash.cli.build import main as build_main

    hf, path, _ = target
    (tmp_path / "t").mkdir()
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "t" / "config.json").write_text(json.dumps({**config, "quantization_config": KIMI_INT4}))
    code = build_main(["--target", str(tmp_path / "t"), "--drafter", str(drafter), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert "quantization_config 'compressed-tensors' pack-quantized, int4 weights in groups of 32 is not read" in err[0]


def test_every_acceptance_length_stays_exact(target):
    """Drafts right up to a per-row, per-step offset (the oracle's own greedy continuation, then wrong): each step
    accepts exactly the drafts that continuation implies, rows accepting different lengths in one step."""
    hf, path, expected = target
    results = scripted_results(path, expected, PROMPTS, N)
    assert len({a for r in results for a in r.acceptance_lengths}) == ScriptedProposer.max_block_size


@pytest.mark.slow  # two rank processes
def test_tp2_engine_equals_transformers(target, drafter, tmp_path):
    """dflash-build --backend torch at TP 2 (q_b_proj / q_proj, kv_b_proj and o_proj split by head, the latent path
    and cache replicated), on two ranks: DFlash output equals transformers', the shards reassemble."""
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
    cfg = config_of(path)
    shards = [load_file(str(out / "target" / f"rank{r}.safetensors")) for r in range(2)]
    full = unshard_state(shards, cfg, cfg.vocab_size)
    checkpoint = target_tensors(cfg, load_file(str(path / "model.safetensors")))
    assert full.keys() == checkpoint.keys()
    for name, tensor in checkpoint.items():
        assert torch.equal(full[name], tensor), name


def test_trtllm_backend_refuses_in_one_line(target, drafter, tmp_path, capsys):
    from trtllm_dflash.cli.build import main as build_main

    _, path, _ = target
    capsys.readouterr()
    assert build_main(["--target", str(path), "--drafter", str(drafter), "--output", str(tmp_path / "e"),
                       "--backend", "trtllm"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "has no DFlash in TensorRT-LLM" in err[0], err
