"""Gemma 4's own fields of a target config: per-layer-type attention shapes and RoPE, K/V shared across layers,
per-layer input embeddings, the double-wide MLP and the final logit soft-cap.

Read from transformers 5.24 `models/gemma4/configuration_gemma4.py` (`Gemma4TextConfig`) and
`modeling_gemma4.py` (`Gemma4TextAttention`, `Gemma4TextMLP`, `Gemma4TextRotaryEmbedding`, `Gemma4TextModel`).
The fields every family has (hidden size, heads, sliding window, ...) stay in `config.model.DecoderConfig`; the
class defaults a config.json may omit are `TEXT_DEFAULTS`; models/registry.py's entries hold these hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config.family import FULL, SLIDING
from ...config.moe import MoeConfig, positive_int, top_k
from ...utils.errors import DFlashError

# Gemma4TextRotaryEmbedding: "default" (compute_default_rope_parameters: every frequency over the whole head_dim)
# or "proportional" (modeling_rope_utils._compute_proportional_rope_parameters)
ROPE_TYPES = ("default", "proportional")
# Gemma4TextConfig.__post_init__'s rope_parameters when config.json has none
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
GLOBAL_HEAD_DIM = 512  # Gemma4TextConfig.__post_init__: full-attention layers' head_dim unless given
PER_LAYER_KEYS = ("head_dim", "num_key_value_heads")  # what Gemma4TextConfig writes into per_layer_config
# Gemma4TextConfig's class defaults (transformers 5.24) that change the math; a config.json may omit any of them.
# Its rope_parameters and global_head_dim defaults are DEFAULT_ROPE and GLOBAL_HEAD_DIM.
TEXT_DEFAULTS = {
    "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "eos_token_id": 1, "tie_word_embeddings": True,
    "attention_bias": False, "sliding_window": 512, "final_logit_softcapping": None,
    "vocab_size_per_layer_input": 262_144, "hidden_size_per_layer_input": 256, "attention_k_eq_v": False,
    "num_kv_shared_layers": 0, "enable_moe_block": False, "use_double_wide_mlp": False,
}


def layout(data: dict[str, Any], layers: int) -> tuple[list[str] | None, int | None]:
    """Gemma4TextConfig.__post_init__: five sliding layers, then one full, and the last layer is made full
    whatever layer_types says."""
    types = data.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % 6 else FULL for i in range(layers)]
    if isinstance(types, list) and types:
        types = [*types[:-1], FULL]
    return types, data.get("sliding_window")


def moe_config(data: dict[str, Any], source: str, layers: int) -> MoeConfig | None:
    """Gemma4TextDecoderLayer: with enable_moe_block every layer adds routed experts beside its dense MLP;
    Gemma4TextRouter renormalises the top-k probabilities; experts use hidden_activation. The router's own
    scales and the block's norms are layers.py's."""
    if not data.get("enable_moe_block"):
        return None
    experts = positive_int(data, source, "num_experts")
    return MoeConfig(num_experts=experts, top_k=top_k(data, source, experts, "top_k_experts"),
                     intermediate_size=positive_int(data, source, "moe_intermediate_size"), norm_topk_prob=True,
                     activation="gelu_tanh", layers=tuple(range(layers)))


@dataclass(frozen=True)
class Gemma4Rope:
    """The rotary embedding of one layer type: `inv_freq` over head_dim / 2 frequencies, as transformers builds it."""

    rope_type: str = "default"
    theta: float = 10_000.0
    # proportional: the first int(partial_rotary_factor * head_dim // 2) frequencies rotate (exponents over the
    # whole head_dim), the rest are 0 (those channels pass unrotated); all divided by `factor`
    partial_rotary_factor: float = 1.0
    factor: float = 1.0


@dataclass(frozen=True)
class Gemma4Attention:
    """What the attention layers of one type (sliding_attention / full_attention) share."""

    head_dim: int
    num_kv_heads: int
    rope: Gemma4Rope


@dataclass(frozen=True)
class Gemma4Config:
    sliding: Gemma4Attention
    full: Gemma4Attention
    k_eq_v: bool = False  # full-attention layers: V is the K projection (before k_norm), no v_proj
    kv_shared_layers: int = 0  # the last this many layers attend to an earlier layer's K/V (none of their own)
    per_layer_input: int = 0  # hidden_size_per_layer_input: each layer's per-layer embedding width; 0: none
    per_layer_vocab: int = 0  # vocab_size_per_layer_input: rows of the per-layer embedding table
    double_wide_mlp: bool = False  # layers sharing K/V have an MLP of 2 x intermediate_size
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)

    def attention(self, kind: str) -> Gemma4Attention:
        return self.full if kind == FULL else self.sliding

    def kv_source(self, layer: int, layer_types: tuple[str, ...]) -> int:
        """The layer whose K/V `layer` attends to: itself, or for a shared layer the last unshared layer of its type
        (Gemma4TextConfig.kv_sharing_modes: that layer "store"s its K/V, later layers of its type "reuse" them)."""
        first = len(layer_types) - self.kv_shared_layers
        if layer < first:
            return layer
        return max(i for i in range(first) if layer_types[i] == layer_types[layer])

    def shares_kv(self, layer: int, num_layers: int) -> bool:
        return layer >= num_layers - self.kv_shared_layers


def own_fields(text: dict[str, Any], base: dict[str, Any], source: str) -> dict[str, Any]:
    """The TargetConfig field only Gemma 4 has."""
    return {"gemma4": gemma4_config(text, base, source)}


def gemma4_config(text: dict[str, Any], base: dict[str, Any], source: str) -> Gemma4Config:
    """text: the language model's config.json fields with Gemma4TextConfig's defaults filled in; base: its
    `DecoderConfig.fields_from` (heads, sliding head_dim and layer types, validated)."""
    activation = text.get("hidden_activation")
    if activation != "gelu_pytorch_tanh":
        raise DFlashError(f"{source}: unsupported hidden_activation {activation!r} (Gemma 4: 'gelu_pytorch_tanh')")
    if text.get("use_bidirectional_attention") == "all":
        raise DFlashError(f"{source}: use_bidirectional_attention 'all' makes a non-causal encoder, not a decoder")
    attention = type_attention(text, base, source)
    cfg = Gemma4Config(
        sliding=attention[SLIDING], full=attention[FULL], k_eq_v=_flag(text, "attention_k_eq_v", source),
        kv_shared_layers=_count(text, "num_kv_shared_layers", source),
        per_layer_input=_count(text, "hidden_size_per_layer_input", source),
        per_layer_vocab=_count(text, "vocab_size_per_layer_input", source),
        double_wide_mlp=_flag(text, "use_double_wide_mlp", source),
        final_logit_softcapping=_cap(text.get("final_logit_softcapping"), source))
    check_sharing(cfg, base["layer_types"], source)
    if cfg.per_layer_input and not cfg.per_layer_vocab:
        raise DFlashError(f"{source}: hidden_size_per_layer_input {cfg.per_layer_input} needs a positive "
                          "vocab_size_per_layer_input")
    return cfg


def type_attention(text: dict[str, Any], base: dict[str, Any], source: str) -> dict[str, Gemma4Attention]:
    """Each layer type's shape and RoPE: one shape per type (Gemma4TextRotaryEmbedding reads one config per type,
    per_layer_config[type], and raises where the type's layers differ)."""
    types, shapes, ropes = base["layer_types"], layer_shapes(text, base, source), layer_ropes(text, source)
    attention, default = {}, (base["head_dim"], base["num_key_value_heads"])
    for kind in (SLIDING, FULL):
        found = {shapes[i] for i, t in enumerate(types) if t == kind} or {default}
        if len(found) > 1:
            raise DFlashError(f"{source}: per_layer_config gives {kind} layers different shapes {sorted(found)}")
        attention[kind] = Gemma4Attention(*found.pop(), rope=ropes[kind])
        check_heads(kind, attention[kind], base["num_attention_heads"], source)
    return attention


