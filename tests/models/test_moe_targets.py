"""gpt-oss and Qwen3-MoE targets (experts, sinks, sliding windows, YaRN, MXFP4) against transformers.

Tiny random transformers models whose sliding windows (6 and 7 tokens) are shorter than every
test sequence; greedy output is compared token for token with transformers' own greedy `generate`.
"""

import json

import pytest
import torch
from helpers.host_traffic import host_traffic_of_steps
from helpers.oracle import ReferenceDrafter, reference_dflash_greedy
from safetensors.torch import load_file, save_file
from helpers.tiny_models import VOCAB, add_tokenizer, drafter_config, hf_generate, make_hf_target, write_drafter
from trtllm_dflash.checkpoint.loader import load_target
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.models.attention import ForwardContext

PROMPTS = [list(range(3, 21)), [7, 50, 2, 9], list(range(60, 85))]
N = 48
# verify blocks: shorter (gpt-oss, window 6) and longer (Qwen3-MoE, window 7) than the window
BLOCK = {"gpt_oss": 3, "qwen3_moe": 8}
ATOL = 2e-5


@pytest.fixture(scope="module", params=["gpt_oss", "qwen3_moe"])
def moe_target(request, tmp_path_factory):
    """(transformers model, its directory, its greedy continuations of PROMPTS)."""
    path = tmp_path_factory.mktemp("moe") / request.param
    hf = make_hf_target(path, request.param, seed=3)
    add_tokenizer(path)
    return hf, path, [hf_generate(hf, p, N) for p in PROMPTS]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return write_drafter(tmp_path_factory.mktemp("moe-drafter") / "d", seed=8)


def test_plain_greedy_equals_transformers(moe_target):
    hf, path, expected = moe_target
    gen = load_pipeline(path).generator
    results = gen.generate([Request(tuple(p), N, ignore_eos=True) for p in PROMPTS])  # ragged batch
    assert [r.output_ids for r in results] == expected
    assert len({tuple(e) for e in expected}) == len(PROMPTS) and all(len(set(e)) > 8 for e in expected)


def test_dflash_greedy_equals_transformers(moe_target, drafter):
    hf, path, expected = moe_target
    block = BLOCK[hf.config.model_type]
    gen = load_pipeline(path, drafter).generator
    results = gen.generate([Request(tuple(p), N, ignore_eos=True) for p in PROMPTS], block)
    assert [r.output_ids for r in results] == expected
    alone = gen.generate([Request(tuple(PROMPTS[2]), N, ignore_eos=True)], block)[0]
    assert alone.output_ids == expected[2]


def test_logits_and_hidden_states_after_rollback(moe_target):
    """Ragged prefill, verify a block that is mostly rejected, continue from the accepted prefix: every
    logit and captured layer equals a full transformers pass (the rings overwrote rejected K/V)."""
    hf, path, _ = moe_target
    target = load_target(path).model
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, VOCAB, (2, 30), generator=g)
    cache = target.new_cache(2, 40, 8)
    lengths = torch.tensor([12, 9])  # row 1 is right-padded past its 9 prompt tokens
    junk = torch.randint(0, VOCAB, (2, 8), generator=g)
    starts = lengths + torch.tensor([2, 0])  # rows keep 2 and 0 tokens of the junk block
    cont = torch.stack([seq[0, 14:22], seq[1, 9:17]])
    layers = tuple(range(target.config.num_hidden_layers))
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
        torch.testing.assert_close(target.logits(hidden[row:row + 1]), ref.logits[:, -8:], atol=ATOL, rtol=0)
        expected = torch.cat([ref.hidden_states[i + 1][:, -8:] for i in layers], dim=-1)
        torch.testing.assert_close(feats[row:row + 1], expected, atol=ATOL, rtol=0)


def test_sliding_layers_keep_only_the_window(moe_target):
    hf, path, _ = moe_target
    target = load_target(path).model
    cfg = target.config
    cache = target.new_cache(2, 1000, 16)
    sliding = sum(w is not None for w in map(cfg.window, range(cfg.num_hidden_layers)))
    rings = [layer for layer in cache.layers if layer.kind == "window"]
    assert sliding and len(rings) == sliding and cache.k.shape[0] == cfg.num_hidden_layers - sliding
    assert all(ring.k.shape[2] == cfg.sliding_window + 16 - 1 + 1 for ring in rings)  # window + block - 1, a spare
    # full layers: a pool of blocks for both rows' positions 0..capacity (the last a spare), and a null block
    from trtllm_dflash.cache.kv_cache import BLOCK, blocks_for

    assert cache.capacity == 1000 and cache.k.shape[1:3] == (2 * blocks_for(1000 + 1) + 1, BLOCK)


