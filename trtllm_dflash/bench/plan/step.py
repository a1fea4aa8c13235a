"""What one DFlash decode step costs at batch b and draft length k, from AIConfigurator's silicon data.

A step (dflash.md, "Generation loop"; TensorRT-LLM's DFlash worker) runs, per request:
- verify: the target over k + 1 tokens (the anchor and k drafts): `aic.decode_step` at b(k + 1) queries. Its
  attention either as b(k + 1) decode queries each reading its request's KV (VERIFY_ATTENTION "per-query",
  AIConfigurator's MTP convention, the default: an upper bound), or as one KV read per request ("per-request":
  the decode attention of b queries, a lower bound; TensorRT-LLM's multi-token decode kernels lie between);
  the drafter's attention follows the same choice;
- draft: the drafter over its block of k + 1 tokens, every layer's GEMMs, non-causal attention over the injected
  context and the block, the target's embedding of the block and its lm_head over the k drafted slots;
- context KV: the `fc` fusion of the captured target hidden states and every drafter layer's K/V projection of the
  tokens the step accepted (E[tokens | k] a request; stored once, not recomputed), and the capture itself;
- sampling: argmax over the vocabulary at the k extra verify slots and the k drafted slots (plain decoding's one
  slot is in AIConfigurator's own estimate); a DFlash2 drafter's selector replaces the drafted slots' argmax and
  its convolutions join the layers (dflash2.py);
- communication: the drafter layers' two all-reduces at the TP size (AIConfigurator's CustomAllReduce).
Drafter ops are queried op by op at decode shapes (GEMM rows = tokens; attention as decode queries over s keys,
AIConfigurator's convention for MTP's k + 1 verify queries). Sharding follows the target's TP (heads, MLP columns);
`fc` is counted unsharded (the conservative choice: every rank fuses the full context feature).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...config.model import DrafterConfig
from . import aic, dflash2
from .dflash2 import Dflash2Shape

PARTS = ("verify_ms", "draft_ms", "context_kv_ms", "sampling_ms")
VERIFY_ATTENTION = ("per-query", "per-request")


@dataclass(frozen=True)
class StepCost:
    """One step's latency (ms) by part, and the data source of every op that was not measured directly."""

    verify_ms: float
    draft_ms: float
    context_kv_ms: float
    sampling_ms: float
    flagged: dict = field(default_factory=dict)  # op name -> source, for sources other than "silicon"

    @property
    def total_ms(self) -> float:
        return self.verify_ms + self.draft_ms + self.context_kv_ms + self.sampling_ms

    def parts(self) -> dict:
        return {p: round(getattr(self, p), 4) for p in PARTS}


