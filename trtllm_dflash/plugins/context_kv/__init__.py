"""Context KV precompute: hidden_norm(fc(features)) -> every draft layer's K/V -> k_norm, RoPE -> cache."""

from .spec import ContextKVWeights, context_kv_weights

__all__ = ["ContextKVWeights", "context_kv_weights"]
