"""`trtllm` engines: what TensorRT-LLM's DFlash reads, the seeds' target families, the options, a moved engine.

Facts checked here come from NVIDIA/TensorRT-LLM's sources and API reference (cited where the code encodes them).
TensorRT-LLM itself cannot run here: the engines are checked against its field table and rules, not served by it.
The memory plan: test_trtllm_memory.py; the token budget, releases, prefix reuse, drafter dtype:
test_trtllm_build_checks.py.
"""

import hashlib
import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import save_file
from helpers.tiny_models import VOCAB, add_tokenizer, drafter_config, drafter_weights, make_hf_target, write_drafter
from trtllm_dflash.config.manifest import Manifest

from trtllm_dflash.builder.trtllm.fields import check_options
from trtllm_dflash.cli.build import main as build_main

TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=False)
HYBRID = dict(layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
              linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0}


def build(*args) -> int:
    return build_main([str(a) for a in args])


def options_of(engine) -> dict:
    return yaml.safe_load((engine / "llm_options.yaml").read_text())


def save_causal(path, config):
    """A random model of `config` saved by transformers, plus a tokenizer."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return add_tokenizer(path)


def save_multimodal(path, config, text_config):
    """A published multimodal layout (config with text_config, language model under model.language_model.*).
    The weights are the text model's: the vision tower is left out to keep the test fast, and a trtllm build
    copies target weights without reading them."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    state = AutoModelForCausalLM.from_config(text_config).state_dict()
    path.mkdir(parents=True)
    save_file({k.replace("model.", "model.language_model.", 1): v.contiguous() for k, v in state.items()},
              str(path / "model.safetensors"))
    data = config.to_dict()
    data["architectures"] = [type(config).__name__.replace("Config", "ForConditionalGeneration")]
    (path / "config.json").write_text(json.dumps(data))
    return add_tokenizer(path)


def family_target(root, family):
    from transformers import (
        GptOssConfig,
        LlamaConfig,
        Qwen3_5Config,
        Qwen3_5MoeConfig,
        Qwen3_5MoeTextConfig,
        Qwen3_5TextConfig,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    path = root / family
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    if family == "gpt_oss":
        return save_causal(path, GptOssConfig(**{**TEXT, "intermediate_size": 32}, num_local_experts=4,
                                              num_experts_per_tok=2, sliding_window=16,
                                              rope_parameters={**YARN, "beta_fast": 32.0, "beta_slow": 1.0}))
    if family == "qwen3_moe":
        return save_causal(path, Qwen3MoeConfig(**TEXT, **moe))
    if family in ("qwen3_yarn", "llama_yarn"):
        cls = Qwen3Config if family == "qwen3_yarn" else LlamaConfig
        return save_causal(path, cls(**TEXT, rope_parameters=YARN))
    if family == "qwen3_5_text":
        return save_causal(path, Qwen3_5TextConfig(**TEXT, **HYBRID))
    text = Qwen3_5TextConfig(**TEXT, **HYBRID) if family == "qwen3_5" else Qwen3_5MoeTextConfig(**TEXT, **HYBRID, **moe)
    cls = Qwen3_5Config if family == "qwen3_5" else Qwen3_5MoeConfig
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4)
    return save_multimodal(path, cls(text_config=text.to_dict(), vision_config=vision), text)


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return write_drafter(tmp_path_factory.mktemp("drafter") / "d", drafter_config(), seed=3)


# model_type, architecture TensorRT-LLM names, KV-cache layers, MoE, upstream DFlash status
FAMILIES = [("gpt_oss", "gpt_oss", "GptOssForCausalLM", 4, True, "supported"),
            ("qwen3_5_text", "qwen3_5_text", "Qwen3_5ForCausalLM", 1, False, "tested"),
            ("qwen3_5", "qwen3_5", "Qwen3_5ForConditionalGeneration", 1, False, "tested"),
            ("qwen3_5_moe", "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", 1, True, "tested"),
            ("qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM", 4, True, "untested"),
            ("qwen3_yarn", "qwen3", "Qwen3ForCausalLM", 4, False, "tested"),
            ("llama_yarn", "llama", "LlamaForCausalLM", 4, False, "tested")]


