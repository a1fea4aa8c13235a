"""DFlash2: DFlash's block pass, then the candidate selector walks the block left to right.

At each drafted slot j the drafter's unary logits z_j give K candidates (top-K, sorted), each scored
s_j[c] = z_j[c] + <P[prev] * W_h h_j, S[c]> (speculators 0.9.0 `speculators/models/dflash2/model_definitions.py`
:268-299, `CandidateSelector.score_candidates`), prev = the token drafted at slot j - 1 (the anchor at slot 1).
speculators only scores (its training forward teacher-forces the predecessors, `dflash2/core.py:124-135`); the walk
follows vLLM's DFlash2 speculator (vllm-project/vllm@030da624 `vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py`
`_selector_walk_kernel`): a greedy row takes the first index of the best score, a sampled row draws from
softmax(s_j / T) (temperature only; top-k / top-p are the target's business) and the drawn token is the next
predecessor. The draft distribution q_j is that softmax on the K candidates and zero elsewhere: exactly what the
draft was drawn from, so rejection sampling (accept.py) stays lossless. Scores are fp32 (TensorRT-LLM's
`dflash2_score_edges` computes them so: bf16 rounding moves candidate argmaxes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.dflash2 import CandidateSelector
from ..sample.sampling import PROPOSE, SamplingBatch, sample, uniforms
from .base import StepBatch
from .dflash import DFlashProposer


class DFlash2Proposer(DFlashProposer):
    """DFlashProposer's context cache and block pass; the drafts are the selector's walk."""

    def propose(self, batch: StepBatch, num_drafts: int):
        hidden = self.draft_block(batch, num_drafts)[:, 1:num_drafts + 1]  # slot k drafts the token at slot k
        logits = self.drafter.logits(hidden, self.target.lm_head)  # [B, n, V] fp32, gathered over ranks
        return walk(self.drafter.candidate_selector, logits, hidden, batch.anchors, batch.sampling)


def walk(selector: CandidateSelector, logits: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor,
         sampling: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [B, n, V] fp32; hidden: [B, n, H] the drafter's final-normed states; anchors: [B] long -> drafts
    [B, n] long and q [B, n, V] (None when every row is greedy). n small sequential steps on [B, K]: no host sync."""
    n = logits.shape[1]
    if n == 0:
        return anchors.new_zeros((len(anchors), 0)), None
    unary, candidates = logits.topk(selector.top_k, dim=-1)  # [B, n, K], sorted descending
    projected = selector.hidden_projection(hidden).float()  # [B, n, r]
    # codebook rows by embedding lookup: 4x faster than advanced indexing on the CPU (13 vs 50 us a [1, 15, 16]
    # lookup in a [2048, 256] codebook, one thread)
    successors = F.embedding(candidates, selector.successor_codebook).float()  # [B, n, K, r]
    codebook = selector.predecessor_codebook
    if sampling.all_greedy:
        return greedy_walk(codebook, unary, candidates, projected, successors, anchors), None
    u = uniforms(sampling, PROPOSE, n)  # [B, n]
    greedy = (sampling.temperature == 0)[:, None]  # [B, 1]: rows that take the best candidate
    temperature = torch.where(greedy, 1.0, sampling.temperature[:, None])
    prev, drafts, probs = anchors, [], []
    for j in range(n):
        context = F.embedding(prev, codebook).float() * projected[:, j]  # [B, r]
        scores = unary[:, j] + (context[:, None, :] * successors[:, j]).sum(-1)  # [B, K]
        p = torch.softmax(scores / temperature, dim=-1)
        if sampling.any_greedy:
            best = torch.nn.functional.one_hot(scores.argmax(-1), scores.shape[-1]).to(p.dtype)
            p = torch.where(greedy, best, p)
        index = sample(p[:, None], u[:, j:j + 1])[:, 0]
        probs.append(p)
        prev = candidates[:, j].gather(-1, index[:, None])[:, 0]  # [B]
        drafts.append(prev)
    return torch.stack(drafts, dim=1), torch.zeros_like(logits).scatter_(-1, candidates, torch.stack(probs, dim=1))

def greedy_walk(codebook: torch.Tensor, unary: torch.Tensor, candidates: torch.Tensor, projected: torch.Tensor,
                successors: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """The greedy walk with every slot's scores computed at once: slot j's predecessor is one of slot j - 1's K
    candidates (the anchor at slot 0), so the best candidate for each of them is one batched product, and the walk
    only follows indices. unary, candidates: [B, n, K]; projected: [B, n, r]; successors: [B, n, K, r] -> [B, n]."""
    b, n, k = candidates.shape
    prev = torch.cat([anchors[:, None, None].expand(b, 1, k), candidates[:, :-1]], dim=1)  # [B, n, K]
    context = F.embedding(prev, codebook).float() * projected[:, :, None, :]  # [B, n, K prev, r]
    scores = unary[:, :, None, :] + context @ successors.transpose(-1, -2)  # [B, n, K prev, K]
    best = scores.argmax(-1)  # [B, n, K prev]: the first best candidate after each predecessor
    index, chosen = anchors.new_zeros((b, 1)), []  # slot 0: every predecessor row is the anchor's
    for j in range(n):
        index = best[:, j].gather(-1, index)
        chosen.append(index)
    return candidates.gather(-1, torch.cat(chosen, dim=1)[..., None])[..., 0]