def layer_shapes(text: dict[str, Any], base: dict[str, Any], source: str) -> list[tuple[int, int]]:
    """(head_dim, num_key_value_heads) of every layer: per_layer_config's overrides, or (as Gemma4TextConfig
    builds them when it is absent) global_head_dim and, with attention_k_eq_v, num_global_key_value_heads for
    every full-attention layer."""
    types, default = base["layer_types"], (base["head_dim"], base["num_key_value_heads"])
    overrides = text.get("per_layer_config")
    if overrides is None:
        kv = text.get("num_global_key_value_heads") if text.get("attention_k_eq_v", True) else None
        overrides = {i: {"head_dim": text.get("global_head_dim", GLOBAL_HEAD_DIM),
                         **({} if kv is None else {"num_key_value_heads": kv})}
                     for i, t in enumerate(types) if t == FULL}
    by_layer = per_layer_overrides(overrides, len(types), source)
    shapes = []
    for i in range(len(types)):
        own = by_layer.get(i, {})
        shape = (own.get("head_dim", default[0]), own.get("num_key_value_heads", default[1]))
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
            raise DFlashError(f"{source}: per_layer_config of layer {i} must give positive ints, got {own!r}")
        shapes.append(shape)
    return shapes


def per_layer_overrides(overrides: Any, layers: int, source: str) -> dict[int, dict[str, Any]]:
    """per_layer_config ({"05": {"head_dim": 512}, ...}: transformers writes zero-padded layer indices) by layer."""
    if not isinstance(overrides, dict):
        raise DFlashError(f"{source}: field 'per_layer_config' must be an object, got {overrides!r}")
    by_layer = {}
    for key, value in overrides.items():
        index = int(key) if str(key).isdigit() else -1
        if not 0 <= index < layers or not isinstance(value, dict) or set(value) - set(PER_LAYER_KEYS):
            raise DFlashError(f"{source}: unsupported per_layer_config entry {key!r}: {value!r} (layer indices "
                              f"0..{layers - 1} overriding {', '.join(PER_LAYER_KEYS)})")
        by_layer[index] = value
    return by_layer


