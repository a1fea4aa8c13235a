"""The published DFlash checkpoint format, config parsing and RoPE variants."""

import json

import pytest
import torch

from tiny_models import drafter_config, drafter_weights, write_drafter
from trtllm_dflash.config import DrafterConfig, RopeConfig, TargetConfig, default_target_layer_ids
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.loading import load_drafter
from trtllm_dflash.models.layers import rope_inv_freq

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
    cfg = DrafterConfig.from_dict(PUBLISHED_QWEN3_8B, "published")
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33) and cfg.mask_token_id == 151669
    assert cfg.block_size == 16 and cfg.num_target_layers == 36 and cfg.rope.theta == 1e6
    assert cfg.layer_types == ("full_attention",) * 5 and cfg.sliding_window is None


def test_default_target_layer_ids():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 1) == [18]
    no_ids = dict(PUBLISHED_QWEN3_8B, dflash_config={"mask_token_id": 151669})
    assert DrafterConfig.from_dict(no_ids, "x").target_layer_ids == (1, 9, 17, 25, 33)


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
    (dict(layer_types=["sliding_attention", "full_attention"]), "sliding_window is None"),
    (dict(num_attention_heads=3), "num_attention_heads 3 is not a multiple of num_key_value_heads 2"),
    (dict(hidden_act="gelu"), "unsupported hidden_act 'gelu'"),
])
def test_bad_drafter_configs(change, needle):
    cfg = drafter_config()
    cfg.update(change)
    if cfg.get("dflash_config") is None:
        cfg["dflash_config"] = None
    with pytest.raises(DFlashError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        DrafterConfig.from_dict(cfg, "drafter/config.json")


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


def test_unsupported_rope_type_is_named():
    with pytest.raises(DFlashError, match="unsupported rope_type 'yarn'"):
        RopeConfig.from_dict({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "cfg")


def test_target_config_rejects_a_drafter_and_sliding_targets():
    with pytest.raises(DFlashError, match="this is a DFlash drafter"):
        TargetConfig.from_dict(PUBLISHED_QWEN3_8B, "t")
    qwen = json.loads(json.dumps(PUBLISHED_QWEN3_8B))
    qwen.update(architectures=["Qwen3ForCausalLM"], use_sliding_window=True)
    with pytest.raises(DFlashError, match="sliding-window targets are not supported"):
        TargetConfig.from_dict(qwen, "t")
