"""dflash-build for MoE targets: expert sharding, Model Optimizer quantization keeping routers exact."""

import json

import pytest
import torch
from safetensors import safe_open
from helpers.tiny_models import add_tokenizer, make_hf_target, write_drafter
from trtllm_dflash.checkpoint.hf import load_tensors
from trtllm_dflash.checkpoint.layout import target_tensors
from trtllm_dflash.checkpoint.sharding import shard_state, unshard_state
from trtllm_dflash.config.model import read_config_json
from trtllm_dflash.models.registry import parse_target_config

from trtllm_dflash.builder.trtllm.quantize import check_routers_excluded
from trtllm_dflash.cli.build import main as build_main
from trtllm_dflash.utils.errors import DFlashError


@pytest.fixture(scope="module")
def moe_pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-pairs")
    made = {}
    for kind in ("gpt_oss", "qwen3_moe"):
        make_hf_target(root / kind, kind, seed=21)
        add_tokenizer(root / kind)
        made[kind] = root / kind
    return made, write_drafter(root / "drafter", seed=22)


@pytest.mark.parametrize("kind", ["gpt_oss", "qwen3_moe"])
def test_expert_shards_reassemble(moe_pairs, kind):
    targets, _ = moe_pairs
    cfg = parse_target_config(read_config_json(targets[kind]), kind)
    state = target_tensors(cfg, load_tensors(targets[kind]))
    shards = [shard_state(state, cfg, r, 2) for r in range(2)]
    w13 = "model.layers.0.mlp.experts.w13"
    assert shards[0][w13].shape[-1] == state[w13].shape[-1] // 2
    # rank 0 holds the first half of gate's columns and of up's, side by side
    i = cfg.moe.intermediate_size
    torch.testing.assert_close(shards[0][w13], torch.cat([state[w13][..., : i // 2], state[w13][..., i: i + i // 2]], -1))
    full = unshard_state(shards, cfg, cfg.vocab_size)
    assert set(full) == set(state) and all(torch.equal(full[k], state[k]) for k in state)


@pytest.mark.parametrize("kind, quant, algo", [("qwen3_moe", "fp8", "FP8"), ("gpt_oss", "nvfp4", "NVFP4")])
def test_quantized_moe_target_keeps_routers_unquantized(moe_pairs, tmp_path, kind, quant, algo):
    targets, drafter = moe_pairs
    out = tmp_path / "e"
    assert build_main(["--target", str(targets[kind]), "--drafter", str(drafter), "--output", str(out),
                       "--backend", "trtllm", "--quant", quant]) == 0
    quant_config = json.loads((out / "target" / "hf_quant_config.json").read_text())["quantization"]
    router = "mlp.router" if kind == "gpt_oss" else "mlp.gate"
    assert quant_config["quant_algo"] == algo
    assert {f"model.layers.{i}.{router}" for i in range(4)} <= set(quant_config["exclude_modules"])
    with safe_open(str(out / "target" / "model.safetensors"), "pt") as f:
        assert f.get_tensor(f"model.layers.0.{router}.weight").dtype == torch.bfloat16
        experts = "model.layers.0.mlp.experts.gate_up_proj" if kind == "gpt_oss" else "model.layers.0.mlp.experts.0.up_proj.weight"
        assert f.get_tensor(experts).dtype in (torch.float8_e4m3fn, torch.uint8)


def test_a_quantized_router_is_refused():
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].mlp = torch.nn.Module()
    model.layers[0].mlp.gate = torch.nn.Linear(4, 2)
    model.layers[0].mlp.gate_proj = torch.nn.Linear(4, 2)  # a dense MLP's projection, not a router
    check_routers_excluded(model, {"exclude_modules": ["lm_head", "layers.*.mlp.gate"]})
    with pytest.raises(DFlashError, match=r"quantized the MoE router 'layers.0.mlp.gate' \(1 routers in all"):
        check_routers_excluded(model, {"exclude_modules": ["lm_head"]})


def test_tp_must_divide_the_expert_size():
    from trtllm_dflash.distributed.parallel import check_divisible_experts

    check_divisible_experts(32, 0, 4)
    with pytest.raises(DFlashError, match="tensor-parallel size 4 does not divide the target's moe intermediate size 30"):
        check_divisible_experts(30, 0, 4)
