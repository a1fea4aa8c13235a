"""Tiny random checkpoints for tests: targets written by `transformers`, drafters in the published layout."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from trtllm_dflash.config.model import default_target_layer_ids

VOCAB = 96


# MoE families: several experts, a sliding window shorter than the tests' sequences.
MOE_DEFAULTS = {
    "gpt_oss": dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=6,
                    rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": False, "original_max_position_embeddings": 64,
                                     "rope_theta": 10000.0}),
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                      use_sliding_window=True, sliding_window=7, max_window_layers=0, rope_theta=10000.0),
}


def hf_config(kind: str, **overrides):
    from transformers import AutoConfig, LlamaConfig, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                  rms_norm_eps=1e-6, eos_token_id=1, tie_word_embeddings=False)
    if kind in MOE_DEFAULTS:
        return AutoConfig.for_model(kind, **{**common, **MOE_DEFAULTS[kind], **overrides})
    common.update(overrides)
    if kind == "qwen3":
        return Qwen3Config(rope_theta=10000.0, **common)
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0}
    return LlamaConfig(rope_parameters=rope, **common)


def make_hf_target(path: Path, kind: str = "qwen3", seed: int = 0, **overrides):
    """Save a random transformers model (the oracle) and return it in eval mode, float32."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(kind, **overrides), attn_implementation="eager")
    with torch.no_grad():  # larger weights than the default init: sharper, more varied logits
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
            elif name.endswith("sinks"):
                p.normal_(0, 1.0)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    model.eval().save_pretrained(path)
    return model


def drafter_config(target_layers: int = 4, hidden: int = 32, layers: int = 2, block_size: int = 8,
                   mask_token_id: int = VOCAB - 1, **extra) -> dict:
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
        "intermediate_size": 64, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "vocab_size": VOCAB, "max_position_embeddings": 512, "block_size": block_size,
        "num_target_layers": target_layers,
        "dflash_config": {"mask_token_id": mask_token_id,
                          "target_layer_ids": default_target_layer_ids(target_layers, layers)},
    }
    cfg.update(extra)
    return cfg


