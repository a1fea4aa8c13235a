"""The EAGLE-3 baseline: a one-layer autoregressive drafter run k times a step, costed from the same database.

Its shape is the user's (`--eagle3 DIR`: its config.json, Hugging Face's LlamaForCausalLMEagle3 layout or
speculators' `transformer_layer_config`), its acceptance too (`--eagle3-acceptance` or `--eagle3-tau`): the plan
knows no EAGLE-3 acceptance of its own. A step at batch b and draft length k, as TensorRT-LLM's one-model worker
runs it (tensorrt_llm/_torch/speculative/eagle3.py, Eagle3OneModelWorker.forward, NVIDIA/TensorRT-LLM@001e670):
- verify: the target over k + 1 tokens a request, exactly as DFlash's (step.StepModel.verify);
- draft pass 1 over all b(k + 1) verified tokens: `apply_eagle3_fc` (3 captured target layers -> H), the
  embedding, the layer (its QKV reads [embedding; hidden], 2H), the lm_head over the draft vocabulary at the
  b gathered rows (the accepted position), argmax;
- draft passes 2..k over b tokens each: the layer on the drafter's own hidden state (no fc), lm_head, argmax;
- the capture of the 3 target layers' hidden states at the verified tokens, and the verify's argmax at its k
  extra slots.
Attention follows --verify-attention as DFlash's does (pass 1 reads the KV per query or per request).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ...utils.errors import DFlashError
from . import aic
from .step import StepCost, StepModel

BF16 = 2


@dataclass(frozen=True)
class Eagle3Drafter:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    draft_vocab_size: int
    num_hidden_layers: int
    capture_layers: int  # target layers fused by fc (EAGLE-3: 3)
    source: str

    def params(self, target_hidden: int) -> int:
        """fc + layers (QKV over 2H) + final norm + lm_head; the embedding is the target's."""
        h, hd = self.hidden_size, self.head_dim
        attn = 2 * h * (self.num_attention_heads + 2 * self.num_key_value_heads) * hd + self.num_attention_heads * hd * h
        layer = attn + 3 * h * self.intermediate_size + 3 * h
        return self.capture_layers * target_hidden * h + self.num_hidden_layers * layer + h + self.draft_vocab_size * h


