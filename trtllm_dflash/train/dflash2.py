"""DFlash2's training additions: its config fields, its initialisation, the selector's K-way objective.

As speculators 0.9.0 trains a DFlash2 drafter:
- Initialisation (`speculators/models/dflash2/core.py:51-70`, `model_definitions.py:138-143, 264-266`): every
  convolution the identity (the drafter starts as the DFlash drafter it wraps); the selector's predecessor and
  successor codebooks and its hidden projection N(0, initializer_range), the target's initializer_range.
- Objective (`core.py:167-200`, `metrics.py:31-62, 76-112, 149-159`): unary loss + alpha x selector loss, alpha 1
  (`selector_loss_alpha`, core.py:120). The selector's candidates are the unary top-K (indices only, no gradient);
  where the gold token is missing it replaces the K-th candidate, for the loss only; the selector loss is the
  cross-entropy of the K scores against the gold's rank, teacher-forced (slot k's predecessor is the gold token at
  slot k - 1, the anchor at slot 1: core.py:124-135), with the same per-slot decay as the unary loss. Here the
  unary loss is DFlash's (train/objective.py: cross-entropy on the target's greedy continuation); speculators'
  default is the KL divergence to the verifier's logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config.dflash2 import ARCHITECTURE, DEFAULTS
from ..models.dflash2 import CandidateSelector

METHODS = ("dflash", "dflash2")
SELECTOR_LOSS_ALPHA = 1.0  # speculators core.py:120 default
INITIALIZER_RANGE = 0.02  # when the target's config.json has none (speculators core.py:61-63)


def config_fields(config: dict) -> dict:
    """A DFlash drafter's config.json -> DFlash2's, in z-lab's layout (the fields in dflash_config, their defaults)."""
    return {**config, "architectures": [ARCHITECTURE], "dflash_config": {**config["dflash_config"], **DEFAULTS}}


def initialise(drafter, initializer_range: float) -> None:
    """A fresh DFlash2 drafter as speculators makes it: identity convolutions, N(0, range) selector."""
    for layer in drafter.layers:
        layer.attention_conv.reset_parameters()
        layer.mlp_conv.reset_parameters()
    drafter.candidate_selector.reset_parameters(initializer_range)


def training_candidates(unary: torch.Tensor, gold: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """unary: [..., V] logits; gold: [...] ids -> (candidates [..., K]: the unary top-K with the gold in place of
    the K-th where it is missing; the gold's rank [...])."""
    candidates = unary.detach().topk(top_k, dim=-1).indices
    hit = candidates == gold[..., None]
    present = hit.any(-1)
    candidates[..., -1] = torch.where(present, candidates[..., -1], gold)
    return candidates, torch.where(present, hit.long().argmax(-1), top_k - 1)


def selector_ce(selector: CandidateSelector, logits: torch.Tensor, hidden: torch.Tensor,
                tokens: torch.Tensor) -> torch.Tensor:
    """logits: [N, A, B-1, V] unary logits of slots 1..B-1; hidden: [N, A, B-1, H] their final-normed states;
    tokens: [N, A, B] the blocks' gold tokens (slot 0 the anchor) -> [N, A, B-1] teacher-forced K-way CE."""
    gold, prev = tokens[..., 1:], tokens[..., :-1]
    candidates, rank = training_candidates(logits, gold, selector.top_k)
    scores = selector.score(logits, hidden, prev, candidates)  # [N, A, B-1, K]
    return F.cross_entropy(scores.flatten(0, -2), rank.flatten(), reduction="none").view(gold.shape)
