"""DeepSeek-V4's own fields of a target config: compressed attention per layer, the low-rank query and grouped
output projections, hyper-connections, hash- and score-routed experts, two RoPEs.

Read as transformers 5.24 `models/deepseek_v4/configuration_deepseek_v4.py` (`DeepseekV4Config.__post_init__`:
defaults, the legacy `compress_ratios` / `num_hash_layers` / `qk_rope_head_dim` keys, the main / compress RoPE
split) reads them. The fields every family has (hidden size, heads, sliding window) stay in
`config.model.DecoderConfig`; the class defaults a config.json may omit are `DEFAULTS`; models/registry.py's entry
holds these hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config.moe import MoeConfig, number, positive_int, top_k
from ...config.rope import RopeConfig, rope_params
from ...utils.errors import DFlashError

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
MLP_TYPES = ("hash_moe", "moe")
COMPRESS_RATIO_TYPES = {0: SLIDING, 4: CSA, 128: HCA}  # legacy `compress_ratios` entries
DEFAULT_COMPRESS_RATES = {CSA: 4, HCA: 128}
SCORING = ("sqrtsoftplus", "sigmoid")  # the router activations transformers' ACT2FN has
# DeepseekV4Config's class defaults (transformers 5.24); the shared expert's width is moe_intermediate_size
# (its attribute_map reads intermediate_size from it: `fill`).
DEFAULTS = {
    "vocab_size": 129_280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
    "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 1024,
    "num_experts_per_tok": 6, "n_routed_experts": 256, "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5, "max_position_embeddings": 1_048_576, "rope_theta": 10_000.0,
    "compress_rope_theta": 160_000.0, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0,
    "sliding_window": 128, "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64, "index_head_dim": 128,
    "index_topk": 512, "rms_norm_eps": 1e-6, "eos_token_id": 1, "tie_word_embeddings": False, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False,
}


@dataclass(frozen=True)
class DeepseekV4Config:
    layer_types: tuple[str, ...]  # per layer: sliding only, or sliding plus CSA / HCA compressed entries
    mlp_types: tuple[str, ...]  # per layer: hash_moe (experts from tid2eid[token]) or moe (top-k of scores)
    compress_rates: dict[str, int]  # tokens per compressed entry: CSA, HCA
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    rope_dim: int  # the trailing channels of each head that RoPE turns (interleaved pairs)
    main_rope: RopeConfig  # of sliding-only layers
    compress_rope: RopeConfig  # of CSA / HCA layers, their compressed entries and indexer
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    scoring_func: str
    routed_scaling_factor: float
    swiglu_limit: float
    fp8_block: tuple[int, int] = (128, 128)  # quantization_config.weight_block_size of an FP8 checkpoint

    def compress_rate(self, layer: int) -> int | None:
        return self.compress_rates.get(self.layer_types[layer])


def fill(filled: dict[str, Any]) -> None:
    filled.setdefault("intermediate_size", filled["moe_intermediate_size"])


def layout(data: dict[str, Any], layers: int) -> tuple[list[str], int | None]:
    """DeepseekV4Attention: every layer attends to a sliding window (compressed entries of CSA / HCA layers
    join it: `layer_types_of`)."""
    return [SLIDING] * layers, data.get("sliding_window")


def moe_config(data: dict[str, Any], source: str, layers: int) -> MoeConfig:
    """DeepseekV4SparseMoeBlock in every layer: routed experts and one shared expert of moe_intermediate_size,
    both with limited SwiGLU; its routers (hash and score) are layers.py's."""
    experts = positive_int(data, source, "n_routed_experts")
    width = positive_int(data, source, "moe_intermediate_size")
    return MoeConfig(num_experts=experts, top_k=top_k(data, source, experts, "num_experts_per_tok"),
                     intermediate_size=width, activation="limited_silu",
                     swiglu_limit=number(data, source, "swiglu_limit", 10.0), shared_expert_intermediate_size=width,
                     layers=tuple(range(layers)))


def own_fields(data: dict[str, Any], base: dict[str, Any], source: str) -> dict[str, Any]:
    """The TargetConfig field only DeepSeek-V4 has."""
    return {"deepseek_v4": deepseek_v4_config(data, base, source)}


def _types(data: dict[str, Any], key: str, allowed: tuple[str, ...], layers: int, source: str) -> tuple[str, ...]:
    types = data[key]
    if not isinstance(types, list | tuple) or len(types) < layers or not set(types[:layers]) <= set(allowed):
        raise DFlashError(f"{source}: field '{key}' must list {layers} of {'/'.join(allowed)}, got {types!r}")
    return tuple(types[:layers])  # __post_init__ keeps the first num_hidden_layers


def layer_types_of(data: dict[str, Any], layers: int, source: str) -> tuple[str, ...]:
    """layer_types, else the legacy per-layer compress_ratios, else 2 HCA layers then CSA / HCA alternating."""
    data = dict(data)
    if data.get("layer_types") is None and data.get("compress_ratios") is not None:
        ratios = data["compress_ratios"]
        if not isinstance(ratios, list) or not set(ratios) <= set(COMPRESS_RATIO_TYPES):
            raise DFlashError(f"{source}: field 'compress_ratios' must list values of {sorted(COMPRESS_RATIO_TYPES)}, "
                              f"got {ratios!r}")
        data["layer_types"] = [COMPRESS_RATIO_TYPES[r] for r in ratios]
    if data.get("layer_types") is None:
        data["layer_types"] = [HCA] * min(layers, 2) + [CSA if i % 2 else HCA for i in range(max(layers - 2, 0))]
    return _types(data, "layer_types", LAYER_TYPES, layers, source)