def drafter_weights(cfg: dict, seed: int = 0, scale: float = 0.2) -> dict[str, torch.Tensor]:
    """Random weights under exactly the published names (no `model.` prefix)."""
    g = torch.Generator().manual_seed(seed)
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    n_ids = len(cfg["dflash_config"]["target_layer_ids"])
    rnd = lambda *s: torch.randn(*s, generator=g) * scale  # noqa: E731
    ones = lambda n: 1 + 0.1 * torch.randn(n, generator=g)  # noqa: E731
    w = {"fc.weight": rnd(h, n_ids * h), "hidden_norm.weight": ones(h), "norm.weight": ones(h)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"layers.{layer}."
        w.update({
            p + "self_attn.q_proj.weight": rnd(nq * d, h), p + "self_attn.k_proj.weight": rnd(nkv * d, h),
            p + "self_attn.v_proj.weight": rnd(nkv * d, h), p + "self_attn.o_proj.weight": rnd(h, nq * d),
            p + "self_attn.q_norm.weight": ones(d), p + "self_attn.k_norm.weight": ones(d),
            p + "mlp.gate_proj.weight": rnd(i, h), p + "mlp.up_proj.weight": rnd(i, h),
            p + "mlp.down_proj.weight": rnd(h, i),
            p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
        })
    return w


def write_drafter(path: Path, cfg: dict | None = None, weights: dict | None = None, seed: int = 0) -> Path:
    cfg = cfg or drafter_config()
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(weights if weights is not None else drafter_weights(cfg, seed), str(path / "model.safetensors"))
    return path


def laguna_drafter_config(window: int = 3, **extra) -> dict:
    """A tiny Laguna DFlash drafter as published (vLLM's architecture name, model_type llama): a causal sliding layer
    with a window shorter than a block, then a full one."""
    laguna = dict(architectures=["DFlashLagunaForCausalLM"], model_type="llama", gating=True,
                  layer_types=["sliding_attention", "full_attention"], sliding_window=window)
    return drafter_config(**{**laguna, **extra})


def laguna_drafter_weights(cfg: dict, seed: int = 0, fused_qkv: bool = True) -> dict[str, torch.Tensor]:
    """drafter_weights plus the Laguna tensors (aux norms off 1, per-head gates); fused_qkv: layer 0's q/k/v as
    one `self_attn.qkv_proj.weight`, as some published checkpoints ship it."""
    w = drafter_weights(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    for i in range(len(cfg["dflash_config"]["target_layer_ids"])):
        w[f"aux_hidden_norms.{i}.weight"] = 1 + 0.3 * torch.randn(h, generator=g)
    for layer in range(cfg["num_hidden_layers"]):
        w[f"layers.{layer}.self_attn.g_proj.weight"] = torch.randn(heads, h, generator=g) * 0.5
    if fused_qkv:
        p = "layers.0.self_attn."
        w[p + "qkv_proj.weight"] = torch.cat([w.pop(p + f"{k}_proj.weight") for k in "qkv"])
    return w


def write_laguna_drafter(path: Path, seed: int = 0, **extra) -> Path:
    cfg = laguna_drafter_config(**extra)
    return write_drafter(path, cfg, laguna_drafter_weights(cfg, seed))


def add_tokenizer(path: Path, vocab: int = VOCAB, eos: int = 1) -> Path:
    """A word-level tokenizer whose tokens are 't0' .. 't{vocab-1}' (text 't5 t6' -> ids 5, 6)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"t{eos}", unk_token="t0").save_pretrained(str(path))
    return path


def hybrid_text_config(**overrides) -> dict:
    """A tiny Qwen3.5 language model: layers 0-2 Gated DeltaNet, layer 3 gated full attention."""
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=512,
                rms_norm_eps=1e-6, eos_token_id=1, tie_word_embeddings=False)
    text.update(overrides)
    return text


MOE_FIELDS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)


def make_hf_hybrid(path: Path, layout: str = "text", seed: int = 0, moe: bool = False, **overrides):
    """Save a random transformers Qwen3.5 model (the oracle) and return it in eval mode, float32.
    layout "text": Qwen3_5ForCausalLM; "multimodal": Qwen3_5ForConditionalGeneration (a vision tower
    beside the language model under model.language_model.*). moe: the Qwen3.5-MoE classes (experts and a
    gated shared expert in every layer)."""
    import transformers as tf

    torch.manual_seed(seed)
    text = hybrid_text_config(**({**MOE_FIELDS, **overrides} if moe else overrides))
    name = "Qwen3_5Moe" if moe else "Qwen3_5"
    if layout == "multimodal":
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
                      num_position_embeddings=16)
        config = getattr(tf, f"{name}Config")(text_config=text, vision_config=vision, tie_word_embeddings=False)
        model = getattr(tf, f"{name}ForConditionalGeneration")(config)
    else:
        model = tf.AutoModelForCausalLM.from_config(getattr(tf, f"{name}TextConfig")(**text), attn_implementation="eager")
    randomize(model)
    model.eval().save_pretrained(path)
    return model


def randomize(model) -> None:
    """Larger weights than the default init (experts' stacked ones too); norms and gates off their neutral values."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 or "experts" in name:  # stacked experts [E, ...]; not the conv1d kernels
                p.normal_(0, 0.2)
            elif "norm" in name:
                p.add_(0.1 * torch.randn_like(p))


@torch.no_grad()
def hf_generate(model, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy generate (its cached path: chunked prefill, recurrent decode)."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


# Gemma 4: sliding layers (window 6) and full ones with their own head_dim (16) and one K/V head (attention_k_eq_v),
# the last two layers sharing K/V (layer 4 reads layer 3's ring, layer 5 layer 2's cache) with double-wide MLPs,
# per-layer input embeddings, a final logit soft-cap; MOE adds four experts beside every dense MLP.
GEMMA4_TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, global_head_dim=16, num_global_key_value_heads=1,
                   attention_k_eq_v=True, sliding_window=6, num_kv_shared_layers=2, use_double_wide_mlp=True,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                   hidden_size_per_layer_input=4, vocab_size_per_layer_input=VOCAB, final_logit_softcapping=30.0,
                   max_position_embeddings=512, eos_token_id=1, pad_token_id=0, bos_token_id=2)
GEMMA4_MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)


def make_hf_gemma4(path: Path, layout: str = "text", moe: bool = False, seed: int = 0, **overrides):
    """Save a random transformers Gemma 4 model (the oracle) and return it in eval mode, float32. layout "text":
    Gemma4ForCausalLM; "multimodal": Gemma4ForConditionalGeneration (a vision tower beside the language model
    under model.language_model.*)."""
    import transformers as tf

    torch.manual_seed(seed)
    text = {**GEMMA4_TEXT, **(GEMMA4_MOE if moe else {}), **overrides}
    if layout == "multimodal":
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=8, patch_size=4, position_embedding_size=64)
        special = dict(image_token_id=VOCAB + 1, video_token_id=VOCAB + 2, audio_token_id=VOCAB + 3,
                       boi_token_id=VOCAB + 4, eoi_token_id=VOCAB + 5, boa_token_id=VOCAB + 6,
                       eoa_token_index=VOCAB + 7)
        config = tf.Gemma4Config(text_config=text, vision_config=vision, audio_config=None, **special)
        model = tf.Gemma4ForConditionalGeneration(config)
    else:
        model = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**text))
    randomize(model)
    with torch.no_grad():  # the per-layer output scalars (buffers) and the router's scales off 1 too
        for name, t in model.named_buffers():
            if name.endswith("layer_scalar"):
                t.uniform_(0.7, 1.3)
        for name, p in model.named_parameters():
            if name.endswith(("router.scale", "per_expert_scale")):
                p.uniform_(0.5, 1.5)
    model.config._attn_implementation = "eager"
    model.eval().save_pretrained(path)
    return model


