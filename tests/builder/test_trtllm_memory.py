"""The memory plan of `trtllm` engines against TensorRT-LLM's own formulas.

The oracles are upstream's: the DFlash context buffer and its budget as
tests/unittest/_torch/speculative/hw_agnostic/test_dflash_config_budget.py@414ba69f (NVIDIA/TensorRT-LLM) states
them -- its worked examples (a 5-layer drafter, 16 KV heads at tp 4, head_dim 64, 1M positions; the Laguna-XS L0
configs; a 100 GiB device with 50 GiB of weights per rank) and its formulas, written out here by hand. TensorRT-LLM
itself cannot run here.
"""

import math

import pytest
from helpers.tiny_models import make_hf_target

from trtllm_dflash.builder.trtllm.memory import (
    GIB,
    RULES_1_3,
    RULES_1_4,
    MemoryInputs,
    arena_budget_bytes,
    checkpoint_bytes,
    ctx_arena_bytes,
    plan_memory,
)
from trtllm_dflash.utils.errors import DFlashError

# ---- upstream's worked examples ------------------------------------------------------------------------------

UPSTREAM_DRAFTER = dict(drafter_layers=5, drafter_kv_heads=16, drafter_head_dim=64, drafter_max_positions=1048576)


def inputs(**kw) -> MemoryInputs:
    """Defaults: upstream's drafter geometry at tp 4, bf16; a small target (the arena tests ignore it)."""
    args = dict(tp=4, max_batch_size=32, max_seq_len=1048576, max_num_tokens=8192, max_draft_len=7,
                attention_backend="VANILLA", weight_bytes=0, target_kv_layers=1, target_kv_heads=4, target_head_dim=64,
                kv_itemsize=2, hidden_size=64, num_capture_layers=1, itemsize=2, drafter_itemsize=2, budget_gib=1024,
                **UPSTREAM_DRAFTER)
    return MemoryInputs(**{**args, **kw})


def test_the_dense_arena_is_upstreams_two_slot_tensors():
    # upstream: 33 slots x (K and V of 5 layers x (1048576 + 8) positions x 4 heads x 64 x 2 bytes)
    per_slot = 2 * 5 * (1048576 + 8) * 4 * 64 * 2
    assert ctx_arena_bytes(inputs(), paged=False) == 33 * per_slot
    # a serving max_seq_len caps the capacity below the drafter's positions
    assert ctx_arena_bytes(inputs(max_seq_len=8192), paged=False) == 33 * 2 * 5 * (8192 + 8) * 4 * 64 * 2
    # the L0 config: 129 slots, 5 layers, (4096 + 5) positions, 8 KV heads, head_dim 128, bf16 = 10.09 GiB
    l0 = inputs(tp=1, max_batch_size=128, max_seq_len=4096, max_draft_len=4, drafter_kv_heads=8, drafter_head_dim=128,
                drafter_max_positions=262144)
    assert ctx_arena_bytes(l0, paged=False) == 2 * 129 * 5 * (4096 + 5) * 8 * 128 * 2
    assert 10.0 < ctx_arena_bytes(l0, paged=False) / GIB < 10.2


def test_the_paged_arena_rounds_each_slot_to_32_token_pages():
    # upstream: max_batch 1, ctx 100, block 8 -> capacity 108 -> 4 pages = 128 tokens; 2 layers, 1 head, dim 16
    m = inputs(tp=1, max_batch_size=1, max_seq_len=100, drafter_layers=2, drafter_kv_heads=1, drafter_head_dim=16)
    assert ctx_arena_bytes(m, paged=True) == 2 * 2 * 2 * 128 * 1 * 16 * 2


def test_the_arena_budget_follows_upstreams_two_derivations():
    # estimation on (the default): total - 4 GiB overhead - weights - 6 GiB reserve; the fraction does not enter
    for fraction in (0.5, 0.8, 0.9):
        assert arena_budget_bytes(100 * GIB, 50 * GIB, fraction, arena_first=True) == 40 * GIB
    # estimation skipped: the pool commits first; the arena gets (1 - fraction) of the rest, x 0.7
    assert arena_budget_bytes(100 * GIB, 50 * GIB, 0.8, arena_first=False) == int(46 * GIB * 0.2 * 0.7)
    assert arena_budget_bytes(8 * GIB, 100 * GIB, 0.8, arena_first=True) == 0  # floored at zero
    # upstream's L0 configs fit the arena-first budget and not the pool-first one
    l0_arena = 2 * 129 * 5 * (4096 + 5) * 8 * 128 * 2
    for total, weights in ((178 * GIB, 62 * GIB), (79 * GIB, 33 * GIB)):
        assert arena_budget_bytes(total, weights, 0.9, arena_first=True) >= l0_arena
        assert arena_budget_bytes(total, weights, 0.9, arena_first=False) < l0_arena