@pytest.mark.parametrize("family, model_type, architecture, kv_layers, moe, status", FAMILIES)
def test_every_accepted_family_builds(tmp_path, capsys, drafter, family, model_type, architecture, kv_layers, moe,
                                      status):
    from trtllm_dflash.builder.trtllm.targets import TrtllmTarget

    target = family_target(tmp_path, family)
    parsed = TrtllmTarget.from_dict(json.loads((target / "config.json").read_text()), "t")
    assert (parsed.model_type, parsed.architecture, parsed.kv_layers, parsed.moe, parsed.status) == (
        model_type, architecture, kv_layers, moe, status)
    out = tmp_path / "engine"
    capsys.readouterr()
    assert build("--target", target, "--drafter", drafter, "--output", out, "--backend", "trtllm",
                 "--gpu", "b200") == 0
    stderr = capsys.readouterr().err
    options = options_of(out)
    assert check_options(options) == []
    assert ("moe_config" in options) == moe
    if family == "gpt_oss":  # TensorRT-LLM's GPT-OSS guide: TRTLLM MoE backend on Blackwell
        assert options["moe_config"] == {"backend": "TRTLLM"}
    assert options["speculative_config"]["attention_backend"] == "TRTLLM"  # SM100
    assert options["kv_cache_config"]["enable_block_reuse"] is False
    engine_drafter = json.loads((out / "drafter" / "config.json").read_text())["dflash_config"]
    assert engine_drafter["target_layer_ids"] == options["speculative_config"]["target_layer_ids"] == [1, 1]
    assert ("upstream has not tested DFlash" in stderr) == (status == "untested")
    assert Manifest.read(out).target["num_hidden_layers"] == 4  # text_config read for multimodal layouts
    assert build_main(["verify", str(out)]) == 0


def test_hybrid_kv_layers_without_layer_types():
    """Configs without `layer_types` follow transformers' rule: every `full_attention_interval`-th layer (default
    4) is full attention, the rest Gated DeltaNet with no KV cache."""
    from trtllm_dflash.builder.trtllm.targets import TrtllmTarget

    text = {**TEXT, "model_type": "qwen3_5_text", "num_hidden_layers": 8}
    assert TrtllmTarget.from_dict(text, "t").kv_layers == 2
    assert TrtllmTarget.from_dict({**text, "full_attention_interval": 2}, "t").kv_layers == 4
    assert TrtllmTarget.from_dict({**text, "model_type": "qwen3"}, "t").kv_layers == 8


