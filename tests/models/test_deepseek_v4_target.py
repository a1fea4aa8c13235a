"""DeepSeek-V4 targets against transformers 5.24.

A tiny random transformers DeepseekV4ForCausalLM (tiny_models.DEEPSEEK_V4): an HCA layer (an entry every 4 tokens),
two CSA layers (every 2 tokens, overlapping windows, an indexer keeping 2 entries) and a sliding-only one, all with a
6-token window; hash-routed experts in layer 0, score-routed in the others; two hyper-connection streams. Every test
sequence is longer than the window, than the compression blocks and than the indexer's top-k entries. Greedy output
is compared token for token with transformers' own greedy `generate`.
"""

import json
import re

import pytest
import torch
from helpers.host_traffic import host_traffic_of_steps
from safetensors.torch import load_file, save_file
from helpers.scripted import ScriptedProposer, scripted_results
from helpers.tiny_models import (
    DEEPSEEK_V4,
    VOCAB,
    add_tokenizer,
    drafter_config,
    hf_generate,
    make_hf_deepseek_v4,
    write_drafter,
)
from trtllm_dflash.checkpoint.loader import load_target
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.compilation.step_mode import StepMode, StepShapes
from trtllm_dflash.models.attention import ForwardContext
from trtllm_dflash.models.registry import parse_target_config
from trtllm_dflash.utils.errors import DFlashError

PROMPTS = [list(range(3, 21)), [7, 50, 2, 9], list(range(60, 85))]
N = 40
BLOCK = 8
ATOL, RTOL = 2e-5, 1e-5
HCA, CSA, SLIDING = "heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention"


@pytest.fixture(scope="module")
def dsv4(tmp_path_factory):
    """(transformers model, its directory, its greedy continuations of PROMPTS)."""
    path = tmp_path_factory.mktemp("dsv4") / "t"
    hf = make_hf_deepseek_v4(path, seed=0)
    add_tokenizer(path)
    return hf, path, [hf_generate(hf, p, N) for p in PROMPTS]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    cfg = drafter_config(target_layers=4)
    cfg["dflash_config"]["target_layer_ids"] = [1, 3]
    return write_drafter(tmp_path_factory.mktemp("dsv4-drafter") / "d", cfg, seed=8)


def test_config_reads_what_transformers_builds(dsv4):
    hf, path, expected = dsv4
    cfg = parse_target_config(json.loads((path / "config.json").read_text()), "c")
    ds = cfg.deepseek_v4
    assert ds.layer_types == tuple(hf.config.layer_types) == (HCA, CSA, SLIDING, CSA)
    assert ds.mlp_types == ("hash_moe", "moe", "moe", "moe") and ds.compress_rates == {CSA: 2, HCA: 4}
    assert (cfg.sliding_window, cfg.head_dim, ds.rope_dim, cfg.moe.num_experts, cfg.moe.top_k) == (6, 16, 8, 4, 2)
    assert len({tuple(e) for e in expected}) == len(PROMPTS) and all(len(set(e)) > 8 for e in expected)


@pytest.mark.parametrize("fields", [
    {},  # every default: 43 layers (2 HCA, then CSA / HCA alternating), 3 hash layers
    {"compress_ratios": [0, 4, 128, 4], "num_hash_layers": 1, "qk_rope_head_dim": 32, "num_hidden_layers": 4},
    {"num_hidden_layers": 2, "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096,
                                              "beta_fast": 32, "beta_slow": 1}},
], ids=["defaults", "legacy-keys", "yarn"])
def test_config_fields_left_to_transformers_defaults(fields):
    """Layer kinds, MLP kinds and both RoPEs' inverse frequencies and scaling as transformers' config and rotary
    embedding compute them."""
    from transformers import AutoConfig
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    from trtllm_dflash.models.deepseek_v4.layers import HalfRotary

    theirs = AutoConfig.for_model("deepseek_v4", **fields)
    ours = parse_target_config({"model_type": "deepseek_v4", **fields}, "c")
    ds = ours.deepseek_v4
    assert ds.layer_types == tuple(theirs.layer_types) and ds.mlp_types == tuple(theirs.mlp_layer_types)
    assert ds.rope_dim == theirs.qk_rope_head_dim and ours.sliding_window == theirs.sliding_window
    rotary = DeepseekV4RotaryEmbedding(theirs)
    for kind, rope in (("main", ds.main_rope), ("compress", ds.compress_rope)):
        mine = HalfRotary(rope, ds.rope_dim)
        torch.testing.assert_close(mine.inv_freq, getattr(rotary, f"{kind}_inv_freq"), atol=0, rtol=0)
        assert mine.scaling == getattr(rotary, f"{kind}_attention_scaling")


