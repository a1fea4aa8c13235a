"""The published DFlash checkpoint format, config parsing and RoPE variants."""

import json
import re

import pytest
import torch
from helpers.tiny_models import drafter_config, drafter_weights, write_drafter
from trtllm_dflash.checkpoint.loader import load_drafter
from trtllm_dflash.config.model import RopeConfig, default_target_layer_ids

from trtllm_dflash.models.layers import rope_inv_freq
from trtllm_dflash.models.registry import parse_drafter_config, parse_target_config
from trtllm_dflash.utils.errors import DFlashError

# The published Qwen3-8B drafter's config.json (z-lab), as documented in shared/reference/dflash.md.
PUBLISHED_QWEN3_8B = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 151936, "block_size": 16,
    "num_target_layers": 36, "max_position_embeddings": 40960, "hidden_act": "silu",
    "layer_types": ["full_attention"] * 5, "sliding_window": None,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
}


def test_published_drafter_config_parses():
    cfg = parse_drafter_config(PUBLISHED_QWEN3_8B, "published")
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33) and cfg.mask_token_id == 151669
    assert cfg.block_size == 16 and cfg.num_target_layers == 36 and cfg.rope.theta == 1e6
    assert cfg.layer_types == ("full_attention",) * 5 and cfg.sliding_window is None


def test_default_target_layer_ids():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 1) == [18]
    no_ids = dict(PUBLISHED_QWEN3_8B, dflash_config={"mask_token_id": 151669})
    assert parse_drafter_config(no_ids, "x").target_layer_ids == (1, 9, 17, 25, 33)


def test_published_weight_names_load_exactly(tmp_path):
    cfg = drafter_config()
    weights = drafter_weights(cfg)
    assert not any(name.startswith("model.") for name in weights)
    drafter = load_drafter(write_drafter(tmp_path / "d", cfg, weights)).model
    assert set(drafter.state_dict()) == set(weights)
    for name, value in drafter.state_dict().items():
        assert torch.equal(value, weights[name])


def test_prefixed_weight_names_are_rejected_clearly(tmp_path):
    cfg = drafter_config()
    weights = {"model." + k: v for k, v in drafter_weights(cfg).items()}
    with pytest.raises(DFlashError, match="weight 'fc.weight' missing from"):
        load_drafter(write_drafter(tmp_path / "d", cfg, weights))


@pytest.mark.parametrize("change, needle", [
    (dict(dflash_config=None), "field 'dflash_config' must be an object"),
    (dict(dflash_config={"target_layer_ids": [1]}), "missing required field 'mask_token_id'"),
    (dict(block_size="16"), "field 'block_size' must be int, got '16'"),
    (dict(layer_types=["full_attention"]), "field 'layer_types' must list 2"),
    (dict(layer_types=["sliding_attention", "full_attention"]), "has sliding_attention but no sliding_window "
                                                                "(use_sliding_window is false)"),
    (dict(architectures=["DSparkDraftModel"]), "unsupported drafter architecture ['DSparkDraftModel']"),
    (dict(dflash_config={"mask_token_id": 1, "target_layer_ids": [1], "use_swa": True}),
     "unsupported dflash_config field 'use_swa'=True"),
    (dict(add_swa_attention_sink_bias=True), "unsupported drafter field 'add_swa_attention_sink_bias'=True"),
    (dict(target_hidden_size=64), "unsupported target_hidden_size 64 != hidden_size 32"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "partial_rotary_factor": 0.5}),
     "unsupported partial_rotary_factor 0.5"),
    (dict(num_attention_heads=3), "num_attention_heads 3 is not a multiple of num_key_value_heads 2"),
    (dict(hidden_act="gelu"), "unsupported hidden_act 'gelu'"),
])
def test_bad_drafter_configs(change, needle):
    cfg = drafter_config()
    cfg.update(change)
    if cfg.get("dflash_config") is None:
        cfg["dflash_config"] = None
    with pytest.raises(DFlashError, match=re.escape(needle)):
        parse_drafter_config(cfg, "drafter/config.json")


LLAMA31_ROPE = {"rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}}


def test_rope_keys_old_and_new_spellings_agree():
    old = RopeConfig.from_dict(LLAMA31_ROPE, "old")
    new = RopeConfig.from_dict({"rope_parameters": {**LLAMA31_ROPE["rope_scaling"], "rope_theta": 500000.0}}, "new")
    assert old == new and old.rope_type == "llama3" and old.factor == 8.0


@pytest.mark.parametrize("rope", [LLAMA31_ROPE, {"rope_theta": 1e6},
                                  {"rope_theta": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}])
def test_rope_inverse_frequencies_match_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=rope["rope_theta"],
                         rope_scaling=rope.get("rope_scaling"))
    kind = (rope.get("rope_scaling") or {}).get("rope_type", "default")
    if kind == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        expected = LlamaRotaryEmbedding(hf_cfg).inv_freq
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[kind](hf_cfg, "cpu")
    ours = rope_inv_freq(RopeConfig.from_dict(rope, "x"), 128)
    torch.testing.assert_close(ours, expected.float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("params", [
    {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
     "original_max_position_embeddings": 4096, "rope_theta": 150000.0},  # gpt-oss
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6},  # Qwen3 long
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "rope_theta": 1e4,
     "mscale": 0.707, "mscale_all_dim": 0.707},
])
def test_yarn_matches_transformers(params):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    from trtllm_dflash.models.layers import Rotary

    hf_cfg = Qwen3Config(hidden_size=512, num_attention_heads=8, head_dim=64, max_position_embeddings=131072,
                         rope_parameters=dict(params))
    pos = torch.tensor([[0, 1, 7, 100, 4095, 4096, 50000]])
    ref_cos, ref_sin = Qwen3RotaryEmbedding(hf_cfg)(torch.zeros(1, dtype=torch.float32), pos)
    rope = RopeConfig.from_dict({"rope_parameters": params, "max_position_embeddings": 131072}, "x")
    cos, signed_sin = Rotary(rope, 64)(pos, torch.float32)  # [B, T, 1, D]; sin carries rotate_half's sign
    sin = torch.cat((-signed_sin[..., :32], signed_sin[..., 32:]), dim=-1)
    torch.testing.assert_close(cos[:, :, 0], ref_cos, rtol=0, atol=2e-5)
    torch.testing.assert_close(sin[:, :, 0], ref_sin, rtol=0, atol=2e-5)