def mlp_types_of(data: dict[str, Any], layers: int, source: str) -> tuple[str, ...]:
    if data.get("mlp_layer_types") is None:
        hashed = data.get("num_hash_layers", 3)
        return tuple(["hash_moe"] * min(layers, hashed) + ["moe"] * max(0, layers - hashed))
    return _types(data, "mlp_layer_types", MLP_TYPES, layers, source)


def ropes_of(data: dict[str, Any], rope_fraction: float, source: str):
    """(main, compress) RopeConfigs: nested `rope_parameters` {main, compress} as given; otherwise main is the plain
    rope_theta and compress the flat rope parameters (YaRN, with attention_factor 1 unless given) at
    compress_rope_theta."""
    params = rope_params(data)
    extra = {"max_position_embeddings": data["max_position_embeddings"]}
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        main, compress = params["main"], params["compress"]
    else:
        flat = {k: v for k, v in params.items() if k not in ("main", "compress")}
        main = {"rope_type": "default", "rope_theta": data["rope_theta"]}
        compress = {**flat, "rope_theta": data["compress_rope_theta"]}
        compress.setdefault("rope_type", compress.pop("type", "default"))
        if compress["rope_type"] == "yarn":
            compress.setdefault("attention_factor", 1.0)
    for part in (main, compress):
        fraction = part.get("partial_rotary_factor", rope_fraction)
        if fraction != rope_fraction:
            raise DFlashError(f"{source}: rope partial_rotary_factor {fraction!r} differs from the model's "
                              f"{rope_fraction!r}")
    clean = lambda p: {k: v for k, v in p.items() if k != "partial_rotary_factor"}  # noqa: E731
    return (RopeConfig.from_dict({"rope_parameters": clean(main), **extra}, source),
            RopeConfig.from_dict({"rope_parameters": clean(compress), **extra}, source))


def deepseek_v4_config(data: dict[str, Any], base: dict[str, Any], source: str) -> DeepseekV4Config:
    """data: config.json with DeepseekV4Config's defaults filled in; base: its `DecoderConfig.fields_from`."""
    layers, head_dim = base["num_hidden_layers"], base["head_dim"]
    if base["num_key_value_heads"] != 1:
        raise DFlashError(f"{source}: num_key_value_heads {base['num_key_value_heads']} (DeepSeek-V4 attention has one "
                          "K=V head)")
    fraction = data.get("partial_rotary_factor")
    if fraction is None:
        legacy = data.get("qk_rope_head_dim")
        fraction = legacy / head_dim if legacy is not None else 64 / 512
    rope_dim = int(head_dim * fraction)
    if rope_dim < 2 or rope_dim % 2 or rope_dim > min(head_dim, data["index_head_dim"]):
        raise DFlashError(f"{source}: RoPE over {rope_dim} channels (head_dim {head_dim} x partial_rotary_factor "
                          f"{fraction}) must be even, and fit head_dim and index_head_dim {data['index_head_dim']}")
    rates = {**DEFAULT_COMPRESS_RATES, **(data.get("compress_rates") or {})}
    for key, kind in (("compress_rate_csa", CSA), ("compress_rate_hca", HCA)):
        if data.get(key) is not None:
            rates[kind] = data[key]
    for kind, rate in rates.items():
        positive_int({f"compress_rates.{kind}": rate}, source, f"compress_rates.{kind}")
    scoring = data["scoring_func"]
    if scoring not in SCORING:
        raise DFlashError(f"{source}: unsupported scoring_func {scoring!r} (DeepSeek-V4: {', '.join(SCORING)})")
    heads, groups = base["num_attention_heads"], positive_int(data, source, "o_groups")
    if heads % groups:
        raise DFlashError(f"{source}: num_attention_heads {heads} is not a multiple of o_groups {groups}")
    main, compress = ropes_of(data, fraction, source)
    return DeepseekV4Config(
        layer_types=layer_types_of(data, layers, source), mlp_types=mlp_types_of(data, layers, source),
        compress_rates=rates, q_lora_rank=positive_int(data, source, "q_lora_rank"),
        o_lora_rank=positive_int(data, source, "o_lora_rank"), o_groups=groups, rope_dim=rope_dim,
        main_rope=main, compress_rope=compress, hc_mult=positive_int(data, source, "hc_mult"),
        hc_sinkhorn_iters=positive_int(data, source, "hc_sinkhorn_iters"), hc_eps=number(data, source, "hc_eps"),
        index_n_heads=positive_int(data, source, "index_n_heads"),
        index_head_dim=positive_int(data, source, "index_head_dim"),
        index_topk=positive_int(data, source, "index_topk"), scoring_func=scoring,
        routed_scaling_factor=number(data, source, "routed_scaling_factor"),
        swiglu_limit=number(data, source, "swiglu_limit"), fp8_block=fp8_block(data, source))


def fp8_block(data: dict[str, Any], source: str) -> tuple[int, int]:
    """quantization_config.weight_block_size (FP8 scales' tiles); experts of another dtype (`expert_dtype`, which
    DeepseekV4Config moves into quantization_config) are refused."""
    quant = data.get("quantization_config") or {}
    experts = quant.get("expert_dtype", data.get("expert_dtype")) if isinstance(quant, dict) else None
    if experts not in (None, "fp8", "bf16", "bfloat16"):
        raise DFlashError(f"{source}: quantization_config.expert_dtype {experts!r} is not read (FP8 block-scaled and "
                          "unquantized experts are)")
    block = quant.get("weight_block_size", [128, 128]) if isinstance(quant, dict) else [128, 128]
    if (not isinstance(block, list | tuple) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise DFlashError(f"{source}: quantization_config.weight_block_size must be two positive ints, got {block!r}")
    return tuple(block)