@pytest.mark.parametrize("change, message", [
    ({"scoring_func": "softmax"}, "unsupported scoring_func 'softmax'"),
    ({"layer_types": [SLIDING, "full_attention", SLIDING, SLIDING]}, "field 'layer_types' must list 4 of"),
    ({"num_key_value_heads": 2}, "num_key_value_heads 2 (DeepSeek-V4 attention has one K=V head)"),
    ({"o_groups": 3}, "num_attention_heads 4 is not a multiple of o_groups 3"),
    ({"quantization_config": {"quant_method": "fp8", "expert_dtype": "fp4"}},
     "quantization_config.expert_dtype 'fp4' is not read (FP8 block-scaled and unquantized experts are)"),
])
def test_bad_configs_name_the_field(change, message):
    with pytest.raises(DFlashError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_target_config({"model_type": "deepseek_v4", **DEEPSEEK_V4, **change}, "c")


def stream_means(hf, seq: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """transformers' logits of seq [1, T] and each decoder layer's output averaged over its streams."""
    outs = []
    hooks = [layer.register_forward_hook(lambda m, a, out: outs.append(out.mean(dim=2))) for layer in hf.model.layers]
    try:
        with torch.no_grad():
            logits = hf(seq).logits
    finally:
        for h in hooks:
            h.remove()
    return logits, outs


def test_logits_and_features_after_rollback(dsv4):
    """Ragged prefill, a verify block that is mostly rejected, then the accepted prefix continued: logits and every
    layer's stream mean equal a full transformers pass (window rings overwritten, compressed entries pooled again)."""
    hf, path, _ = dsv4
    target = load_target(path).model
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(3, VOCAB, (2, 30), generator=g)
    cache = target.new_cache(2, 40, 8)
    lengths = torch.tensor([12, 9])
    junk = torch.randint(3, VOCAB, (2, 8), generator=g)
    starts = lengths + torch.tensor([3, 0])  # rows keep 3 and 0 tokens of the junk block
    cont = torch.stack([seq[0, 15:23], seq[1, 9:17]])
    positions = starts[:, None] + torch.arange(8)
    with torch.no_grad():
        target(seq[:, :12], ForwardContext.prefill(torch.arange(12).expand(2, -1), cache, torch.arange(2), lengths))
        target(junk, ForwardContext.cached(lengths[:, None] + torch.arange(8), cache, int(lengths.max()) + 8))
        hidden, feats = target(cont, ForwardContext.cached(positions, cache, int(positions.max()) + 1,
                                                           capture_layer_ids=(0, 1, 2, 3)))
    fulls = [torch.cat([seq[0, :12], junk[0, :3], cont[0]]), torch.cat([seq[1, :9], cont[1]])]
    for row, full in enumerate(fulls):
        logits, means = stream_means(hf, full[None])
        torch.testing.assert_close(target.logits(hidden[row:row + 1]), logits[:, -8:], atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(feats[row:row + 1], torch.cat([m[:, -8:] for m in means], dim=-1), atol=ATOL,
                                   rtol=RTOL)


def test_plain_greedy_equals_transformers(dsv4):
    hf, path, expected = dsv4
    results = load_pipeline(path).generator.generate([Request(tuple(p), N, ignore_eos=True) for p in PROMPTS])
    assert [r.output_ids for r in results] == expected


def test_dflash_greedy_equals_transformers(dsv4, drafter):
    """A ragged batch whose first request ends early (the last moves into its slot), and one request alone."""
    hf, path, expected = dsv4
    gen = load_pipeline(path, drafter).generator
    lengths = (6, N, N)
    results = gen.generate([Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)], BLOCK)
    assert [r.output_ids for r in results] == [e[:n] for e, n in zip(expected, lengths)]
    assert gen.generate([Request(tuple(PROMPTS[2]), N, ignore_eos=True)], BLOCK)[0].output_ids == expected[2]


def test_padded_steps_equal_transformers(dsv4, drafter):
    """CUDA-graph steps' padding, run eagerly: rows, verify width and key span padded to buckets (padding rows are
    free slots, padding drafts never accepted, entries past a row's queries never visible)."""
    hf, path, expected = dsv4
    gen = load_pipeline(path, drafter).generator
    gen.set_step_mode(StepMode("eager", StepShapes(min_span=16, min_rows=2, min_width=2)))
    results = gen.generate([Request(tuple(p), N, ignore_eos=True) for p in PROMPTS], BLOCK)
    assert [r.output_ids for r in results] == expected


def test_a_decode_step_reads_the_device_once(dsv4, drafter, monkeypatch):
    """Compressed entries, the indexer's top-k and hash routing included: drafting and plain steps, and a move into
    a free slot, build no tensor from host data and read the device once per step."""
    _, path, _ = dsv4
    gen = load_pipeline(path, drafter).generator
    gen.allocate(3, 100, BLOCK)
    gen.admit([Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, (2, 40, 40))])
    calls = host_traffic_of_steps(gen, (2, 0, 2, 0), monkeypatch)
    assert calls == ["tolist"] * 4 and sorted(gen.slots.running) == [0, 1]


def test_every_acceptance_length_stays_exact(dsv4):
    """Drafts right up to a per-row, per-step offset: rows accept different lengths in one step."""
    hf, path, expected = dsv4
    results = scripted_results(path, expected, PROMPTS, N)
    assert len({a for r in results for a in r.acceptance_lengths}) == ScriptedProposer.max_block_size


def quantize(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [O, I] -> float8_e4m3fn weight and the fp32 scale of each block x block tile (its max / 448)."""
    o, i = w.shape
    rows, cols = -(-o // block), -(-i // block)
    scale = torch.zeros(rows, cols)
    q = torch.empty(o, i, dtype=torch.float8_e4m3fn)
    for r in range(rows):
        for c in range(cols):
            tile = w[r * block:(r + 1) * block, c * block:(c + 1) * block]
            scale[r, c] = tile.abs().max().clamp(min=1e-12) / 448.0
            q[r * block:(r + 1) * block, c * block:(c + 1) * block] = (tile / scale[r, c]).to(torch.float8_e4m3fn)
    return q, scale


def test_fp8_block_scaled_checkpoint_loads_dequantized(dsv4, tmp_path):
    """As DeepSeek publishes: every projection float8_e4m3fn with `weight_scale_inv` per 4 x 4 block (partial blocks
    at the edges), the rest unquantized, an MTP layer beside the model (`mtp.*`, and a layer past num_hidden_layers):
    the model loads each weight as fp8 x its block's scale, ignoring the MTP weights, and its logits equal
    transformers' on that dequantized checkpoint."""
    import transformers as tf

    hf, path, _ = dsv4
    tensors = load_file(str(path / "model.safetensors"))
    fp8, plain = {}, {}
    for name, t in tensors.items():
        if name.endswith(".weight") and t.dim() == 2 and "embed" not in name and not name.startswith("head"):
            q, s = quantize(t, 4)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            plain[name] = q.float() * s.repeat_interleave(4, 0)[:t.shape[0]].repeat_interleave(4, 1)[:, :t.shape[1]]
        else:
            fp8[name] = plain[name] = t
    mtp = {"mtp.0.attn.wq_a.weight": torch.zeros(12, 32), "model.layers.4.attn.wq_a.weight": torch.zeros(12, 32)}
    config = json.loads((path / "config.json").read_text())
    for d, weights, extra in (("fp8", {**fp8, **mtp}, {"quantization_config": {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [4, 4]}}),
                              ("plain", plain, {})):
        (tmp_path / d).mkdir()
        save_file(weights, str(tmp_path / d / "model.safetensors"))
        (tmp_path / d / "config.json").write_text(json.dumps({**config, **extra}))
    ours = load_target(tmp_path / "fp8").model
    theirs = tf.DeepseekV4ForCausalLM.from_pretrained(tmp_path / "plain", attn_implementation="eager").eval()
    seq = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        hidden, _ = ours(seq, ForwardContext.prefill(torch.arange(seq.shape[1])[None], ours.new_cache(1, 32),
                                                     torch.arange(1), torch.tensor([seq.shape[1]])))
        torch.testing.assert_close(ours.logits(hidden), theirs(seq).logits, atol=ATOL, rtol=RTOL)
    assert not torch.equal(plain["model.layers.0.attn.wq_a.weight"], tensors["model.layers.0.attn.wq_a.weight"])


def test_fp8_scales_of_the_wrong_shape_name_the_weight(dsv4, tmp_path):
    _, path, _ = dsv4
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.0.attn.wq_a.weight"
    tensors[name], tensors[name + "_scale_inv"] = quantize(tensors[name], 4)[0], torch.ones(3, 8)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    message = f"FP8 scales of '{name}' have shape [3, 8], a 12x32 weight in 128x128 blocks needs [1, 1]"
    with pytest.raises(DFlashError, match=re.escape(message)):
        load_target(tmp_path)


def test_torch_engine_equals_transformers(dsv4, drafter, tmp_path):
    """dflash-build --backend torch, verified, then DFlash generation from the engine equals transformers."""
    from trtllm_dflash.engine.loader import generate_with_engine

    from trtllm_dflash.cli.build import main as build_main

    hf, path, expected = dsv4
    out = tmp_path / "engine"
    assert build_main(["--target", str(path), "--drafter", str(drafter), "--output", str(out),
                       "--dtype", "float32"]) == 0
    assert build_main(["verify", str(out)]) == 0
    results = generate_with_engine(out, [Request(tuple(p), N, ignore_eos=True) for p in PROMPTS])
    assert [r.output_ids for r in results] == expected


def test_tp2_engine_equals_transformers(dsv4, drafter, tmp_path):
    """dflash-build --backend torch at TP=2 (experts and the shared expert split, attention with its compressors
    and indexer replicated, as transformers' tp plan has it), generated on two ranks (gloo on loopback): DFlash output
    equals transformers', and the rank shards reassemble to the checkpoint as loaded."""
    from trtllm_dflash.checkpoint.layout import target_tensors
    from trtllm_dflash.checkpoint.sharding import unshard_state
    from trtllm_dflash.engine.loader import generate_with_engine

    from trtllm_dflash.cli.build import main as build_main

    hf, path, expected = dsv4
    out = tmp_path / "tp2"
    assert build_main(["--target", str(path), "--drafter", str(drafter), "--output", str(out), "--tp", "2",
                       "--dtype", "float32"]) == 0
    assert build_main(["verify", str(out)]) == 0
    lengths = (6, N, N)
    results = generate_with_engine(out, [Request(tuple(p), n, ignore_eos=True) for p, n in zip(PROMPTS, lengths)])
    assert [r.output_ids for r in results] == [e[:n] for e, n in zip(expected, lengths)]
    cfg = parse_target_config(json.loads((path / "config.json").read_text()), "c")
    shards = [load_file(str(out / "target" / f"rank{r}.safetensors")) for r in range(2)]
    assert shards[0]["model.layers.1.mlp.experts.w2"].shape == (4, 8, 32)  # half of each expert's 16
    assert shards[0]["model.layers.1.self_attn.compressor.gate_proj.weight"].shape == (32, 32)  # replicated
    full = unshard_state(shards, cfg, cfg.vocab_size)
    checkpoint = target_tensors(cfg, load_file(str(path / "model.safetensors")))
    assert full.keys() == checkpoint.keys()
    for name, tensor in checkpoint.items():
        assert torch.equal(full[name], tensor), name


@pytest.mark.parametrize("args, message", [
    (["--backend", "trtllm"], "DeepseekV4ForCausalLM (deepseek_v4) has no DFlash in TensorRT-LLM "
                              "(supported-models.md@00b6d5a2"),
], ids=["trtllm"])
def test_builds_refused_in_one_line(dsv4, drafter, tmp_path, capsys, args, message):
    from trtllm_dflash.cli.build import main as build_main

    _, path, _ = dsv4
    capsys.readouterr()
    assert build_main(["--target", str(path), "--drafter", str(drafter), "--output", str(tmp_path / "e"), *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "e").exists()
