"""Which targets a `trtllm` engine accepts: what TensorRT-LLM's DFlash runs, not what the torch runtime runs.

The torch backend keeps its own list (trtllm_dflash/config/model.py). Here each `model_type` maps to the upstream
architecture and its DFlash status, with the source of that status:
- "supported": upstream's model-feature matrix marks DFlash "Yes" (NVIDIA/TensorRT-LLM@00b6d5a2,
  docs/source/models/supported-models.md).
- "tested": upstream runs DFlash on it (Qwen3-8B, Llama-3.1-8B, Qwen3.5-4B, Qwen3.5-35B-A3B FP8,
  Qwen3.6-35B-A3B NVFP4: upstream's DFlash tests as listed in shared/reference/trtllm-and-triton.md) though the
  matrix does not mark it; the DFlash worker rolls back hybrid (Mamba/Gated DeltaNet) state and collapses mrope
  positions for these (tensorrt_llm/_torch/speculative/dflash.py@58ae162a, update_mamba_states, position_ids).
- "untested": the matrix says DFlash "No", yet the model is a one-engine speculative target that hands
  spec_metadata to every decoder layer, which is how DFlash captures hidden states
  (tensorrt_llm/_torch/models/modeling_qwen3_moe.py@03441af1, Qwen3MoeForCausalLM(SpecDecOneEngineForCausalLM)).
  Built with a warning.
Everything else is refused with one line; the refused families the matrix names are listed with their reason.
Multimodal checkpoints (Qwen3.5 `qwen3_5`, `qwen3_5_moe`) keep the language model's fields under `text_config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...models.registry import read_as_transformers
from ...config.model import DRAFTER_ARCHITECTURE
from ...utils.errors import DFlashError

MATRIX = "supported-models.md@00b6d5a2"
TESTS = "upstream DFlash tests (shared/reference/trtllm-and-triton.md)"
HYBRID = "dflash.py@58ae162a rolls back hybrid state"
UNTESTED = ("one-engine spec-dec target passing spec_metadata to every layer (modeling_qwen3_moe.py@03441af1); "
            f"{MATRIX} DFlash: No")

# model_type -> (upstream architecture, DFlash status, source)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "gpt_oss": ("GptOssForCausalLM", "supported", f"{MATRIX}: DFlash Yes"),
    "qwen3": ("Qwen3ForCausalLM", "tested", f"{TESTS}: Qwen3-8B"),
    "llama": ("LlamaForCausalLM", "tested", f"{TESTS}: Llama-3.1-8B"),
    "qwen3_5": ("Qwen3_5ForConditionalGeneration", "tested", f"{TESTS}: Qwen3.5-4B; {HYBRID}"),
    "qwen3_5_text": ("Qwen3_5ForCausalLM", "tested", f"{TESTS}: Qwen3.5-4B; {HYBRID}"),
    "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", "tested",
                    f"{TESTS}: Qwen3.5-35B-A3B, Qwen3.6-35B-A3B; {HYBRID}; {MATRIX} says No"),
    "qwen3_5_moe_text": ("Qwen3_5MoeForCausalLM", "tested",
                         f"{TESTS}: Qwen3.5-35B-A3B, Qwen3.6-35B-A3B; {HYBRID}; {MATRIX} says No"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "untested", UNTESTED),
    # issue 58 reports upstream's DFlash tests on MiniMax-M2.5 at TP 2 (the test file is not in the stored copies)
    "minimax_m2": ("MiniMaxM2ForCausalLM", "tested", "upstream DFlash tests: MiniMax-M2.5 at TP 2 (issue 58)"),
    "laguna": ("LagunaForCausalLM", "tested", "NVIDIA/TensorRT-LLM PR #15666 (merged): DFlash on Laguna, validated "
                                              "on poolside/Laguna-XS-2.1 with tensorrt-llm 1.3.0rc20"),
}
# families upstream's matrix marks DFlash "No" and no upstream test runs
REFUSED = {"qwen3_next": "Qwen3NextForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
           "deepseek_v32": "DeepseekV32ForCausalLM", "deepseek_v4": "DeepseekV4ForCausalLM",
           "llama4": "Llama4ForConditionalGeneration", "gemma4": "Gemma4ForConditionalGeneration",
           "gemma4_text": "Gemma4ForCausalLM",
           "nemotron_h": "NemotronHForCausalLM", "glm4_moe": "Glm4MoeForCausalLM",
           "kimi_k25": "Kimi_K25ForConditionalGeneration"}  # Kimi-K2.5's language model is DeepseekV3ForCausalLM
NO_KV_LAYER_TYPES = {"linear_attention"}  # Gated DeltaNet layers keep recurrent state, not a KV cache


@dataclass(frozen=True)
class TrtllmTarget:
    """The fields of a target's language model that a trtllm build checks and sizes memory with."""

    model_type: str
    architecture: str
    status: str
    source: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    kv_layers: int  # layers that keep a KV cache
    moe: bool
    windowed: bool = False  # has sliding-window attention layers (reuse.py)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> TrtllmTarget:
        model_type = data.get("model_type")
        if DRAFTER_ARCHITECTURE in (data.get("architectures") or []):
            raise DFlashError(f"{source}: this is a DFlash drafter ({DRAFTER_ARCHITECTURE}), not a target model")
        if model_type in REFUSED:
            raise DFlashError(f"{source}: {REFUSED[model_type]} ({model_type}) has no DFlash in TensorRT-LLM "
                              f"({MATRIX}: DFlash No, and no upstream DFlash test runs it)")
        if model_type not in FAMILIES:
            raise DFlashError(f"{source}: model_type {model_type!r} is not a TensorRT-LLM DFlash target this tool "
                              f"knows (accepted: {', '.join(FAMILIES)})")
        architecture, status, why = FAMILIES[model_type]
        data = read_as_transformers(model_type, data) or data  # class defaults for what the file omits
        text = data["text_config"] if isinstance(data.get("text_config"), dict) else data
        heads = _positive(text, "num_attention_heads", source)
        hidden = _positive(text, "hidden_size", source)
        layers = _positive(text, "num_hidden_layers", source)
        return cls(
            model_type=model_type, architecture=architecture, status=status, source=why,
            vocab_size=_positive(text, "vocab_size", source), hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=_positive(text, "num_key_value_heads", source, heads),
            head_dim=_positive(text, "head_dim", source, hidden // heads),
            max_position_embeddings=_positive(text, "max_position_embeddings", source, 32768),
            kv_layers=_kv_layers(text, layers, model_type.startswith("qwen3_5")),
            moe=any(text.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")),
            windowed="sliding_attention" in (text.get("layer_types") or ()) or bool(text.get("use_sliding_window")))

    def check_tp(self, tp: int) -> None:
        """TensorRT-LLM splits attention heads across ranks (KV heads are replicated when fewer)."""
        if self.num_attention_heads % tp:
            raise DFlashError(f"tensor-parallel size {tp} does not divide the target's num_attention_heads "
                              f"{self.num_attention_heads}")

    def kv_heads_per_rank(self, tp: int) -> int:
        return math.ceil(self.num_key_value_heads / tp)


def _kv_layers(text: dict, layers: int, hybrid: bool) -> int:
    """Layers that keep a KV cache. A hybrid config without `layer_types` has one full-attention layer every
    `full_attention_interval` (default 4: transformers 5.23, Qwen3_5TextConfig / Qwen3_5MoeTextConfig)."""
    kinds = text.get("layer_types")
    if kinds:
        return sum(kind not in NO_KV_LAYER_TYPES for kind in kinds)
    return layers // text.get("full_attention_interval", 4) if hybrid else layers


def _positive(data: dict, key: str, source: str, default: Any = ...) -> int:
    value = data.get(key, default)
    if value is ...:
        raise DFlashError(f"{source}: missing required field '{key}'")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise DFlashError(f"{source}: field '{key}' must be a positive integer, got {value!r}")
    return value
