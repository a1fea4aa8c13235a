"""DFlash2 drafters in the plan: the method read from config.json, and what a DFlash2 step adds to DFlash's.

The plan reads the few DFlash2 fields it costs here, on its own (the runtime's config classes do not take
DFlash2): z-lab's layout (`architectures: ["DFlash2DraftModel"]`, the fields in `dflash_config`) or speculators'
(`speculators_model_type: "dflash2"`, speculators 0.9.0 speculators/models/dflash2/config.py
DFlash2SpeculatorConfig, defaults conv_kernel_size 2, conv_group_size 16, selector_rank 256, selector_top_k 16).
Everything else is v1's drafter and is parsed as one.

A DFlash2 block pass adds, to v1's (speculators 0.9.0 speculators/models/dflash2/model_definitions.py):
- per layer two GroupedDynamicCausalConv (around attention and around the MLP), each a `kernel_projection`
  GEMM H -> 2 k H / g a token and two grouped convolutions (`prepare` on the sublayer's input, `finish` on its
  output), each reading k taps of H channels and k H / g dynamic coefficients and writing H;
- the candidate selector at each drafted position: top-K over the lm_head's logits (V / tp a rank),
  `hidden_projection` H -> r, and K scores from predecessor_codebook[prev] (r) x hp (r) against
  successor_codebook[candidates] (K x r); it replaces v1's argmax over the drafted slots.
GEMMs are AIConfigurator GEMM ops (its measured tables); the convolutions, top-K and scoring are ElementWise ops,
which AIConfigurator costs from memory bandwidth, bytes in and out over the GPU's bandwidth at an efficiency
(aiconfigurator_core/sdk/operations/elementwise.py: "latency derived analytically from mem_bw"; its models pass
0.8, e.g. models/llama.py's add_norm ops). The convolutions and the selector are counted unsharded across TP
ranks (each rank runs them on the replicated hidden state), as `fc` is. Non-causal sliding-window attention
(`use_sliding_window`, `sliding_window` W) limits the drafter's keys to W - 1 before a query plus the block.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...checkpoint.speculators import is_speculators, to_zlab
from ...config.model import DrafterConfig
from ...utils.errors import DFlashError
from . import aic

ARCHITECTURE = "DFlash2DraftModel"
DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}
SPECULATORS_ONLY = ("sliding_window_non_causal",)


@dataclass(frozen=True)
class Dflash2Shape:
    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    sliding_window: int | None  # keys a query sees each side; None: full attention

    def extra_params(self, d: DrafterConfig) -> int:
        """Weights DFlash2 adds: per layer 2 convs (base kernels [2, k, H], projection [2 k H / g, H]); the
        selector's hidden_projection [r, H] and its two codebooks [V, r]."""
        h, k = d.hidden_size, self.conv_kernel_size
        conv = 2 * k * h + 2 * k * (h // self.conv_group_size) * h
        return d.num_hidden_layers * 2 * conv + self.selector_rank * h + 2 * d.vocab_size * self.selector_rank


def method(data: dict) -> str:
    """'dflash2' or 'dflash', from a drafter's config.json."""
    if ARCHITECTURE in (data.get("architectures") or []) or data.get("speculators_model_type") == "dflash2":
        return "dflash2"
    return "dflash"


def split(data: dict, source: str) -> tuple[dict, Dflash2Shape | None]:
    """(the config as a v1 DFlash drafter's, in z-lab's layout; the DFlash2 shape, None for v1)."""
    kind = method(data)
    if kind == "dflash" and not is_speculators(data):
        return data, None
    fields = dict(data) if is_speculators(data) else {**data, **(data.get("dflash_config") or {})}
    values = {}
    for key, default in DEFAULTS.items():
        value = fields.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DFlashError(f"{source}: field {key!r} must be a positive int, got {value!r}")
        values[key] = value
    if is_speculators(data):
        v1 = to_zlab({**{k: v for k, v in data.items() if k not in DEFAULTS}, "speculators_model_type": "dflash",
                      "speculators_config": {**(data.get("speculators_config") or {}), "algorithm": "dflash"}}, source)
    else:
        v1 = {**{k: v for k, v in data.items() if k not in DEFAULTS}, "architectures": ["DFlashDraftModel"],
              "dflash_config": {k: v for k, v in (data.get("dflash_config") or {}).items() if k not in DEFAULTS}}
    if kind == "dflash":
        return v1, None
    layer = data.get("transformer_layer_config") or data
    window = layer.get("sliding_window") if layer.get("use_sliding_window") else None
    for key in ("use_sliding_window", "sliding_window", "layer_types", "max_window_layers", "is_causal"):
        v1.pop(key, None)  # the plan costs the window itself; the v1 parser would refuse what it does not run
    v1["dflash_config"] = {k: v for k, v in v1["dflash_config"].items() if k not in ("is_causal", "causal")}
    return v1, Dflash2Shape(**values, sliding_window=int(window) if window else None)


def conv_ops(d: DrafterConfig, shape: Dflash2Shape) -> list:
    """The block pass's convolutions over all layers: 2 convs a layer, each 1 GEMM and 2 convolutions."""
    s = aic.sdk()
    o, h, n, k = s.ops, d.hidden_size, d.num_hidden_layers, shape.conv_kernel_size
    coeffs = k * (h // shape.conv_group_size)  # dynamic coefficients a token, one side
    return [o.GEMM("dflash2_kernel_projection_gemm", 2 * n, 2 * coeffs, h, s.common.GEMMQuantMode.bfloat16),
            o.ElementWise("dflash2_grouped_conv", 4 * n, k * h + coeffs, h, 0.8)]


def selector_ops(d: DrafterConfig, shape: Dflash2Shape, vocab: int, tp: int) -> list:
    """Per drafted position: top-K over the rank's logits, hidden_projection, the K x r scoring."""
    s = aic.sdk()
    o, r, top = s.ops, shape.selector_rank, shape.selector_top_k
    return [o.ElementWise("dflash2_topk", 1, vocab // tp, 2 * top, 0.8),
            o.GEMM("dflash2_hidden_projection_gemm", 1, r, d.hidden_size, s.common.GEMMQuantMode.bfloat16),
            o.ElementWise("dflash2_candidate_scoring", 1, (top + 2) * r, top, 0.8)]


def attention_keys(shape: Dflash2Shape | None, s_ctx: int, k: int) -> int:
    """Keys a drafter query reads: the context and the block, or W - 1 before it plus the block."""
    full = s_ctx + k + 1
    return full if shape is None or shape.sliding_window is None else min(full, shape.sliding_window + k)
