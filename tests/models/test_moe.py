"""The MoE block and the published expert layouts against transformers' own MoE blocks (float32)."""

import json

import pytest
import torch
from helpers.tiny_models import make_hf_target
from trtllm_dflash.checkpoint.hf import load_tensors
from trtllm_dflash.checkpoint.layout import target_tensors
from trtllm_dflash.config.model import TargetConfig, read_config_json
from trtllm_dflash.config.moe import MoeConfig

from trtllm_dflash.models import moe as moe_module
from trtllm_dflash.models.moe import MoE
from trtllm_dflash.models.registry import parse_target_config
from trtllm_dflash.utils.errors import DFlashError

ATOL = 1e-5


def our_block(cfg: MoeConfig, hidden: int, tensors: dict, prefix: str) -> MoE:
    block = MoE(cfg, hidden)
    state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    block.load_state_dict(state, strict=True)
    return block.eval()


def block_pair(tmp_path, kind: str, layer: int = 0, **overrides):
    hf = make_hf_target(tmp_path / kind, kind, seed=4, **overrides)
    cfg = parse_target_config(read_config_json(tmp_path / kind), kind)
    tensors = target_tensors(cfg, load_tensors(tmp_path / kind))
    return hf.model.layers[layer].mlp, our_block(cfg.moe, cfg.hidden_size, tensors, f"model.layers.{layer}.mlp.")


def hf_out(block, x):
    out = block(x)
    return out[0] if isinstance(out, tuple) else out  # GptOssMLP also returns the router scores


@pytest.mark.parametrize("kind, overrides", [
    ("gpt_oss", {}),
    ("qwen3_moe", {}),
    ("qwen3_moe", {"norm_topk_prob": False, "num_experts_per_tok": 3}),
])
def test_block_matches_transformers(tmp_path, kind, overrides):
    ref, ours = block_pair(tmp_path, kind, **overrides)
    x = torch.randn(3, 17, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf_out(ref, x), atol=ATOL, rtol=0)


def test_clamp_is_active_and_matches(tmp_path):
    """Large inputs drive gate/up past swiglu_limit, so the clamped branch is what is compared."""
    ref, ours = block_pair(tmp_path, "gpt_oss", swiglu_limit=0.5)
    x = 4 * torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(1))
    h = x.reshape(-1, 32) @ ours.experts.w13[0]
    assert (h.abs() > 0.5).float().mean() > 0.3  # the clamp changes many values
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf_out(ref, x), atol=1e-4, rtol=0)


def test_grouped_gemm_and_per_expert_loop_agree(tmp_path, monkeypatch):
    _, ours = block_pair(tmp_path, "qwen3_moe")
    x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        fast = ours(x)
        monkeypatch.setattr(moe_module, "grouped_mm_ok", lambda rows, weight: False)
        slow = ours(x)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=0)


def test_shared_expert_matches_qwen2_moe(tmp_path):
    """The shared expert with its sigmoid gate (the Qwen2-MoE / Qwen3.5-MoE block) against transformers."""
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    hf_cfg = Qwen2MoeConfig(hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                            num_experts=6, num_experts_per_tok=2, norm_topk_prob=False)
    torch.manual_seed(5)
    ref = Qwen2MoeSparseMoeBlock(hf_cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)
    state = ref.state_dict()  # fused experts as transformers holds them; the gate is `gate.weight`
    tensors = target_tensors(TargetConfig(**_dense_fields(), model_type="qwen3_moe", moe=MoeConfig(6, 2, 16)),
                             {f"m.mlp.{k}": v for k, v in state.items()})
    cfg = MoeConfig(num_experts=6, top_k=2, intermediate_size=16, shared_expert_intermediate_size=24,
                    shared_expert_gate=True)
    ours = our_block(cfg, 32, tensors, "m.mlp.")
    x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


def _dense_fields():
    from trtllm_dflash.config.model import RopeConfig

    return dict(vocab_size=8, hidden_size=32, intermediate_size=8, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=4, head_dim=8, rms_norm_eps=1e-6, rope=RopeConfig(), max_position_embeddings=64,
                layer_types=("full_attention",))


def test_sparse_step_and_mlp_only_layers(tmp_path):
    make_hf_target(tmp_path / "q", "qwen3_moe", decoder_sparse_step=2, mlp_only_layers=[3])
    cfg = parse_target_config(read_config_json(tmp_path / "q"), "q")
    assert cfg.moe.layers == (1,)  # layers 1 and 3 are sparse by step; 3 is listed dense
    names = set(target_tensors(cfg, load_tensors(tmp_path / "q")))
    assert "model.layers.1.mlp.experts.w13" in names and "model.layers.3.mlp.gate_proj.weight" in names


def test_missing_expert_is_one_clear_line(tmp_path):
    make_hf_target(tmp_path / "q", "qwen3_moe")
    cfg = parse_target_config(read_config_json(tmp_path / "q"), "q")
    tensors = load_tensors(tmp_path / "q")
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
    with pytest.raises(DFlashError, match=r"weight 'model.layers.2.mlp.experts.5.up_proj.weight' missing"):
        target_tensors(cfg, tensors)


@pytest.mark.parametrize("change, needle", [
    ({"num_experts_per_tok": 9}, "'num_experts_per_tok' 9 exceeds the number of experts 8"),
    ({"num_experts": 0, "num_local_experts": 0}, "field 'num_experts' must be a positive int, got 0"),
    ({"mlp_only_layers": [7]}, "field 'mlp_only_layers' must list layer ids in 0..3"),
])
def test_bad_moe_configs(tmp_path, change, needle):
    make_hf_target(tmp_path / "q", "qwen3_moe")
    data = {**json.loads((tmp_path / "q" / "config.json").read_text()), **change}
    with pytest.raises(DFlashError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        parse_target_config(data, "q")


def test_pre_quantized_checkpoints_other_than_mxfp4_are_refused(tmp_path):
    make_hf_target(tmp_path / "q", "qwen3_moe")
    data = json.loads((tmp_path / "q" / "config.json").read_text())
    cfg = parse_target_config({**data, "quantization_config": {"quant_method": "fp8"}}, "q")
    with pytest.raises(DFlashError, match="quantized with 'fp8' \\(serve it with --backend trtllm\\)"):
        target_tensors(cfg, load_tensors(tmp_path / "q"), tmp_path / "q")
    with pytest.raises(DFlashError, match="field 'quantization_config' must be an object"):
        parse_target_config({**data, "quantization_config": "fp8"}, "q")