def test_gpt_oss_style_drafter_matches_the_reference(moe_target, tmp_path):
    """A drafter configured as the published gpt-oss ones (model_type gpt_oss: YaRN, biases, alternating
    causal sliding-window and full layers from GptOssConfig's defaults) against the reference drafter."""
    hf, path, _ = moe_target
    if hf.config.model_type != "gpt_oss":
        pytest.skip("one target family is enough for the drafter's own math")
    cfg = drafter_config(layers=2, model_type="gpt_oss", attention_bias=True, sliding_window=4,
                         rope_theta=10000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 64})
    from helpers.tiny_models import drafter_weights

    weights = drafter_weights(cfg, seed=9)
    for i in range(2):
        for proj, rows in (("q", 32), ("k", 16), ("v", 16), ("o", 32)):
            weights[f"layers.{i}.self_attn.{proj}_proj.bias"] = 0.1 * torch.randn(rows)
    d = write_drafter(tmp_path / "d", cfg, weights)
    prompt = PROMPTS[0]
    ref_out, ref_lengths, ref_drafts = reference_dflash_greedy(hf, ReferenceDrafter(cfg, load_file(str(d / "model.safetensors"))),
                                                              prompt, 24, 8)
    pipe = load_pipeline(path, d)
    assert pipe.drafter.config.layer_types == ("sliding_attention", "full_attention")
    drafts = []
    propose = pipe.generator.proposer.propose
    pipe.generator.proposer.propose = lambda *a: drafts.append(propose(*a)) or drafts[-1]
    result = pipe.generator.generate([Request(tuple(prompt), 24, ignore_eos=True)], 8)[0]
    assert [d_[0][0].tolist() for d_ in drafts] == ref_drafts
    assert result.output_ids == ref_out and result.acceptance_lengths == ref_lengths


def test_mxfp4_checkpoint_matches_transformers(tmp_path):
    """gpt-oss experts shipped as MXFP4 blocks/scales: dequantised at load exactly as transformers does."""
    from transformers import AutoModelForCausalLM

    make_hf_target(tmp_path / "bf16", "gpt_oss", seed=5)
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    tensors = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    g = torch.Generator().manual_seed(6)
    for name in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, rows, cols = tensors.pop(name).transpose(1, 2).shape  # nn.Linear-shaped [E, out, in]
        tensors[name + "_blocks"] = torch.randint(0, 256, (e, rows, cols // 32, 16), dtype=torch.uint8, generator=g)
        tensors[name + "_scales"] = torch.randint(122, 127, (e, rows, cols // 32), dtype=torch.uint8, generator=g)
    # dequantize: transformers' own MXFP4 -> bf16 conversion, the oracle (its kernels path needs a GPU)
    config["quantization_config"] = {"quant_method": "mxfp4", "dequantize": True, "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    out = tmp_path / "mxfp4"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(out / "model.safetensors"))
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()  # dequantises on a CPU
    target = load_target(out).model
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        ref = hf(ids).logits
    n = ids.shape[1]
    with torch.no_grad():
        hidden, _ = target(ids, ForwardContext.prefill(torch.arange(n)[None], target.new_cache(1, 32), torch.tensor([0]),
                                                       torch.tensor([n])))
    torch.testing.assert_close(target.logits(hidden), ref, atol=1e-4, rtol=0)


def test_tp2_engine_equals_transformers(moe_target, drafter, tmp_path):
    """Experts split inside each expert over two ranks (gloo on loopback) give transformers' tokens:
    gpt-oss (expert biases, sinks, sliding windows all sharded) and Qwen3-MoE (norm_topk_prob routing). The first
    request ends early, so on each rank the last one moves into its slot with its shard of every cache."""
    from trtllm_dflash.engine.loader import generate_with_engine

    from trtllm_dflash.cli.build import main as build_main

    hf, path, expected = moe_target
    lengths = (6, N, N)
    requests = [Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)]
    out = tmp_path / "tp2"
    assert build_main(["--target", str(path), "--drafter", str(drafter), "--output", str(out), "--tp", "2",
                       "--dtype", "float32"]) == 0
    results = generate_with_engine(out, requests)
    assert [r.output_ids for r in results] == [e[:n] for e, n in zip(expected, lengths)]


def test_requests_that_change_slot_keep_their_window_rings(moe_target, drafter):
    """The first request finishes early and the last moves into its slot (target K/V, sliding-window rings and
    the drafter's context go along); greedy output stays transformers'."""
    hf, path, expected = moe_target
    gen = load_pipeline(path, drafter).generator
    lengths = [6, N, N]
    moved = []
    move = gen.caches.move
    gen.caches.move = lambda seq, dst: (moved.append((seq.slot, dst)), move(seq, dst))
    results = gen.generate([Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)],
                           BLOCK[hf.config.model_type])
    assert moved[0] == (2, 0)  # (and a later one, when the moved request ends before the one in slot 1)
    assert [r.output_ids for r in results] == [e[:n] for e, n in zip(expected, lengths)]


def test_a_decode_step_reads_the_device_once(moe_target, drafter, monkeypatch):
    """Expert routing, sinks and window rings included: drafting and plain steps, and a move into a free slot,
    build no tensor from host data and read the device once per step (tests/helpers/host_traffic.py)."""
    hf, path, _ = moe_target
    gen = load_pipeline(path, drafter).generator
    gen.allocate(3, 100, BLOCK[hf.config.model_type])
    gen.admit([Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, (2, 40, 40))])
    calls = host_traffic_of_steps(gen, (2, 0, 2, 0), monkeypatch)
    assert calls == ["tolist"] * 4 and sorted(gen.slots.running) == [0, 1]  # the last request moved to slot 0