def read_eagle3(where: str) -> Eagle3Drafter:
    """An EAGLE-3 drafter's config.json (a directory or the file); errors name the file and the field."""
    path = Path(where)
    path = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DFlashError(f"--eagle3 {where!r}: no config.json there") from None
    except (OSError, ValueError) as exc:
        raise DFlashError(f"--eagle3 {path}: not a JSON config ({exc})") from None
    layer = data.get("transformer_layer_config") or data  # speculators nests the layer's fields
    try:
        heads = int(layer["num_attention_heads"])
        h = int(layer["hidden_size"])
        ids = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0]
        return Eagle3Drafter(h, int(layer["intermediate_size"]), heads, int(layer.get("num_key_value_heads", heads)),
                             int(layer.get("head_dim") or h // heads),
                             int(data.get("draft_vocab_size") or layer.get("draft_vocab_size") or layer["vocab_size"]),
                             int(layer.get("num_hidden_layers", 1)), len(ids), str(path))
    except KeyError as exc:
        raise DFlashError(f"--eagle3 {path}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise DFlashError(f"--eagle3 {path}: bad field value ({exc})") from None


def layer_ops(d: Eagle3Drafter, tp: int, kv_quant, first: bool) -> list:
    """One pass of the drafter's layers (llama.py's generation ops; QKV over [embedding; hidden] = 2H)."""
    s = aic.sdk()
    o, bf16, h, n = s.ops, s.common.GEMMQuantMode.bfloat16, d.hidden_size, d.num_hidden_layers
    heads, kv, hd = d.num_attention_heads // tp, math.ceil(d.num_key_value_heads / tp), d.head_dim
    prefix = "eagle3_pass1" if first else "eagle3_pass"
    return [o.ElementWise(f"{prefix}_norms", n, 4 * h, 2 * h, 0.8),
            o.GEMM(f"{prefix}_qkv_gemm", n, (heads + 2 * kv) * hd, 2 * h, bf16),
            o.GenerationAttention(f"{prefix}_attention", n, heads, kv, kv_quant, head_size=hd),
            o.GEMM(f"{prefix}_proj_gemm", n, h, heads * hd, bf16),
            o.ElementWise(f"{prefix}_add_norm_2", n, 2 * h, 2 * h, 0.8),
            o.GEMM(f"{prefix}_gate_ffn1_gemm", n, 2 * d.intermediate_size // tp, h, bf16),
            o.ElementWise(f"{prefix}_act_gate", n, 2 * d.intermediate_size // tp, d.intermediate_size // tp, 0.8),
            o.GEMM(f"{prefix}_ffn2_gemm", n, h, d.intermediate_size // tp, bf16),
            o.CustomAllReduce(f"{prefix}_ar_1", n, h, tp), o.CustomAllReduce(f"{prefix}_ar_2", n, h, tp)]


@dataclass
class Eagle3Steps:
    """EAGLE-3 steps on the DFlash step model's target layout and database (its verify is shared)."""

    steps: StepModel
    drafter: Eagle3Drafter

    def __post_init__(self):
        s, tp, d = aic.sdk(), self.steps.target.tp, self.drafter
        o, bf16, target_h = s.ops, s.common.GEMMQuantMode.bfloat16, self.steps.target.facts["hidden_size"]
        kv_quant = self.steps.target.model.config.kvcache_quant_mode
        feature = d.capture_layers * target_h
        self.capture = [o.ElementWise("eagle3_capture", 1, feature, feature, 0.8)]
        self.fc = [o.GEMM("eagle3_fc_gemm", 1, d.hidden_size, feature, bf16),
                   o.Embedding("eagle3_embedding", 1, self.steps.target.facts["vocab_size"] // tp, d.hidden_size, 0.3)]
        self.first, self.rest = layer_ops(d, tp, kv_quant, True), layer_ops(d, tp, kv_quant, False)
        self.head = [o.ElementWise("eagle3_final_norm", 1, d.hidden_size, d.hidden_size, 0.8),
                     o.GEMM("eagle3_logits_gemm", 1, d.draft_vocab_size // tp, d.hidden_size, bf16),
                     o.ElementWise("eagle3_sampling", 1, d.draft_vocab_size // tp, 1, 0.8)]
        self.verify_sampling = [o.ElementWise("spec_sampling", 1, self.steps.target.facts["vocab_size"] // tp, 1, 0.8)]

    def pass_ms(self, ops: list, rows: int, reads: int, s_ctx: int) -> list:
        """A layer pass over `rows` tokens whose attention makes `reads` KV reads of `s_ctx` keys."""
        attention = [op for op in ops if op._name.endswith("_attention")]
        rest = [op for op in ops if op not in attention]
        return (aic.evaluate_ops(self.steps.database, rest, rows, s_ctx)
                + aic.evaluate_ops(self.steps.database, attention, reads, s_ctx))

    def cost(self, batch: int, k: int) -> StepCost:
        verify, sources = self.steps.verify(batch, k)
        flagged = {f"target:{name}": src for name, src in sources.items() if src != "silicon"}
        if k == 0:
            return StepCost(verify, 0.0, 0.0, 0.0, flagged)
        db, block, s_mid = self.steps.database, batch * (k + 1), self.steps.s_mid
        reads = block if self.steps.verify_attention == "per-query" else batch
        draft = aic.evaluate_ops(db, self.fc, block, s_mid) + self.pass_ms(self.first, block, reads, s_mid + k + 1)
        draft += aic.evaluate_ops(db, self.head, batch, s_mid)
        for i in range(1, k):
            draft += self.pass_ms(self.rest, batch, batch, s_mid + i) + aic.evaluate_ops(db, self.head, batch, s_mid)
        capture = aic.evaluate_ops(db, self.capture, block, s_mid)
        sample = aic.evaluate_ops(db, self.verify_sampling, batch * k, s_mid)
        for name, _ms, src in draft + capture + sample:
            if src not in ("silicon", "none"):
                flagged[name] = src
        total = lambda rows: sum(ms for _n, ms, _s in rows)
        return StepCost(verify, total(draft), total(capture), total(sample), flagged)

    def prefill_extra_ms(self, batch: int) -> float:
        """Added to TTFT: capture, fc and the layer's GEMMs over the batch's prompts (the drafter's attention over
        the prompt is left out, as DFlash's context-KV prefill leaves none)."""
        ops = self.capture + self.fc + [op for op in self.first if not op._name.endswith("_attention")]
        rows = batch * self.steps.isl
        return sum(ms for _n, ms, _s in aic.evaluate_ops(self.steps.database, ops, rows, self.steps.isl))

    def extra_gib(self, batch: int, max_seq_len: int) -> float:
        """GiB per GPU: the drafter's weights (bf16, split over TP) and its layers' KV cache for the batch."""
        d, tp = self.drafter, self.steps.target.tp
        weights = d.params(self.steps.target.facts["hidden_size"]) * BF16 / tp
        kv = d.num_hidden_layers * 2 * math.ceil(d.num_key_value_heads / tp) * d.head_dim * BF16 * batch * max_seq_len
        return (weights + kv) / (1 << 30)