def drafter_layer_ops(d: DrafterConfig, tp: int, kv_quant) -> list:
    """The block pass's ops over all drafter layers (counts = layers), in llama.py's generation_ops shapes."""
    s = aic.sdk()
    o, bf16 = s.ops, s.common.GEMMQuantMode.bfloat16
    h, n, heads, kv = d.hidden_size, d.num_hidden_layers, d.num_attention_heads, math.ceil(d.num_key_value_heads / tp)
    hd, inter = d.head_dim, d.intermediate_size
    return [
        o.ElementWise("drafter_add_norm_1", n, 2 * h, 2 * h, 0.8),
        o.GEMM("drafter_qkv_gemm", n, heads * hd // tp + 2 * kv * hd, h, bf16),
        o.GenerationAttention("drafter_attention", n, heads // tp, kv, kv_quant, head_size=hd, use_qk_norm=True),
        o.GEMM("drafter_proj_gemm", n, h, heads * hd // tp, bf16),
        o.ElementWise("drafter_add_norm_2", n, 2 * h, 2 * h, 0.8),
        o.GEMM("drafter_gate_ffn1_gemm", n, 2 * inter // tp, h, bf16),
        o.ElementWise("drafter_act_gate", n, 2 * inter // tp, inter // tp, 0.8),
        o.GEMM("drafter_ffn2_gemm", n, h, inter // tp, bf16),
        o.CustomAllReduce("drafter_ar_1", n, h, tp),
        o.CustomAllReduce("drafter_ar_2", n, h, tp),
    ]


def drafter_io_ops(d: DrafterConfig, vocab: int, tp: int) -> tuple[list, list]:
    """(block embedding, final norm + lm_head over the drafted slots): the target's tables, the drafter's rows."""
    s = aic.sdk()
    o, h = s.ops, d.hidden_size
    embed = [o.Embedding("drafter_embedding", 1, vocab // tp, h, 0.3)]
    head = [o.ElementWise("drafter_final_norm", 1, h, h, 0.8),
            o.GEMM("drafter_logits_gemm", 1, vocab // tp, h, s.common.GEMMQuantMode.bfloat16)]
    return embed, head


def context_kv_ops(d: DrafterConfig, tp: int) -> list:
    """Per accepted token: capture, fc fusion (unsharded), hidden_norm, stacked K/V of every layer, k_norm + RoPE."""
    s = aic.sdk()
    o, h, n = s.ops, d.hidden_size, d.num_hidden_layers
    feature = len(d.target_layer_ids) * h
    kv_cols = n * 2 * math.ceil(d.num_key_value_heads / tp) * d.head_dim
    return [o.ElementWise("ctx_capture", 1, feature, feature, 0.8),
            o.GEMM("ctx_fc_gemm", 1, h, feature, s.common.GEMMQuantMode.bfloat16),
            o.ElementWise("ctx_hidden_norm", 1, h, h, 0.8),
            o.GEMM("ctx_kv_gemm", 1, kv_cols, h, s.common.GEMMQuantMode.bfloat16),
            o.ElementWise("ctx_k_norm_rope", 1, kv_cols // 2, kv_cols // 2, 0.8)]


def sampling_ops(vocab: int, tp: int) -> list:
    """Argmax reads a row of vocab / tp logits per slot (an element-wise pass, dim_out 1)."""
    return [aic.sdk().ops.ElementWise("spec_sampling", 1, vocab // tp, 1, 0.8)]


@dataclass
class StepModel:
    """Costs DFlash steps of one target layout and drafter against one database."""

    target: aic.TargetModel
    drafter: DrafterConfig
    database: aic.Database
    isl: int
    osl: int
    verify_attention: str = "per-query"
    dflash2: Dflash2Shape | None = None  # a DFlash2 drafter's extra shape (dflash2.py); None: DFlash

    def __post_init__(self):
        tp, vocab = self.target.tp, self.target.facts["vocab_size"]
        kv_quant = self.target.model.config.kvcache_quant_mode
        layer_ops = drafter_layer_ops(self.drafter, tp, kv_quant)
        if self.dflash2:
            layer_ops += dflash2.conv_ops(self.drafter, self.dflash2)
        self.selector_ops = dflash2.selector_ops(self.drafter, self.dflash2, vocab, tp) if self.dflash2 else []
        self.attention_ops = [op for op in layer_ops if op._name == "drafter_attention"]
        self.layer_ops = [op for op in layer_ops if op._name != "drafter_attention"]
        self.embed_ops, self.head_ops = drafter_io_ops(self.drafter, vocab, tp)
        self.ctx_ops = context_kv_ops(self.drafter, tp)
        self.sample_ops = sampling_ops(vocab, tp)
        self.s_mid = self.isl + self.osl // 2 + 1  # aic: the context of the mean decode step (rust_engine_step.py)
        self._steps: dict[int, aic.DecodeStep] = {}  # decode queries -> step: b(k + 1) repeats across (b, k)

    def decode(self, queries: int) -> aic.DecodeStep:
        if queries not in self._steps:
            self._steps[queries] = aic.decode_step(self.target, self.database, queries, self.isl, self.osl)
        return self._steps[queries]

    def verify(self, batch: int, k: int) -> tuple[float, dict]:
        """(ms, op sources) of the target's pass over b(k + 1) tokens."""
        step = self.decode(batch * (k + 1))
        if self.verify_attention == "per-query" or k == 0:
            return step.total_ms, step.sources
        return step.total_ms - step.attention_ms + self.decode(batch).attention_ms, step.sources

    def cost(self, batch: int, k: int, tokens_per_step: float) -> StepCost:
        verify, sources = self.verify(batch, k)
        flagged = {f"target:{name}": src for name, src in sources.items() if src != "silicon"}
        if k == 0:
            return StepCost(verify, 0.0, 0.0, 0.0, flagged)
        db, block = self.database, batch * (k + 1)
        keys = dflash2.attention_keys(self.dflash2, self.s_mid, k)
        draft = aic.evaluate_ops(db, self.embed_ops + self.layer_ops, block, keys)
        reads = block if self.verify_attention == "per-query" else batch  # KV reads, as for the verify
        draft += aic.evaluate_ops(db, self.attention_ops, reads, keys)
        draft += aic.evaluate_ops(db, self.head_ops + self.selector_ops, batch * k, self.s_mid)
        ctx = aic.evaluate_ops(db, self.ctx_ops, batch * tokens_per_step, self.s_mid)
        # argmax at the verify's k extra slots, and at the k drafted ones unless DFlash2's selector picks them
        sample = aic.evaluate_ops(db, self.sample_ops, (1 if self.dflash2 else 2) * batch * k, self.s_mid)
        for name, _ms, src in draft + ctx + sample:
            if src not in ("silicon", "none"):
                flagged[name] = src
        total = lambda rows: sum(ms for _n, ms, _s in rows)
        return StepCost(verify, total(draft), total(ctx), total(sample), flagged)

    def prefill_extra_ms(self, batch: int) -> float:
        """The drafter's context KV for the prompt: the ctx ops over batch x isl tokens, added to TTFT."""
        return sum(ms for _n, ms, _s in aic.evaluate_ops(self.database, self.ctx_ops, batch * self.isl, self.isl))