@pytest.mark.parametrize("model_type, needle", [
    ("qwen3_next", "Qwen3NextForCausalLM (qwen3_next) has no DFlash in TensorRT-LLM"),
    ("mamba", "model_type 'mamba' is not a TensorRT-LLM DFlash target this tool knows"),
])
def test_refused_targets(tmp_path, capsys, drafter, model_type, needle):
    make_hf_target(tmp_path / "t", "qwen3")  # then relabelled
    add_tokenizer(tmp_path / "t")
    cfg = json.loads((tmp_path / "t" / "config.json").read_text())
    (tmp_path / "t" / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
    capsys.readouterr()
    assert build("--target", tmp_path / "t", "--drafter", drafter, "--output", tmp_path / "e", "--backend",
                 "trtllm") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and needle in err[0], err


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
    assert options_of(tmp_path / "e")["speculative_config"]["target_layer_ids"] == [1, 5]
    assert sha(drafter / "config.json") == before  # the user's file is untouched


@pytest.fixture(scope="module")
def qwen3_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    make_hf_target(root / "t", "qwen3", seed=7)
    return add_tokenizer(root / "t"), write_drafter(root / "d", drafter_config(), seed=8)


def test_pass_through_options_land_and_owned_keys_are_refused(qwen3_pair, tmp_path, capsys):
    target, drafter = qwen3_pair
    cfg = tmp_path / "build.yaml"
    cfg.write_text(yaml.safe_dump({"llm_options": {"kv_cache_config": {"host_cache_size": 1024},
                                                   "stream_interval": 4}}))
    assert build("--config", cfg, "--target", target, "--drafter", drafter, "--output", tmp_path / "e",
                 "--backend", "trtllm", "--llm-option", "scheduler_config.capacity_scheduler_policy=MAX_UTILIZATION",
                 "--llm-option", "stream_interval=8") == 0
    options = options_of(tmp_path / "e")
    assert options["kv_cache_config"]["host_cache_size"] == 1024 and options["stream_interval"] == 8  # flag wins
    assert options["kv_cache_config"]["enable_block_reuse"] is False  # the build's keys beside the user's
    assert options["scheduler_config"] == {"capacity_scheduler_policy": "MAX_UTILIZATION"}
    for option, needle in [("kv_cache_config.enable_block_resue=true",
                            "did you mean 'kv_cache_config.enable_block_reuse'"),
                           ("max_batch_size=8", "'max_batch_size' is set by the build (--max-batch-size)"),
                           ("speculative_config.attention_backend=FA4", "(--dflash-attention-backend)"),
                           ("stream_interval=0", "'stream_interval' must be PositiveInt, got 0"),
                           ("cuda_graph_config.max_batch_size=128",
                            "cuda_graph_config goes up to batch 128, above max_batch_size 64"),
                           ("novalue", "--llm-option must be KEY[.SUB...]=VALUE")]:
        capsys.readouterr()
        assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "x", "--backend", "trtllm",
                     "--llm-option", option) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and needle in err[0], err
        assert not (tmp_path / "x").exists()


def test_performance_options_and_their_warnings(qwen3_pair, tmp_path, capsys):
    target, drafter = qwen3_pair
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text("schedule: {1: 7, 8: 3, 32: 1}\nsource: test\n")
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "e", "--backend", "trtllm",
                 "--gpu", "h100", "--draft-len-schedule", schedule, "--kv-cache-dtype", "nvfp4",
                 "--rejection-sampling", "--chunked-prefill", "--cuda-graph-batch-sizes", "1,2,4,8",
                 "--llm-option", "kv_cache_config.enable_block_reuse=true") == 0
    err = capsys.readouterr().err
    options = options_of(tmp_path / "e")
    speculative = options["speculative_config"]
    assert speculative["draft_len_schedule"] == {1: 7, 8: 3, 32: 1} and speculative["use_rejection_sampling"]
    assert speculative["attention_backend"] == "VANILLA"  # SM90: TRTLLM needs SM100/103, FA4 only on request
    assert options["kv_cache_config"]["dtype"] == "nvfp4" and options["enable_chunked_prefill"] is True
    assert options["cuda_graph_config"] == {"enable_padding": True, "batch_sizes": [1, 2, 4, 8]}
    assert "--kv-cache-dtype nvfp4 need Blackwell (SM100+) GPUs; the target GPU is SM90" in err
    assert "a reused prefix never reaches the DFlash drafter's context" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("schedule: {1: 5}\n")
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "x", "--backend", "trtllm",
                 "--draft-len-schedule", bad) == 2
    assert "smallest batch size 1 must map to max_draft_len 7" in capsys.readouterr().err
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "x", "--backend", "trtllm",
                 "--draft-len-schedule", schedule, "--llm-option", "speculative_config.max_concurrency=8") == 2
    assert "max_concurrency and --draft-len-schedule are mutually exclusive" in capsys.readouterr().err


def test_torch_builds_refuse_trtllm_only_settings(qwen3_pair, tmp_path, capsys):
    target, drafter = qwen3_pair
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "e", "--gpu", "b200") == 2
    assert "build spec: 'gpu' is only used with backend 'trtllm'" in capsys.readouterr().err