def test_an_oversized_arena_is_refused_naming_the_batch_that_fits():
    # upstream: a budget of 10 slots at max_seq_len 8192 refuses 33 slots and names 10 - 1 = 9
    per_slot = 2 * 5 * (8192 + 8) * 4 * 64 * 2
    weights = 4 * 50 * GIB  # 50 GiB per rank at tp 4
    total = (50 * GIB + 4 * GIB + 6 * GIB + 10 * per_slot) / GIB  # an arena-first budget of exactly 10 slots
    with pytest.raises(DFlashError, match=r"lower --max-batch-size to 9 or lower --max-seq-len"):
        plan_memory(inputs(max_seq_len=8192, weight_bytes=weights, budget_gib=total))
    plan = plan_memory(inputs(max_seq_len=8192, max_batch_size=9, weight_bytes=weights, budget_gib=total))
    assert plan.arena == 10 * per_slot == plan.arena_budget and plan.warning == ""
    # where upstream only warns: TRTLLM (its draft KV pool), a release without the check, skip_ctx_buffer_budget_check
    for kw in (dict(rules=RULES_1_3), dict(skip_budget_check=True)):
        warned = plan_memory(inputs(max_seq_len=8192, weight_bytes=weights, budget_gib=total, **kw))
        assert "lower --max-batch-size to 9 " in warned.warning
    paged = plan_memory(inputs(max_seq_len=8192, weight_bytes=weights, budget_gib=total, attention_backend="TRTLLM"))
    fits = 10 * per_slot // (2 * 5 * 8224 * 4 * 64 * 2) - 1  # the fallback arena's 32-token pages: 8208 -> 8224
    assert paged.arena == 0 and f"lower --max-batch-size to {fits} " in paged.warning and "fallback" in paged.warning


# ---- Qwen3-8B and its published DFlash drafter (configs only), per attention backend ------------------------

QWEN3_8B = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960}
QWEN3_8B_DRAFTER = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 4096,
                    "intermediate_size": 12288, "num_hidden_layers": 5, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                    "vocab_size": 151936, "max_position_embeddings": 40960, "block_size": 16,
                    "num_target_layers": 36,
                    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}}
WEIGHTS = 2 * (8_190_735_360 + 1_048_626_432)   # bf16 target + drafter: 18 478 723 584 B, 17.21 GiB
DENSE = 65 * 5 * (8192 + 15 + 1) * 2 * 8 * 128 * 2  # slots x layers x capacity x K,V x heads x dim x bf16
CAPTURE = 8192 * 4096 * 5 * 2                       # max_num_tokens x hidden x 5 captured layers x bf16
TARGET_KV = 36 * 2 * 8 * 128 * 2                    # bytes per token of the target's KV cache


def qwen3_8b_inputs(max_seq_len=8192, **kw):
    from trtllm_dflash.models.registry import parse_drafter_config

    from trtllm_dflash.builder.trtllm.targets import TrtllmTarget

    target = TrtllmTarget.from_dict(QWEN3_8B, "Qwen3-8B")
    drafter = parse_drafter_config(QWEN3_8B_DRAFTER, "Qwen3-8B-DFlash-b16")
    # parameters by hand: per target layer q,o 4096x4096, k,v 4096x1024, q/k norms 128, MLP 3x4096x12288, 2 norms;
    # embeddings and (untied) lm_head 151936x4096, final norm. Drafter: 5 such layers, fc 20480->4096, 2 norms.
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 128 + 3 * 4096 * 12288 + 2 * 4096
    assert (36 * layer + 2 * 151936 * 4096 + 4096, 5 * layer + 5 * 4096 * 4096 + 2 * 4096) == (8_190_735_360,
                                                                                            1_048_626_432)
    args = dict(tp=1, max_batch_size=64, max_seq_len=max_seq_len, max_num_tokens=8192, max_draft_len=15,
                attention_backend="VANILLA", weight_bytes=WEIGHTS, target_kv_layers=target.kv_layers,
                target_kv_heads=target.num_key_value_heads, target_head_dim=target.head_dim, kv_itemsize=2,
                hidden_size=target.hidden_size, num_capture_layers=len(drafter.target_layer_ids),
                drafter_layers=drafter.num_hidden_layers, drafter_kv_heads=drafter.num_key_value_heads,
                drafter_head_dim=drafter.head_dim, drafter_max_positions=drafter.max_position_embeddings, itemsize=2,
                drafter_itemsize=2, budget_gib=80)
    return MemoryInputs(**{**args, **kw})


def test_vanilla_reserves_the_dense_arena_before_the_pool():
    plan = plan_memory(qwen3_8b_inputs())
    free = 80 * GIB - WEIGHTS - 4 * GIB - DENSE - CAPTURE  # what the estimation forward leaves
    assert (plan.weights, plan.arena, plan.capture, plan.budget) == (WEIGHTS, DENSE, CAPTURE, 80 * GIB)
    assert DENSE == 10_926_489_600 and plan.placement == "allocated before the KV pool"
    assert plan.fraction == 0.85 and plan.kv_pool == int(0.85 * free)  # the fraction bounds the pool, not the arena
    assert plan.arena_budget == 80 * GIB - 4 * GIB - WEIGHTS - 6 * GIB
    assert plan.kv_bytes_per_token == TARGET_KV == 147_456 and plan.kv_tokens == plan.kv_pool // TARGET_KV
    assert plan_memory(qwen3_8b_inputs(attention_backend="FA4")).arena == DENSE  # FA4 is dense from 1.4
    assert plan_memory(qwen3_8b_inputs(tp=8)).arena == DENSE // 8  # 1 KV head per rank


