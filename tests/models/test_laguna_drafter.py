"""Laguna's DFlash drafter against TensorRT-LLM's reading of it (NVIDIA/TensorRT-LLM@009d8fa4,
`tensorrt_llm/_torch/models/modeling_dflash.py` DFlashLagunaForCausalLM), op by op, the formulas written here:
- context features: cat_i(rms(h_i) * aux_i) @ fc.T, then rms * hidden_norm (`project_target_hidden`); each layer's
  K/V from rms(fused) * input_layernorm (`_build_fused_kv_buffers` folds that norm's weight into W_kv), K through
  k_norm and RoPE (rotate-half, theta from the config);
- the gate: o_proj((attn.unflatten(H, D) * softplus(g_proj(x)).unsqueeze(-1)).flatten()) (`_post_attention_gate`);
- masks: sliding layers causal with (window - 1, 0), full layers not (`_get_attention_mask_args`);
- selection by "Laguna" in the architectures (`_build_dflash_draft`), per-head gating only, fused qkv_proj split by
  the head counts (`load_weights`).
The end-to-end greedy check over a Laguna target is in test_sigmoid_routed_targets.py (its target fixture).
"""

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_models import laguna_drafter_config, laguna_drafter_weights, write_drafter, write_laguna_drafter
from safetensors.torch import load_file
from trtllm_dflash.checkpoint.loader import load_drafter
from trtllm_dflash.models.registry import parse_drafter_config, parse_target_config
from trtllm_dflash.utils.errors import DFlashError

EPS = 1e-6


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(k: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """k: [B, N, H, D]; NeoX rotate-half, as TensorRT-LLM's RotaryEmbedding with is_neox."""
    d = k.shape[-1]
    freqs = positions[..., None].float() / theta ** (torch.arange(0, d, 2).float() / d)
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, :, None], torch.cat([freqs, freqs], -1).sin()[:, :, None]
    half = torch.cat([-k[..., d // 2:], k[..., : d // 2]], -1)
    return k * cos + half * sin


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    path = write_laguna_drafter(tmp_path_factory.mktemp("laguna-drafter") / "d", seed=4)
    config = json.loads((path / "config.json").read_text())
    return load_drafter(path), load_file(str(path / "model.safetensors")), config


def test_context_kv_is_upstreams(drafter):
    loaded, w, cfg = drafter
    h, d, kv_heads = cfg["hidden_size"], cfg["head_dim"], cfg["num_key_value_heads"]
    q_rows, kv_rows = cfg["num_attention_heads"] * d, kv_heads * d
    torch.manual_seed(0)
    features = torch.randn(2, 5, 2 * h) * 3
    positions = torch.arange(5).expand(2, -1) + torch.tensor([[0], [7]])
    chunks = features.chunk(2, -1)
    normed = torch.cat([rms(c, w[f"aux_hidden_norms.{i}.weight"]) for i, c in enumerate(chunks)], -1)
    fused = rms(normed @ w["fc.weight"].T, w["hidden_norm.weight"])
    got = loaded.model.context_kv(features, positions)
    for layer, (k, v) in enumerate(got):
        p = f"layers.{layer}."
        qkv = w.get(p + "self_attn.qkv_proj.weight")
        if qkv is None:
            qkv = torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        x = rms(fused, w[p + "input_layernorm.weight"])
        k_want = (x @ qkv[q_rows:q_rows + kv_rows].T).view(2, 5, kv_heads, d)
        k_want = rope(rms(k_want, w[p + "self_attn.k_norm.weight"]), positions, cfg["rope_theta"])
        v_want = (x @ qkv[q_rows + kv_rows:].T).view(2, 5, kv_heads, d)
        torch.testing.assert_close(k, k_want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v_want, atol=1e-5, rtol=1e-5)


def test_gate_is_upstreams(drafter):
    loaded, w, cfg = drafter
    heads, d, h = cfg["num_attention_heads"], cfg["head_dim"], cfg["hidden_size"]
    attn = loaded.model.layers[1].self_attn
    torch.manual_seed(1)
    x, out = torch.randn(2, 4, h), torch.randn(2, 4, heads, d)
    ctx = SimpleNamespace(rope=loaded.model.rotary(torch.zeros(2, 4, dtype=torch.long), x.dtype),
                          attend=lambda *args: out)
    flat = out.flatten(2)
    gate = F.softplus(x @ w["layers.1.self_attn.g_proj.weight"].T)
    want = (flat.unflatten(-1, (heads, d)) * gate.unsqueeze(-1)).flatten(-2) @ w["layers.1.self_attn.o_proj.weight"].T
    torch.testing.assert_close(attn(x, 1, ctx), want, atol=1e-5, rtol=1e-5)


def test_sliding_layers_are_causal_full_layers_not(drafter):
    loaded, _, cfg = drafter
    sliding, full = (layer.self_attn.spec for layer in loaded.model.layers)
    assert (sliding.causal, sliding.window) == (True, cfg["sliding_window"])
    assert (full.causal, full.window) == (False, None)


def test_fused_and_split_qkv_load_alike(drafter, tmp_path):
    loaded, _, cfg = drafter
    split = write_drafter(tmp_path / "split", cfg, laguna_drafter_weights(cfg, seed=4, fused_qkv=False))
    a, b = loaded.model.state_dict(), load_drafter(split).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_missing_aux_norm_names_the_weight(tmp_path):
    cfg = laguna_drafter_config()
    weights = laguna_drafter_weights(cfg)
    del weights["aux_hidden_norms.1.weight"]
    with pytest.raises(DFlashError, match=r"weight 'aux_hidden_norms.1.weight' missing"):
        load_drafter(write_drafter(tmp_path / "d", cfg, weights))


def test_chosen_by_architecture():
    assert parse_drafter_config(laguna_drafter_config(), "d").laguna_drafter
    assert not parse_drafter_config(laguna_drafter_config(architectures=["DFlashDraftModel"]), "d").laguna_drafter
    with pytest.raises(DFlashError, match="this is a DFlash drafter"):
        parse_target_config(laguna_drafter_config(), "d")


@pytest.mark.parametrize("change, message", [
    ({"gating": "per-element"}, "unsupported gating 'per-element' for a Laguna drafter"),
    ({"num_attention_heads_per_layer": [4, 8]}, "'num_attention_heads_per_layer' must be one head count"),
    ({"num_experts": 4, "mlp_layer_types": ["dense", "sparse"]}, "a Laguna drafter with experts"),
    ({"is_causal": True}, "unsupported is_causal True for a Laguna drafter"),
])
def test_bad_laguna_fields_name_the_field(change, message):
    with pytest.raises(DFlashError, match=message):
        parse_drafter_config(laguna_drafter_config(**change), "d/config.json")