@pytest.mark.parametrize("setting, needle", [
    ({"rejection_sampling": "no"}, "'rejection_sampling' must be true or false, got 'no'"),
    ({"chunked_prefill": 1}, "'chunked_prefill' must be true or false, got 1"),
    ({"draft_len_schedule": 3}, "'draft_len_schedule' must be a file path, got 3"),
])
def test_trtllm_yaml_settings_are_type_checked(setting, needle):
    """A YAML `rejection_sampling: "no"` is a string: refused, not read as true."""
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.utils.errors import DFlashError

    with pytest.raises(DFlashError, match=needle):
        BuildSpec(target="t", drafter="d", output="o", backend="trtllm", **setting)


# ---- prefix reuse on a sliding-window target -----------------------------------------------------------

def test_prefix_reuse_on_a_sliding_window_target_warns(tmp_path, capsys, drafter):
    target = family_target(tmp_path, "gpt_oss")
    capsys.readouterr()
    assert build("--target", target, "--drafter", drafter, "--output", tmp_path / "e", "--backend", "trtllm",
                 "--gpu", "b200", "--prefix-reuse", 32) == 0
    assert "the target has sliding-window layers" in capsys.readouterr().err


# ---- serving a moved engine ----------------------------------------------------------------------------------

def test_a_moved_engine_serves(qwen3_pair, tmp_path, capsys):
    import subprocess
    import sys

    from trtllm_dflash.cli.serve import main as serve_main
    from trtllm_dflash.serve.repository import validate_pbtxt

    target, drafter = qwen3_pair
    built = tmp_path / "built"
    assert build("--target", target, "--drafter", drafter, "--output", built, "--backend", "trtllm",
                 "--max-batch-size", 16, "--cuda-graph-batch-sizes", "1,4,16") == 0
    moved = tmp_path / "mnt" / "engine"
    moved.parent.mkdir()
    shutil.move(built, moved)
    assert build_main(["verify", str(moved)]) == 0
    repo = tmp_path / "repo"
    assert serve_main([str(moved), "--model-repo", str(repo), "--write-only", "--max-batch-size", "8"]) == 0
    model_yaml = yaml.safe_load((repo / "dflash" / "1" / "model.yaml").read_text())
    assert model_yaml["model"] == str(moved / "target")
    assert model_yaml["speculative_config"]["speculative_model"] == str(moved / "drafter")
    assert (moved / "drafter" / "config.json").is_file() and (moved / "target" / "config.json").is_file()
    assert model_yaml["max_batch_size"] == 8 and model_yaml["cuda_graph_config"]["batch_sizes"] == [1, 4]
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert check_options({k: v for k, v in model_yaml.items() if k not in ("model", "triton_config")}) == []
    pbtxt = validate_pbtxt((repo / "dflash" / "config.pbtxt").read_text())
    names = {i.name for i in pbtxt.input} | {o.name for o in pbtxt.output}
    assert {"stop", "return_stop_reason", "lora_id", "kv_cache_hit_rate", "first_scheduled_time_ns"} <= names
    assert not pbtxt.HasField("model_transaction_policy")  # batching and decoupled come from model.yaml
    # the launch script rewrites the repository where it runs, for the engine wherever ENGINE_DIR says
    proc = subprocess.run(["bash", str(repo / "launch_single_node.sh")], capture_output=True, text=True,
                          env={"PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin", "DRY_RUN": "1",
                               "ENGINE_DIR": "/elsewhere/engine"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (f"dflash-serve /elsewhere/engine --model-repo {repo} --model-name dflash "
                                           "--decoding dflash --max-batch-size 8 --repository-only")
    capsys.readouterr()
    assert serve_main([str(moved), "--model-repo", str(tmp_path / "r2"), "--repository-only",
                       "--max-batch-size", "32"]) == 2
    assert "--max-batch-size 32 exceeds the engine's max_batch_size 16" in capsys.readouterr().err
