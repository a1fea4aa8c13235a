"""What a `trtllm` build checks before writing anything, and what it writes for TensorRT-LLM to read: the token
budget, the field table of the chosen TensorRT-LLM release (recorded in the manifest), prefix reuse, the drafter's
dtype, and options that work from any working directory.

The rules are upstream's, cited where the code encodes them (builder/trtllm/options.py, tables.py, reuse.py,
drafter.py, engine.py); TensorRT-LLM itself cannot run here.
"""

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from packaging.version import Version
from safetensors.torch import load_file
from helpers.tiny_models import add_tokenizer, drafter_config, drafter_weights, make_hf_target, write_drafter
from trtllm_dflash.config.manifest import Manifest

from trtllm_dflash.builder.trtllm.fields import check_options
from trtllm_dflash.builder.trtllm.tables import TABLES
from trtllm_dflash.cli.build import main as build_main


def build(*args) -> int:
    return build_main([str(a) for a in args])


def options_of(engine) -> dict:
    return yaml.safe_load((engine / "llm_options.yaml").read_text())


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory):
    """A tiny Qwen3 target and a drafter for it, both stored float32."""
    root = tmp_path_factory.mktemp("pair")
    make_hf_target(root / "t", "qwen3", seed=7)
    return add_tokenizer(root / "t"), write_drafter(root / "d", drafter_config(), seed=8)


