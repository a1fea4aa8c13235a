"""Every supported family's config.json as `transformers` writes it: `save_pretrained` of the family's own class,
built from the class's defaults with only the sizes given, no hand edits. `dflash-build` builds it and the engine
decodes greedily as transformers does (tests/helpers/tiny_models.py's fixtures give many more fields; these give the
fewest a class lets a config omit)."""

import json

import pytest
import torch
from helpers.tiny_models import VOCAB, add_tokenizer, hf_generate, randomize, write_drafter
from trtllm_dflash.models.registry import parse_target_config
from trtllm_dflash.engine.loader import generate_with_engine
from trtllm_dflash.engine.request import Request

from trtllm_dflash.cli.build import main as build_main

PROMPTS = [list(range(3, 15)), [7, 50, 2, 9, 33]]
NEW = 12
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8)
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
SHARED = dict(shared_expert_intermediate_size=24)
NO_DENSE = {k: v for k, v in SIZES.items() if k != "intermediate_size"}  # Qwen3_5MoeTextConfig has none
GEMMA4 = dict(global_head_dim=16, hidden_size_per_layer_input=4, vocab_size_per_layer_input=VOCAB, sliding_window=6)
QWEN_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
                   num_position_embeddings=16)
# multi-head latent attention's sizes (DeepseekV3Config: K/V heads as many as query heads, as its eager path needs;
# two experts in each of its 8 groups)
MLA = dict(num_key_value_heads=4, n_routed_experts=16, moe_intermediate_size=16, kv_lora_rank=16, q_lora_rank=12,
           qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
KIMI_VISION = dict(patch_size=4, pos_emb_height=4, pos_emb_width=4, pos_emb_time=1, num_attention_heads=2,
                   num_hidden_layers=1, hidden_size=16, intermediate_size=32)
GEMMA_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=8, patch_size=4, position_embedding_size=64)

# model_type -> (config class, its text fields (sizes only), the causal-LM class or the wrapper's vision sizes)
FAMILIES = {
    "qwen3": ("Qwen3Config", SIZES, None),
    "llama": ("LlamaConfig", SIZES, None),
    "qwen3_moe": ("Qwen3MoeConfig", {**SIZES, **EXPERTS}, None),
    "gpt_oss": ("GptOssConfig", {**SIZES, "num_local_experts": 4, "num_experts_per_tok": 2}, None),
    "qwen3_5_text": ("Qwen3_5TextConfig", {**SIZES, **LINEAR}, None),
    "qwen3_5": ("Qwen3_5Config", {**SIZES, **LINEAR}, QWEN_VISION),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", {**NO_DENSE, **LINEAR, **EXPERTS, **SHARED}, None),
    "qwen3_5_moe": ("Qwen3_5MoeConfig", {**NO_DENSE, **LINEAR, **EXPERTS, **SHARED}, QWEN_VISION),
    "qwen3_next": ("Qwen3NextConfig", {**SIZES, **LINEAR, **EXPERTS, **SHARED}, None),
    "gemma4_text": ("Gemma4TextConfig", {**SIZES, **GEMMA4}, None),
    "gemma4": ("Gemma4Config", {**SIZES, **GEMMA4}, GEMMA_VISION),
    # intermediate_size is one expert's width (experts in every layer)
    "minimax_m2": ("MiniMaxM2Config", {**SIZES, "num_local_experts": 4, "num_experts_per_tok": 2}, None),
    "laguna": ("LagunaConfig", {**SIZES, **EXPERTS, **SHARED}, None),
    "deepseek_v3": ("DeepseekV3Config", {**SIZES, **MLA}, None),
    "kimi_k25": ("Kimi_K25Config", {**SIZES, **MLA}, KIMI_VISION),
}


def save_family(path, model_type: str):
    """A random model of `model_type` from its class's defaults and SIZES, saved by transformers; -> the model."""
    import transformers as tf

    name, text, vision = FAMILIES[model_type]
    cls = getattr(tf, name)
    torch.manual_seed(3)
    if vision is None:
        model = tf.AutoModelForCausalLM.from_config(cls(**text), attn_implementation="eager")
    else:
        extra = {"audio_config": None} if model_type == "gemma4" else {}
        config = cls(text_config=text, vision_config=vision, **extra)
        model = getattr(tf, name.replace("Config", "ForConditionalGeneration"))._from_config(
            config, attn_implementation="eager")
    randomize(model)
    model.eval().save_pretrained(path)
    add_tokenizer(path)
    return model


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_config_written_by_transformers_builds_and_decodes_exactly(model_type, tmp_path):
    hf = save_family(tmp_path / "target", model_type)
    data = json.loads((tmp_path / "target" / "config.json").read_text())
    assert data["model_type"] == model_type
    if model_type.startswith("qwen3_5_moe"):  # the case: the class defines no dense MLP width
        assert "intermediate_size" not in data.get("text_config", data)
    cfg = parse_target_config(data, "config.json")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (32, 4, VOCAB)
    drafter = write_drafter(tmp_path / "drafter", seed=2)
    engine = tmp_path / "engine"
    assert build_main(["--target", str(tmp_path / "target"), "--drafter", str(drafter), "--output", str(engine),
                       "--dtype", "float32", "--max-seq-len", "128"]) == 0
    expected = [hf_generate(hf, p, NEW) for p in PROMPTS]
    requests = [Request(tuple(p), NEW, ignore_eos=True) for p in PROMPTS]
    assert [r.output_ids for r in generate_with_engine(engine, requests, draft_len=3)] == expected


@pytest.mark.parametrize("model_type, field, value", [
    ("qwen3", "num_key_value_heads", 32),  # Qwen3Config's default, not num_attention_heads
    ("qwen3", "head_dim", 128),  # Qwen3Config's default, not hidden_size // num_attention_heads
    ("qwen3_5_moe_text", "intermediate_size", None),
    ("gpt_oss", "rms_norm_eps", 1e-5),
])
def test_fields_the_file_omits_take_the_class_default(model_type, field, value):
    cfg = parse_target_config({"model_type": model_type, "num_hidden_layers": 2}, "config.json")
    assert getattr(cfg, field) == value


@pytest.mark.parametrize("data, message", [
    ({"model_type": "qwen3", "hidden_size": "x"}, "field 'hidden_size' must be int, got 'x'"),
    ({"model_type": "qwen3", "num_attention_heads": 0}, "field 'num_attention_heads' must be positive, got 0"),
    ({"model_type": "qwen3_5_moe", "text_config": {"num_experts": "many"}},
     "field 'num_experts' must be a positive int, got 'many'"),
    ({"model_type": "qwen3_5_moe", "text_config": "x"}, "needs a 'text_config' object, got 'x'"),
])
def test_a_value_the_class_refuses_is_one_line_naming_it(data, message):
    from trtllm_dflash.utils.errors import DFlashError

    with pytest.raises(DFlashError, match=message):
        parse_target_config(data, "config.json")
