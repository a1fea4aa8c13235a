"""`trtllm` engines: what TensorRT-LLM's DFlash reads is written explicitly (facts from NVIDIA/TensorRT-LLM@58ae162a)."""

import hashlib
import json

import pytest

from tiny_models import add_tokenizer, drafter_config, drafter_weights, make_hf_target, write_drafter
from trtllm_dflash.cli.build import main as build_main


def build(*args) -> int:
    return build_main([str(a) for a in args])


@pytest.fixture(scope="module")
def target8(tmp_path_factory):
    """A tiny Qwen3 target with 8 layers (so reference layer ids differ from one another)."""
    path = tmp_path_factory.mktemp("t8") / "target"
    make_hf_target(path, "qwen3", seed=5, num_hidden_layers=8)
    return add_tokenizer(path)


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("layout", ["top_level_ids", "num_target_layers_only"])
def test_engine_drafter_config_states_layer_ids_and_mask(target8, tmp_path, layout):
    cfg = drafter_config(target_layers=8)
    weights = drafter_weights(cfg, seed=3)
    ids = cfg["dflash_config"].pop("target_layer_ids")
    mask = cfg["dflash_config"].pop("mask_token_id")
    cfg["mask_token_id"] = mask  # top level: this project reads it, TensorRT-LLM reads it only as a fallback
    if layout == "top_level_ids":
        cfg["target_layer_ids"] = ids
    drafter = write_drafter(tmp_path / "d", cfg, weights)
    before = sha(drafter / "config.json")
    assert build("--target", target8, "--drafter", drafter, "--output", tmp_path / "e", "--backend", "trtllm",
                 "--max-seq-len", 256) == 0
    written = json.loads((tmp_path / "e" / "drafter" / "config.json").read_text())
    # reference default for an 8-layer target and a 2-layer drafter: round(1 + i * (8 - 4) / (2 - 1)) -> [1, 5]
    assert written["dflash_config"] == {"target_layer_ids": [1, 5], "mask_token_id": mask, "block_size": 8}
    assert sha(drafter / "config.json") == before  # the user's file is untouched