def test_unsupported_rope_type_is_named():
    with pytest.raises(DFlashError, match="unsupported rope_type 'longrope'"):
        RopeConfig.from_dict({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "cfg")


def test_target_config_rejects_a_drafter():
    with pytest.raises(DFlashError, match="this is a DFlash drafter"):
        parse_target_config(PUBLISHED_QWEN3_8B, "t")


def test_sliding_window_layouts_follow_transformers():
    from transformers import AutoConfig

    qwen = {k: v for k, v in PUBLISHED_QWEN3_8B.items() if k not in ("layer_types", "sliding_window", "dflash_config")}
    qwen.update(architectures=["Qwen3ForCausalLM"], num_hidden_layers=6, use_sliding_window=True, sliding_window=64,
                max_window_layers=4)
    cases = [("qwen3", qwen), ("qwen3", {**qwen, "use_sliding_window": False}),
             ("qwen3_moe", {**qwen, "moe_intermediate_size": 8, "num_experts": 4, "num_experts_per_tok": 2}),
             ("gpt_oss", {**qwen, "num_local_experts": 4, "num_experts_per_tok": 2})]
    for model_type, data in cases:
        data = {**data, "model_type": model_type}
        ours = parse_target_config(data, model_type)
        hf = AutoConfig.for_model(**data)
        types = getattr(hf, "layer_types", None) or ["sliding_attention" if hf.sliding_window else "full_attention"] * 6
        window = hf.sliding_window if "sliding_attention" in types else None
        assert (ours.layer_types, ours.sliding_window) == (tuple(types), window), model_type


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe", "llama", "gpt_oss"])
@pytest.mark.parametrize("fields", [{}, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4,
                                        "use_sliding_window": True},
                                    {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}])
def test_drafter_layouts_follow_the_config_class_of_their_model_type(model_type, fields):
    """The reference drafter's layers read `config.layer_types` / `config.sliding_window` as the config
    class of the config's model_type leaves them (AutoConfig); so does this runtime."""
    from transformers import AutoConfig

    data = {**drafter_config(), "model_type": model_type, **fields}
    try:
        ours = parse_drafter_config(data, "d")
    except DFlashError as exc:
        assert "no sliding_window" in str(exc)  # sliding layers whose window the config class dropped
        return
    hf = AutoConfig.for_model(**{k: v for k, v in data.items() if k not in ("architectures", "dflash_config")})
    types = tuple(getattr(hf, "layer_types", None) or ["full_attention"] * 2)
    window = getattr(hf, "sliding_window", None) if "sliding_attention" in types else None
    assert (ours.layer_types, ours.sliding_window) == (types, window)


PUBLISHED_GPT_OSS_20B_DRAFTER = {  # z-lab/gpt-oss-20b-DFlash config.json as quoted by its users (2026-04)
    "architectures": ["DFlashDraftModel"], "attention_bias": True, "attention_dropout": 0.0, "block_size": 8,
    "bos_token_id": 199998, "dflash_config": {"mask_token_id": 200000, "target_layer_ids": [1, 6, 11, 16, 21]},
    "dtype": "bfloat16", "eos_token_id": 200002, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 7680,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_hidden_layers": 8,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 150000, "vocab_size": 201088,
}


def test_gpt_oss_drafter_takes_the_gpt_oss_config_defaults():
    """AutoConfig (what the reference, vLLM and SGLang load it with) makes a gpt_oss config alternate
    sliding (128) and full layers and use YaRN; the drafter must be built the same way."""
    from transformers import AutoConfig

    cfg = parse_drafter_config(PUBLISHED_GPT_OSS_20B_DRAFTER, "d")
    hf = AutoConfig.for_model(**PUBLISHED_GPT_OSS_20B_DRAFTER)
    assert cfg.layer_types == tuple(hf.layer_types) and cfg.sliding_window == hf.sliding_window == 128
    assert cfg.rope.rope_type == "yarn" and cfg.rope.factor == 32.0 and cfg.rope.truncate is False
    assert cfg.rope.theta == 150000.0 and cfg.attention_bias and cfg.block_size == 8
