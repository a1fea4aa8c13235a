"""Every bad input gives one line naming the problem and the value, exit code 2, no traceback."""

import json
import shutil
import subprocess
import sys

import pytest
from safetensors.torch import load_file, save_file
from helpers.tiny_models import drafter_config, drafter_weights, write_drafter

from trtllm_dflash.cli.generate import main


def run_cli(capsys, *args):
    code = main(list(args))
    err = capsys.readouterr().err
    return code, err


def expect_error(capsys, needle, *args):
    code, err = run_cli(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dflash-generate: error: "), err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err


@pytest.fixture
def target_copy(hf_target, tmp_path):
    _, path = hf_target
    return shutil.copytree(path, tmp_path / "target")


def gen_args(target, drafter=None, *extra):
    args = ["--target", str(target), "--prompt-ids", "5,6,7", "--max-new-tokens", "4"]
    return args + (["--drafter", str(drafter)] if drafter else []) + list(extra)


def test_missing_safetensors(capsys, target_copy):
    (target_copy / "model.safetensors").unlink()
    expect_error(capsys, f"no safetensors weights in {target_copy}", *gen_args(target_copy))


def test_corrupt_safetensors(capsys, target_copy):
    (target_copy / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header at all")
    expect_error(capsys, f"corrupt safetensors file {target_copy / 'model.safetensors'}", *gen_args(target_copy))


def test_truncated_safetensors(capsys, target_copy):
    path = target_copy / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    expect_error(capsys, "corrupt safetensors file", *gen_args(target_copy))


def test_missing_shard(capsys, target_copy):
    (target_copy / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}))
    expect_error(capsys, "model-00002-of-00002.safetensors", *gen_args(target_copy))


def test_weight_shape_mismatch(capsys, target_copy):
    path = target_copy / "model.safetensors"
    weights = load_file(str(path))
    weights["model.layers.1.mlp.up_proj.weight"] = weights["model.layers.1.mlp.up_proj.weight"][:50]
    save_file(weights, str(path))
    expect_error(capsys, "weight shape mismatch for 'model.layers.1.mlp.up_proj.weight'", *gen_args(target_copy))


def test_unknown_architecture(capsys, target_copy):
    cfg = json.loads((target_copy / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "gpt2", ["GPT2LMHeadModel"]
    (target_copy / "config.json").write_text(json.dumps(cfg))
    expect_error(capsys, "unknown architecture model_type='gpt2'", *gen_args(target_copy))


def test_invalid_config_json(capsys, target_copy):
    (target_copy / "config.json").write_text("{not json")
    expect_error(capsys, "config.json is not valid JSON", *gen_args(target_copy))


def test_missing_model_directory(capsys, tmp_path):
    expect_error(capsys, f"no such model directory: {tmp_path / 'nope'}", *gen_args(tmp_path / "nope"))


def test_hub_id_unreachable(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    expect_error(capsys, "cannot get model 'nobody/no-such-model'", *gen_args("nobody/no-such-model"))


@pytest.mark.parametrize("change, needle", [
    (dict(hidden_size=48), "drafter hidden_size 48 != target hidden_size 32"),
    (dict(dflash_config={"mask_token_id": 95, "target_layer_ids": [1, 4]}),
     "drafter target_layer_ids [1, 4] out of range for a target with 4 layers"),
    (dict(dflash_config={"mask_token_id": 96, "target_layer_ids": [1, 2]}),
     "drafter mask_token_id 96 outside the target vocabulary (vocab_size 96)"),
    (dict(num_target_layers=36), "drafter was trained for num_target_layers 36, target has num_hidden_layers 4"),
])
def test_mismatched_pair(capsys, hf_target, tmp_path, change, needle):
    _, target = hf_target
    cfg = drafter_config(**change)
    drafter = write_drafter(tmp_path / "drafter", cfg, drafter_weights(cfg))
    expect_error(capsys, needle, *gen_args(target, drafter))


def test_target_given_as_drafter(capsys, hf_target):
    _, target = hf_target
    expect_error(capsys, "unknown architecture", *gen_args(target, target))


def test_block_size_above_trained(capsys, hf_target, random_drafter):
    _, target = hf_target
    expect_error(capsys, "block size 9 exceeds the drafter's trained block_size 8",
                 *gen_args(target, random_drafter, "--block-size", "9"))


def test_empty_prompt(capsys, hf_target):
    _, target = hf_target
    expect_error(capsys, "empty prompt", "--target", str(target), "--prompt-ids", "", "--max-new-tokens", "3")


def test_prompt_ids_outside_vocabulary(capsys, hf_target):
    _, target = hf_target
    expect_error(capsys, "prompt token id 96 outside the vocabulary (vocab_size 96)",
                 "--target", str(target), "--prompt-ids", "3,96", "--max-new-tokens", "3")


def test_prompt_ids_not_integers(capsys, hf_target):
    _, target = hf_target
    expect_error(capsys, "--prompt-ids must be comma-separated integers, got '3,x'",
                 "--target", str(target), "--prompt-ids", "3,x", "--max-new-tokens", "3")


def test_text_prompt_without_tokenizer(capsys, hf_target):
    _, target = hf_target
    expect_error(capsys, "has no tokenizer: use --prompt-ids",
                 "--target", str(target), "--prompt", "hi", "--max-new-tokens", "3")


def test_too_long_for_the_target(capsys, hf_target):
    _, target = hf_target
    expect_error(capsys, "exceeds the target's max_position_embeddings 512",
                 "--target", str(target), "--prompt-ids", "3", "--max-new-tokens", "600")


def test_too_long_with_a_drafter_names_the_prompt_and_the_request(capsys, hf_target, random_drafter):
    """Checked before anything is allocated for the request."""
    _, target = hf_target
    expect_error(capsys, "prompt length 600 + max_new_tokens 4 = 604 exceeds the target's max_position_embeddings 512",
                 "--target", str(target), "--drafter", str(random_drafter), "--prompt-ids", ",".join(["3"] * 600),
                 "--max-new-tokens", "4")


@pytest.mark.parametrize("value", ["-5", "-1", "0"])
def test_max_new_tokens_below_one_is_refused_before_loading(capsys, tmp_path, value):
    expect_error(capsys, f"--max-new-tokens must be at least 1, got {value}", "--target", str(tmp_path / "missing"),
                 "--drafter", str(tmp_path / "missing"), "--prompt-ids", "3", "--max-new-tokens", value)


def test_cuda_requested_without_gpu(capsys, hf_target):
    _, target = hf_target
    expect_error(capsys, "no CUDA GPU is available", *gen_args(target, None, "--device", "cuda"))


def test_subprocess_exit_code_and_single_line(hf_target, tmp_path):
    _, target = hf_target
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", *gen_args(tmp_path / "missing")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"dflash-generate: error: no such model directory: {tmp_path / 'missing'}"