def build_one_line_error(capsys, *args) -> str:
    capsys.readouterr()
    assert build(*args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_token_budget_tensorrt_llm_refuses_is_refused_before_writing(qwen3_pair, tmp_path, capsys):
    """validate_dflash_ctx_buffer_budget: max_batch_size x (1 + max_draft_len) must not exceed max_num_tokens."""
    target, drafter = qwen3_pair
    args = ("--target", target, "--drafter", drafter, "--output", tmp_path / "e", "--backend", "trtllm")
    err = build_one_line_error(capsys, *args, "--max-batch-size", 1024, "--max-num-tokens", 4096)
    # the drafter's block size 8: max_draft_len 7; 1024 x 8 = 8192 > 4096; 4096 // 8 = 512 fits
    assert err.endswith("max_batch_size 1024 x (1 + max_draft_len 7) = 8192 tokens exceeds max_num_tokens 4096 "
                        "(TensorRT-LLM refuses this at start): raise --max-num-tokens to 8192, lower "
                        "--max-batch-size to 512, or lower --block-size"), err
    assert not (tmp_path / "e").exists() and list(tmp_path.iterdir()) == []
    assert build(*args, "--max-batch-size", 512, "--max-num-tokens", 4096) == 0  # exactly the budget
    # upstream's own escape hatch (1.4.0rc1 and newer): a warning, not a refusal
    skip = ("--llm-option", "speculative_config.skip_ctx_buffer_budget_check=true")
    assert build(*args[:5], tmp_path / "s", *args[6:], "--max-batch-size", 1024, "--max-num-tokens", 4096, *skip) == 0
    assert "skip_ctx_buffer_budget_check is set: upstream will not check" in capsys.readouterr().err
    err = build_one_line_error(capsys, *args[:5], tmp_path / "old", *args[6:], "--max-batch-size", 1024,
                               "--max-num-tokens", 4096, *skip, "--trtllm-version", "1.3.0rc27")
    assert "'speculative_config.skip_ctx_buffer_budget_check' is not a field of DFlashDecodingConfig" in err


def test_the_field_table_is_the_chosen_releases_and_the_manifest_records_it(qwen3_pair, tmp_path, capsys):
    target, drafter = qwen3_pair
    tail = ("--llm-option", "speculative_config.context_recompute_tail=16")
    args = ("--target", target, "--drafter", drafter, "--backend", "trtllm", *tail)
    assert build(*args, "--output", tmp_path / "new") == 0  # default: the newest known table
    assert options_of(tmp_path / "new")["speculative_config"]["context_recompute_tail"] == 16
    table = sorted((TABLES / p.name for p in TABLES.glob("*.json")), key=lambda p: Version(p.stem))[-1]
    record = Manifest.read(tmp_path / "new").backend_details["tensorrt_llm"]
    assert record["version"] == table.stem == "1.4.0rc4"
    assert record["table_sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    assert build(*args, "--output", tmp_path / "rc1", "--trtllm-version", "1.4.0rc1") == 0
    err = build_one_line_error(capsys, *args, "--output", tmp_path / "old", "--trtllm-version", "1.3.0rc27")
    assert ("'speculative_config.context_recompute_tail' is not a field of DFlashDecodingConfig (TensorRT-LLM "
            "1.3.0rc27 field table) (it is from TensorRT-LLM 1.4.0rc1") in err
    assert not (tmp_path / "old").exists()
    err = build_one_line_error(capsys, *args, "--output", tmp_path / "x", "--trtllm-version", "1.2.0")
    assert "--trtllm-version 1.2.0: TensorRT-LLM has DFlash from 1.3.0rc27" in err
    err = build_one_line_error(capsys, *args[:6], "--output", tmp_path / "x", "--moe-backend", "CUTEDSL_FC12",
                               "--trtllm-version", "1.4.0rc1")
    assert "unknown moe_backend 'CUTEDSL_FC12'" in err


def test_prefix_reuse_recomputes_the_drafters_tail_where_the_release_can(qwen3_pair, tmp_path, capsys):
    target, drafter = qwen3_pair
    args = ("--target", target, "--drafter", drafter, "--backend", "trtllm")
    for version in ("1.3.0rc27", "1.4.0rc4"):  # off by default, whatever the release
        assert build(*args, "--output", tmp_path / version, "--trtllm-version", version) == 0
        assert options_of(tmp_path / version)["kv_cache_config"]["enable_block_reuse"] is False
    assert build(*args, "--output", tmp_path / "reuse", "--prefix-reuse", 64) == 0
    options = options_of(tmp_path / "reuse")
    assert options["kv_cache_config"]["enable_block_reuse"] is True and options["enable_chunked_prefill"] is True
    assert options["speculative_config"]["context_recompute_tail"] == 64
    assert "context recomputed for the last 64" in Manifest.read(tmp_path / "reuse").backend_details["choices"][
        "prefix_reuse"]
    assert check_options(options) == []
    err = build_one_line_error(capsys, *args, "--output", tmp_path / "x", "--prefix-reuse", 64, "--trtllm-version",
                               "1.3.0rc27")
    assert "--prefix-reuse needs speculative_config.context_recompute_tail (TensorRT-LLM 1.4.0rc1 and newer)" in err
    err = build_one_line_error(capsys, *args, "--output", tmp_path / "x", "--prefix-reuse", 64, "--llm-option",
                               "kv_cache_config.enable_block_reuse=false")
    assert "'kv_cache_config.enable_block_reuse' is set by the build (--prefix-reuse)" in err
    assert build(*args, "--output", tmp_path / "by-hand", "--llm-option", "kv_cache_config.enable_block_reuse=true",
                 "--llm-option", "speculative_config.context_recompute_tail=64") == 0
    assert "context_recompute_tail without enable_chunked_prefill" in capsys.readouterr().err
    err = build_one_line_error(capsys, *args, "--output", tmp_path / "x", "--prefix-reuse", 0)
    assert "'prefix_reuse' must be a positive number of prompt tokens to recompute, got 0" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("dtype, torch_dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_every_drafter_tensor_has_the_build_dtype(qwen3_pair, tmp_path, dtype, torch_dtype):
    """The tiny drafter is stored float32; the engine's copy is the same values cast, and the memory plan sizes
    the arena in the dtype stored (TensorRT-LLM takes it from the fc weight)."""
    target, drafter = qwen3_pair
    out = tmp_path / "e"
    assert build("--target", target, "--drafter", drafter, "--output", out, "--backend", "trtllm", "--dtype", dtype,
                 "--gpu", "h100") == 0  # SM90: VANILLA, a private dense arena
    source = load_file(str(drafter / "model.safetensors"))
    written = load_file(str(out / "drafter" / "model.safetensors"))
    assert {t.dtype for t in source.values()} == {torch.float32} and written.keys() == source.keys()
    assert all(written[k].dtype == torch_dtype and torch.equal(written[k], source[k].to(torch_dtype)) for k in source)
    assert json.loads((out / "drafter" / "config.json").read_text())["torch_dtype"] == dtype
    cfg = drafter_config()  # slots x layers x (max_seq_len 512 + max_draft_len 7 + 1) x K,V x KV heads x head_dim
    arena = 65 * cfg["num_hidden_layers"] * 520 * 2 * 2 * 8 * written["fc.weight"].element_size()
    assert Manifest.read(out).backend_details["memory"]["arena"] == arena
    assert build_main(["verify", str(out)]) == 0


def test_a_quantized_drafter_is_refused(qwen3_pair, tmp_path, capsys):
    target, _ = qwen3_pair
    cfg = drafter_config()
    weights = drafter_weights(cfg, seed=3)
    weights["fc.weight"] = weights["fc.weight"].to(torch.float8_e4m3fn)
    drafter = write_drafter(tmp_path / "d", cfg, weights)
    err = build_one_line_error(capsys, "--target", target, "--drafter", drafter, "--output", tmp_path / "e",
                               "--backend", "trtllm")
    assert "drafter tensor 'fc.weight'" in err and "is F8_E4M3" in err and "unquantized drafter" in err
    assert not (tmp_path / "e").exists()


def test_options_for_any_working_directory(qwen3_pair, tmp_path, monkeypatch, capsys):
    """TensorRT-LLM resolves speculative_model against the working directory: the engine's file stays relative
    (it can move), `dflash-build options` writes absolute paths for where the engine is now."""
    target, drafter = qwen3_pair
    engine = tmp_path / "engines" / "e"
    assert build("--target", target, "--drafter", drafter, "--output", engine, "--backend", "trtllm") == 0
    assert options_of(engine)["speculative_config"]["speculative_model"] == "drafter"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert build_main(["options", "../engines/e", "--output", "opts.yaml"]) == 0
    written = yaml.safe_load((elsewhere / "opts.yaml").read_text())
    model = Path(written["speculative_config"]["speculative_model"])
    assert model.is_absolute() and model.resolve() == (engine / "drafter").resolve() and model.is_dir()
    assert {k: v for k, v in written.items() if k != "speculative_config"} == {
        k: v for k, v in options_of(engine).items() if k != "speculative_config"}
    assert build_main(["options", str(engine)]) == 0  # to standard output
    assert yaml.safe_load(capsys.readouterr().out) == written
    assert build_main(["verify", str(engine)]) == 0  # the engine itself is unchanged


def test_verify_rechecks_the_options_against_the_recorded_table(qwen3_pair, tmp_path, capsys):
    target, drafter = qwen3_pair
    engine = tmp_path / "e"
    assert build("--target", target, "--drafter", drafter, "--output", engine, "--backend", "trtllm",
                 "--llm-option", "speculative_config.context_recompute_tail=16") == 0
    manifest = json.loads((engine / "manifest.json").read_text())

    def verify_with(record) -> str:
        manifest["backend_details"]["tensorrt_llm"] = record
        (engine / "manifest.json").write_text(json.dumps(manifest))
        capsys.readouterr()
        build_main(["verify", str(engine)])
        return capsys.readouterr().out

    recorded = dict(manifest["backend_details"]["tensorrt_llm"])
    assert "options: llm_options.yaml matches the TensorRT-LLM 1.4.0rc4 field table" in verify_with(recorded)
    assert "the TensorRT-LLM 1.4.0rc4 field table changed since the build" in verify_with(
        {**recorded, "table_sha256": "0" * 64})
    out = verify_with({**recorded, "version": "1.3.0rc27"})  # an option that release lacks: the engine is broken
    assert "FAIL TensorRT-LLM option 'speculative_config.context_recompute_tail' is not a field" in out
    assert "engine BROKEN" in out
    assert "whose field table this tool does not have" in verify_with({**recorded, "version": "../../x"})


def test_verify_names_a_drafter_tensor_not_in_the_engine_dtype(qwen3_pair, tmp_path, capsys):
    from safetensors.torch import save_file

    target, drafter = qwen3_pair
    engine = tmp_path / "e"
    assert build("--target", target, "--drafter", drafter, "--output", engine, "--backend", "trtllm") == 0
    tensors = load_file(str(engine / "drafter" / "model.safetensors"))
    save_file({**tensors, "norm.weight": tensors["norm.weight"].float()}, str(engine / "drafter" / "model.safetensors"))
    capsys.readouterr()
    assert build_main(["verify", str(engine)]) == 1
    out = capsys.readouterr().out
    assert "drafter tensor 'norm.weight'" in out and "is float32, not the engine's dtype bfloat16" in out
