"""KV-cache block reuse for a `trtllm` DFlash engine: off unless asked for, and then only where TensorRT-LLM keeps
the drafter fed.

- DFlash captures the drafter's context only for tokens computed in the current target forward, so a reused
  prefix never reaches the drafter and acceptance drops on cached prefixes; upstream's DFlash accuracy test sets
  kv_cache_config.enable_block_reuse false (NVIDIA/TensorRT-LLM@58ae162a). Reuse stays off by default.
- From 1.4.0rc1 `speculative_config.context_recompute_tail` (API reference 1.4.0rc1, DFlashDecodingConfig) caps
  the reused part of a cache hit at floor_block(prompt_len - tail) tokens, so at least `tail` prompt tokens run
  through the target forward and reach the drafter; 0 means no cap, a negative tail a full re-prefill
  (tests/unittest/_torch/executor/kv_cache/test_spec_recompute_tail.py@bcb51f08). There the V1 KV-cache manager
  rewinds instead of capping, and only with enable_chunked_prefill and no sliding-window layer
  (TestV1WindowedLayerGate): so `--prefix-reuse TAIL` turns chunked prefill on too, and warns for a sliding-window
  target.
"""

from __future__ import annotations

from ...utils.errors import DFlashError

RECOMPUTE_TAIL = ("DFlashDecodingConfig", "context_recompute_tail")
SET_BY_FLAG = ("kv_cache_config.enable_block_reuse", "speculative_config.context_recompute_tail")


def check_prefix_reuse(tail, table) -> None:
    """Refuse a tail that is not a positive token count, or one the chosen TensorRT-LLM release cannot honour."""
    if tail is None:
        return
    if not isinstance(tail, int) or isinstance(tail, bool) or tail < 1:
        raise DFlashError(f"build spec: 'prefix_reuse' must be a positive number of prompt tokens to recompute, "
                          f"got {tail!r}")
    if not table.has_field(*RECOMPUTE_TAIL):
        raise DFlashError(f"--prefix-reuse needs speculative_config.context_recompute_tail (TensorRT-LLM 1.4.0rc1 "
                          f"and newer); the {table.label} has none: pass --trtllm-version 1.4.0rc1 or newer, or "
                          "leave block reuse off")


def reuse_options(tail: int | None, user: dict) -> dict:
    """The options `--prefix-reuse TAIL` sets (block reuse, the recomputed tail, chunked prefill), or reuse off."""
    if tail is None:
        return {"kv_cache_config": {"enable_block_reuse": False}}
    for key in SET_BY_FLAG:
        section, name = key.split(".")
        if name in (user.get(section) or {}):
            raise DFlashError(f"llm_options: '{key}' is set by the build (--prefix-reuse), not by a pass-through "
                              "option")
    return {"kv_cache_config": {"enable_block_reuse": True}, "speculative_config": {"context_recompute_tail": tail},
            "enable_chunked_prefill": True}


def reuse_warning(options: dict, windowed: bool) -> str:
    """What the written options mean for the drafter's context on a cache hit, when it is not what one expects."""
    reuse = (options.get("kv_cache_config") or {}).get("enable_block_reuse") is True
    tail = (options.get("speculative_config") or {}).get("context_recompute_tail") or 0
    if reuse and tail == 0:
        return ("kv_cache_config.enable_block_reuse is on: a reused prefix never reaches the DFlash drafter's context "
                "(upstream's DFlash test turns reuse off), so acceptance drops on cached prefixes; --prefix-reuse "
                "TAIL (TensorRT-LLM >= 1.4.0rc1) recomputes the drafter's context for the last TAIL prompt tokens")
    if tail and not reuse:
        return "speculative_config.context_recompute_tail has no effect: kv_cache_config.enable_block_reuse is off"
    if reuse and not options.get("enable_chunked_prefill"):
        return ("context_recompute_tail without enable_chunked_prefill: TensorRT-LLM's V1 KV-cache manager then drops "
                "the tail, so reused prefixes may starve the drafter (--prefix-reuse sets both)")
    if reuse and windowed:
        return ("the target has sliding-window layers: TensorRT-LLM's V1 KV-cache manager then drops "
                "context_recompute_tail (only the V2 manager caps a cache hit for them), so reused prefixes may "
                "starve the drafter")
    return ""