# DeepSeek-V4: HCA (4 tokens an entry), CSA (2 tokens an entry, overlapping windows; an indexer of 16 heads keeping
# 2 entries) and sliding-only layers, all with a 6-token window; hash-routed experts in layer 0, score-routed after;
# two hyper-connection streams. Few indexer heads make exact ties (every head's ReLU zero), which torch.topk breaks
# by the number of entries scored: transformers' own cached and uncached passes then disagree.
DEEPSEEK_V4 = dict(vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4,
                   num_attention_heads=4, head_dim=16, q_lora_rank=12, partial_rotary_factor=0.5,
                   num_experts_per_tok=2, n_routed_experts=4, sliding_window=6, o_groups=2, o_lora_rank=8,
                   index_n_heads=16, index_head_dim=12, index_topk=2,
                   compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
                   layer_types=["heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention",
                                "compressed_sparse_attention"],
                   mlp_layer_types=["hash_moe", "moe", "moe", "moe"], hc_mult=2, hc_sinkhorn_iters=5,
                   max_position_embeddings=256, eos_token_id=1, pad_token_id=0, bos_token_id=2)


def make_hf_deepseek_v4(path: Path, seed: int = 0, **overrides):
    """Save a random transformers DeepseekV4ForCausalLM (the oracle) and return it in eval mode, float32: every
    weight off its init (sinks, position biases, hyper-connection scales included), tid2eid a random choice of
    distinct experts per token, the score router's correction bias random."""
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.DeepseekV4ForCausalLM(tf.DeepseekV4Config(**{**DEEPSEEK_V4, **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 or "experts" in name:
                p.normal_(0, 0.2)
            elif "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.3)
        experts, k = model.config.n_routed_experts, model.config.num_experts_per_tok
        for name, t in model.named_buffers():
            if name.endswith("tid2eid"):
                t.copy_(torch.stack([torch.randperm(experts)[:k] for _ in range(t.shape[0])]))
            elif name.endswith("e_score_correction_bias"):
                t.normal_(0, 0.1)
    model.config._attn_implementation = "eager"
    model.eval().save_pretrained(path)
    return model