def test_trtllm_takes_draft_kv_pool_pages_and_no_arena():
    plan = plan_memory(qwen3_8b_inputs(attention_backend="TRTLLM"))
    assert plan.arena == 0 and plan.placement == "pages of the draft KV pool" and plan.warning == ""
    assert plan.kv_bytes_per_token == TARGET_KV + 5 * 2 * 8 * 128 * 2  # the pool's tokens carry the drafter's layers
    assert plan.kv_pool == int(0.85 * (80 * GIB - WEIGHTS - 4 * GIB - CAPTURE))
    # a quantized KV cache is not the drafter's dtype: the pool does not bind, the paged arena is reserved
    fp8 = plan_memory(qwen3_8b_inputs(attention_backend="TRTLLM", kv_itemsize=1))
    assert fp8.arena == 65 * 5 * 8224 * 2 * 8 * 128 * 2 and fp8.kv_bytes_per_token == TARGET_KV // 2
    # 1.3.0rc27 (@58ae162a): a private paged arena for TRTLLM and FA4, 8208 tokens rounded up to 32-token pages
    for backend in ("TRTLLM", "FA4"):
        assert plan_memory(qwen3_8b_inputs(attention_backend=backend, rules=RULES_1_3)).arena == (
            65 * 5 * 8224 * 2 * 8 * 128 * 2)
    assert plan_memory(qwen3_8b_inputs(rules=RULES_1_4, attention_backend="FA4")).placement.startswith("allocated")


def test_the_arena_is_sized_in_the_stored_drafter_dtype():
    assert plan_memory(qwen3_8b_inputs(drafter_itemsize=4)).arena == 2 * DENSE  # a float32 drafter doubles it
    assert plan_memory(qwen3_8b_inputs(drafter_itemsize=4)).capture == CAPTURE  # the capture buffer: model dtype


def test_when_the_pool_commits_first_a_default_fraction_makes_room():
    plan = plan_memory(qwen3_8b_inputs(arena_first=False))
    headroom = 80 * GIB - WEIGHTS - 4 * GIB
    fraction = math.floor((1 - DENSE / (headroom * 0.7)) * 100) / 100
    assert plan.fraction == fraction == 0.75 and plan.placement == "allocated after the KV pool"
    assert plan.arena <= plan.arena_budget == int(headroom * (1 - 0.75) * 0.7)
    assert plan.kv_pool == int(0.75 * (headroom - CAPTURE))
    with pytest.raises(DFlashError, match=r"after the KV pool commits: lower --max-batch-size to \d+ "):
        plan_memory(qwen3_8b_inputs(arena_first=False, fraction=0.9))  # the user's fraction: upstream refuses
    with pytest.raises(DFlashError, match=r"comes after the KV pool here and leaves less than 10%"):
        plan_memory(qwen3_8b_inputs(40960, arena_first=False))


def test_what_cannot_fit_is_refused():
    # the old default max_seq_len = max_position_embeddings 40960: a 50.8 GiB arena at batch 64 fits 80 GiB before
    # the pool (52.8 GiB budget) and leaves a small pool; at batch 128 it does not
    assert plan_memory(qwen3_8b_inputs(40960)).arena / GIB == pytest.approx(50.80, abs=0.01)
    per_slot = 5 * (40960 + 16) * 2 * 8 * 128 * 2
    fits = (80 * GIB - 4 * GIB - WEIGHTS - 6 * GIB) // per_slot - 1
    with pytest.raises(DFlashError, match=rf"needs 100.82 GiB .* lower --max-batch-size to {fits} "):
        plan_memory(qwen3_8b_inputs(40960, max_batch_size=128))
    with pytest.raises(DFlashError, match=r"weights 17.21 GiB \+ 4 GiB runtime overhead per GPU exceed the 16 GiB"):
        plan_memory(qwen3_8b_inputs(budget_gib=16))
    with pytest.raises(DFlashError, match=r"DFlash context arena 0.00 GiB .* exceed the 21.5 GiB budget"):
        plan_memory(qwen3_8b_inputs(attention_backend="TRTLLM", budget_gib=21.5))  # no arena; no room for the pool


def test_checkpoint_bytes_match_the_model_parameters(tmp_path):
    """Weights are counted from the safetensors headers: the same as transformers' parameter count."""
    model = make_hf_target(tmp_path / "t", "qwen3")
    params = sum(p.numel() for p in model.parameters())
    assert checkpoint_bytes(tmp_path / "t", 2) == 2 * params
    linear = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n
                 and "lm_head" not in n)
    assert checkpoint_bytes(tmp_path / "t", 2, 1.0) == 2 * params - linear  # fp8 linear weights: 1 byte
    head = model.lm_head.weight.numel()
    assert checkpoint_bytes(tmp_path / "t", 2, exclude=("lm_head.weight",)) == 2 * (params - head)
