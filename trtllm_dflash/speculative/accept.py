"""Verification: how many drafts the target accepts, and the token it adds."""

from __future__ import annotations

import torch

from ..sample.sampling import ACCEPT, BONUS, SamplingBatch, sample, token_probs, uniforms


def accept(drafts: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
           sampling: SamplingBatch, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al.; Chen et al.): lossless for any proposal.

    drafts: [B, K-1]; draft_probs q: [B, K-1, V] (None when all rows are greedy); target_logits:
    [B, K, V] at the block's K positions, turned into p by each row's sampling settings. Draft k is
    accepted with probability min(1, p_k(d_k) / q_k(d_k)); at the first rejection the token is
    drawn from normalise(max(0, p_k - q_k)); if all are accepted the bonus is drawn from p_{K-1}.
    Every emitted token is then distributed as the target's sampling. Greedy rows have one-hot p
    and q, which makes this exactly "accept while draft == argmax". All on the logits' device.
    lengths: [B] long, each row's own draft length L_b <= K-1 (None: every row drafted K-1): drafts past
    it are padding, never accepted, and a row that accepts all L_b takes its bonus from p at L_b, exactly
    the rule above for a proposal of L_b drafts (L_b = 0: a plain step's token).
    -> num_accepted [B] long, bonus [B] long.
    """
    if sampling.all_greedy:
        return _accept_greedy(drafts, target_logits, lengths)
    target_probs = token_probs(target_logits, sampling)
    num_drafts = drafts.shape[1]
    if num_drafts == 0:
        return drafts.new_zeros(len(drafts)), sample(target_probs, uniforms(sampling, BONUS, 1))[:, 0]
    p = target_probs[:, :-1].gather(-1, drafts[..., None])[..., 0]
    q = draft_probs.gather(-1, drafts[..., None])[..., 0]
    u = uniforms(sampling, ACCEPT, num_drafts).to(p.dtype)
    num_accepted = (u * q < p).long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(len(drafts), device=drafts.device)
    if lengths is not None:
        num_accepted = torch.minimum(num_accepted, lengths)
    p_next = target_probs[rows, num_accepted]  # [B, V]
    # q at the first rejected position; a row that accepted all its (own) drafts had no proposal there: zero, so
    # its bonus is drawn from p (gathered rows only: no [B, K, V] copy)
    proposed = num_accepted < (num_drafts if lengths is None else lengths)
    q_next = draft_probs[rows, num_accepted.clamp(max=num_drafts - 1)] * proposed[:, None]
    residual = (p_next - q_next).clamp_min(0)
    # all-zero only when p == q at that position, where a rejection has probability 0
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    return num_accepted, sample(residual[:, None], uniforms(sampling, BONUS, 1))[:, 0]


def _accept_greedy(drafts: torch.Tensor, target_logits: torch.Tensor,
                   lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    best = target_logits.argmax(-1)  # [B, K]
    num_accepted = (drafts == best[:, :-1]).long().cumprod(dim=1).sum(dim=1)
    if lengths is not None:
        num_accepted = torch.minimum(num_accepted, lengths)
    return num_accepted, best.gather(1, num_accepted[:, None])[:, 0]
