"""The `speculators` library's DFlash checkpoint format (vllm-project/speculators), both ways.

Rules read from speculators 0.9.0 (PyPI wheel; github.com/vllm-project/speculators):
- `speculators/config.py`: `SpeculatorModelConfig` -> `speculators_model_type`, `speculators_version`,
  `speculators_config` {algorithm, proposal_methods [greedy: speculative_tokens], default_proposal_method,
  verifier {name_or_path, architectures}}.
- `speculators/models/dflash/config.py`: `DFlashSpeculatorConfig` -> `transformer_layer_config` (the draft
  decoder's transformers config), `draft_vocab_size`, `block_size`, `target_hidden_size`,
  `aux_hidden_state_layer_ids`, `mask_token_id`, `sliding_window_non_causal`, `sample_from_anchor`.
- `speculators/convert/dflash/converter.py`: z-lab `target_layer_ids` i <-> `aux_hidden_state_layer_ids` i + 1
  (z-lab reads `hidden_states[i + 1]`; speculators names the hidden-state index); the same shift is in vLLM's
  `update_dflash` (vllm/transformers_utils/configs/speculators/algos.py: target_layer_ids = aux - 1).
- `speculators/models/dflash/core.py` + `model_definitions.py`: every draft layer is a Qwen3-style layer
  (q/k norms, bias-free SwiGLU MLP) whatever `transformer_layer_config.model_type` says; the body tensors
  (`layers.*`, `fc`, `hidden_norm`, `norm`) carry z-lab's names; `embed_tokens`, `verifier_norm` and, with the
  full vocabulary, `lm_head` / `verifier_lm_head` are the verifier's and are dropped on save and re-read from
  the verifier on load. Full-attention layers are always non-causal; sliding layers are causal unless
  `sliding_window_non_causal`. The library's training mask limits a sliding layer's context to the W
  positions before the anchor; this runtime, like vLLM and z-lab, windows each query (q - k < W): the two
  agree while the context is shorter than W - block_size.
- `speculators/models/utils.py` (`flatten_rope_parameters`): per-layer-type `rope_parameters` use the
  `sliding_attention` entry.
- DFlash2 (`speculators/models/dflash2/config.py:13-45`): `speculators_model_type` "dflash2", architectures
  ["DFlash2DraftModel"], `sliding_window_non_causal` true by default, and `conv_kernel_size`, `conv_group_size`,
  `selector_rank`, `selector_top_k` at the top level, which z-lab's layout keeps in `dflash_config` beside
  `block_size` (the released config TensorRT-LLM PR #19159 pins, its
  tests/unittest/_torch/speculative/hw_agnostic/test_dflash2_semantics.py). The library has no DFlash2 converter of
  its own (`speculators/convert/`: dflash, eagle, mtp): its DFlash one is followed. `dflash2/core.py:36-43` refuses
  a reduced draft vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import dflash2
from ..utils.errors import DFlashError

if TYPE_CHECKING:
    from ..config.model import DrafterConfig

SPECULATORS_VERSION = "0.9.0"  # the release whose source the rules above were read from
ALGORITHMS = ("dflash", "dflash2")  # speculators_model_type = the drafter's method (DrafterConfig.method)
# Other speculators_model_type values: why this runtime cannot run them.
OTHER_ALGORITHMS = {
    "dspark": "a DFlash variant whose math differs (a Markov logit-bias head; the anchor slot drafts too)",
    "xpress": "a DFlash variant whose math differs (a causal refiner head resolved by Jacobi passes)",
    "eagle3": "an EAGLE-3 drafter, not DFlash", "peagle": "a parallel EAGLE drafter, not DFlash",
    "mtp": "a multi-token-prediction head, not DFlash",
}
# Tensors a speculators checkpoint may carry that belong to the verifier (the target): not drafter weights.
VERIFIER_OWNED = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight",
                  "t2d", "d2t")
# z-lab keys that are not part of the draft decoder's transformers config (the library's converter strips the
# first five; the rest are DFlash fields this project also reads from z-lab configs).
ZLAB_ONLY_KEYS = ("architectures", "auto_map", "block_size", "dflash_config", "num_target_layers",
                  "target_layer_ids", "mask_token_id", "is_causal")
# z-lab fields with no speculators equivalent: writing them would change the math, so a non-default refuses.
UNREPRESENTABLE = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None}


def is_speculators(config: dict[str, Any]) -> bool:
    """The library marks every checkpoint it writes with `speculators_model_type`."""
    return "speculators_model_type" in config


def to_zlab(config: dict[str, Any], source: str) -> dict[str, Any]:
    """A speculators DFlash config.json -> the same drafter in z-lab's layout; refuses what would run wrong."""
    method = check_algorithm(config, source)
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise DFlashError(f"{source}: field 'transformer_layer_config' must be an object, got {layer!r}")
    check_same_math(config, layer, source)
    out = {**layer, "architectures": ["DFlashDraftModel"], "block_size": config.get("block_size", 8),
           "dflash_config": {"mask_token_id": config["mask_token_id"],
                             "target_layer_ids": [i - 1 for i in aux_layer_ids(config, source)]}}
    if method == "dflash2":  # z-lab's published layout: the block size and the four fields in dflash_config
        out["architectures"] = [dflash2.ARCHITECTURE]
        out["dflash_config"].update(block_size=out.pop("block_size"),
                                    **{k: config.get(k, dflash2.DEFAULTS[k]) for k in dflash2.KEYS})
    if layer.get("mlp_bias"):
        out["mlp_bias"] = False  # the library's layers use a bias-free Qwen3 MLP whatever the config says
    rope = layer.get("rope_parameters")
    if isinstance(rope, dict) and "sliding_attention" in rope:
        out["rope_parameters"] = rope["sliding_attention"]
    if config.get("sliding_window_non_causal") is True:
        out["is_causal"] = False  # full-attention layers are non-causal anyway
    return out