def layer_ropes(text: dict[str, Any], source: str) -> dict[str, Gemma4Rope]:
    params = text.get("rope_parameters") or DEFAULT_ROPE
    if not isinstance(params, dict) or not all(isinstance(params.get(k), dict) for k in (SLIDING, FULL)):
        raise DFlashError(f"{source}: field 'rope_parameters' must hold a {SLIDING} and a {FULL} object, "
                          f"got {params!r}")
    return {kind: _rope(params[kind], text, kind, source) for kind in (SLIDING, FULL)}


def _rope(params: dict[str, Any], text: dict[str, Any], kind: str, source: str) -> Gemma4Rope:
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise DFlashError(f"{source}: unsupported rope_type {rope_type!r} for {kind} "
                          f"(supported: {', '.join(ROPE_TYPES)})")
    theta = params.get("rope_theta", text.get("rope_theta"))  # standardize_rope_params: the top-level theta
    values = {"rope_theta": theta, "partial_rotary_factor": params.get("partial_rotary_factor", 1.0),
              "factor": params.get("factor", 1.0)}
    for key, value in values.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise DFlashError(f"{source}: field 'rope_parameters.{kind}.{key}' must be a positive number, "
                              f"got {value!r}")
    if values["partial_rotary_factor"] > 1:
        raise DFlashError(f"{source}: field 'rope_parameters.{kind}.partial_rotary_factor' must be at most 1, "
                          f"got {values['partial_rotary_factor']}")
    return Gemma4Rope(rope_type, float(theta), float(values["partial_rotary_factor"]), float(values["factor"]))


def check_heads(kind: str, att: Gemma4Attention, heads: int, source: str) -> None:
    if heads % att.num_kv_heads:
        raise DFlashError(f"{source}: num_attention_heads {heads} is not a multiple of the {kind} layers' "
                          f"{att.num_kv_heads} key/value heads")
    if att.head_dim % 2:
        raise DFlashError(f"{source}: the {kind} layers' head_dim must be even for RoPE, got {att.head_dim}")


def check_sharing(cfg: Gemma4Config, types: tuple[str, ...], source: str) -> None:
    """Every shared layer has an earlier unshared layer of its type to read (Gemma4TextConfig.kv_sharing_modes
    raises otherwise)."""
    first = len(types) - cfg.kv_shared_layers
    if first < 1:
        raise DFlashError(f"{source}: num_kv_shared_layers {cfg.kv_shared_layers} leaves no layer computing K/V "
                          f"(num_hidden_layers {len(types)})")
    missing = sorted({t for t in types[first:]} - set(types[:first]))
    if missing:
        raise DFlashError(f"{source}: num_kv_shared_layers {cfg.kv_shared_layers} shares {missing[0]} layers but "
                          f"no layer before layer {first} is one")


def _flag(data: dict[str, Any], key: str, source: str) -> bool:
    value = data.get(key) or False
    if not isinstance(value, bool):
        raise DFlashError(f"{source}: field '{key}' must be bool, got {value!r}")
    return value


def _count(data: dict[str, Any], key: str, source: str) -> int:
    value = data.get(key) or 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise DFlashError(f"{source}: field '{key}' must be a non-negative int, got {value!r}")
    return value


def _cap(value: Any, source: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise DFlashError(f"{source}: field 'final_logit_softcapping' must be a positive number, got {value!r}")
    return float(value)