def check_algorithm(config: dict[str, Any], source: str) -> str:
    """-> the drafter's method (speculators_model_type), one of ALGORITHMS."""
    kind = config.get("speculators_model_type")
    if kind not in ALGORITHMS:
        why = OTHER_ALGORITHMS.get(kind, "not a DFlash drafter this project knows")
        raise DFlashError(f"{source}: speculators_model_type {kind!r} is {why}; only 'dflash' and 'dflash2' drafters "
                          "run here")
    algorithm = (config.get("speculators_config") or {}).get("algorithm", kind)
    if algorithm != kind:
        raise DFlashError(f"{source}: field 'speculators_config.algorithm' is {algorithm!r}, expected {kind!r}")
    return kind


def check_same_math(config: dict[str, Any], layer: dict[str, Any], source: str) -> None:
    """Refuse, naming the field, the DFlash options whose drafts this runtime would compute differently."""
    if config.get("sample_from_anchor"):
        raise DFlashError(f"{source}: field 'sample_from_anchor' is true (the anchor slot drafts and every slot "
                          "is shifted by one): a DFlash variant whose math differs")
    vocab, draft_vocab = layer.get("vocab_size"), config.get("draft_vocab_size", layer.get("vocab_size"))
    if draft_vocab != vocab:
        raise DFlashError(f"{source}: field 'draft_vocab_size' {draft_vocab} != transformer_layer_config.vocab_size "
                          f"{vocab}: a pruned draft vocabulary (own LM head and d2t map) is not supported")
    hidden, target_hidden = layer.get("hidden_size"), config.get("target_hidden_size")
    if target_hidden is not None and target_hidden != hidden:
        raise DFlashError(f"{source}: field 'target_hidden_size' {target_hidden} != the drafter's hidden_size "
                          f"{hidden}: DFlash here needs the target's hidden size")
    mask = config.get("mask_token_id")
    if not isinstance(mask, int) or isinstance(mask, bool):
        raise DFlashError(f"{source}: field 'mask_token_id' must be an int, got {mask!r}")


def aux_layer_ids(config: dict[str, Any], source: str) -> list[int]:
    ids = config.get("aux_hidden_state_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DFlashError(f"{source}: field 'aux_hidden_state_layer_ids' must be a non-empty list of ints, got {ids!r}")
    if min(ids) < 1:
        raise DFlashError(f"{source}: field 'aux_hidden_state_layer_ids' {ids} holds {min(ids)}: id 0 is the "
                          "embedding output, which DFlash here does not capture (ids start at 1)")
    return ids


def from_zlab(layout: dict[str, Any], drafter: DrafterConfig, verifier: str,
              verifier_architectures: list[str]) -> dict[str, Any]:
    """z-lab layout + its resolved DrafterConfig -> the speculators DFlash config.json the library writes."""
    for key, default in UNREPRESENTABLE.items():
        if getattr(drafter, key) != default:
            raise DFlashError(f"drafter field '{key}' is {getattr(drafter, key)!r}: the speculators format has no "
                              "such field, so it cannot hold this drafter")
    layer = {k: v for k, v in layout.items() if k not in ZLAB_ONLY_KEYS and k not in UNREPRESENTABLE}
    layer.setdefault("model_type", "qwen3")
    method, second = drafter.method, drafter.dflash2
    return {
        "architectures": [dflash2.ARCHITECTURE if second else "DFlashDraftModel"],
        "speculators_model_type": method,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": method,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": drafter.block_size - 1,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": drafter.vocab_size,
        "block_size": drafter.block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in drafter.target_layer_ids],
        "mask_token_id": drafter.mask_token_id,
        "sliding_window_non_causal": sliding_non_causal(drafter),
        "sample_from_anchor": False,
        "tie_word_embeddings": False,
        **({k: getattr(second, k) for k in dflash2.KEYS} if second else {}),
    }


def sliding_non_causal(drafter: DrafterConfig) -> bool:
    """speculators' one causality switch; refuses z-lab settings it cannot express (a causal full layer). An
    `is_causal: false` drafter without sliding layers says true too, so the way back writes `is_causal` again."""
    if drafter.is_causal and "full_attention" in drafter.layer_types:
        raise DFlashError("drafter field 'is_causal' is true: the speculators format has causal attention only for "
                          "sliding-window layers, so it cannot hold this drafter")
    return drafter.is_causal is False
