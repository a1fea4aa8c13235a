"""DFlash2's layers: the grouped dynamic causal convolution around each sublayer, and the candidate selector.

As speculators 0.9.0 computes them (`speculators/models/dflash2/model_definitions.py`):
- `grouped_dynamic_conv` (:47-102): out[i, c] = sum over taps t < k with slot(i) >= t of
  (base_kernel[t, c] + delta[i, t, c // group]) * x[i - t, c]: channel c's group is `c // group_size` (contiguous
  channel blocks, :82), the dynamic coefficient is the OUTPUT position's (:95-98), taps never cross a block start
  (:99). The library finds a token's slot as `flat_index % block_size` (:84) over back-to-back blocks; here a row
  [B, T, H] holds one block (T <= block_size: inference) or back-to-back whole blocks (training's packed rows,
  train/objective.py), and a slot is the index along dim 1 modulo the block size.
- `GroupedDynamicCausalConv` (:105-172): base_kernel [2, k, H], kernel_projection H -> 2 k G (G = H / group), its
  outputs side-major, then tap, then group (:147-152); `prepare` convolves the sublayer's input with side 0 and
  hands side 1's coefficients (from the same input) to `finish`, which convolves the sublayer's output. Initialised
  as the identity (`reset_parameters`, :138-143): tap 0 of both sides 1, every other tap and the projection 0.
- `CandidateSelector` (:243-316): predecessor_codebook, successor_codebook [V, r], hidden_projection H -> r; the
  score of candidate c after token prev at hidden h is unary[c] + <P[prev] * W_h h, S[c]> (:268-299). All three
  initialised N(0, initializer_range) (:264-266), the successor codebook included.
Under tensor parallelism both are replicated: they act on the full hidden state, which every rank holds (the
attention and MLP outputs are reduced before the residual).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config.dflash2 import DFlash2Config


def grouped_dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block: int) -> torch.Tensor:
    """x: [B, T, H] blocks of `block` slots back to back (slot 0 first; the last may be shorter); delta: [B, T, k, G];
    base: [k, H] -> [B, T, H]."""
    b, t, h = x.shape
    taps, groups = delta.shape[-2:]
    grouped = x.view(b, t, groups, h // groups)
    base = base.view(taps, groups, h // groups)
    out = grouped * (base[0] + delta[:, :, 0, :, None])
    slot = torch.arange(t, device=x.device) % block if t > block else None  # [T], only for packed blocks
    for tap in range(1, min(taps, t)):  # slot i reads slot i - tap: zeros before the block's start
        shifted = F.pad(grouped[:, : t - tap], (0, 0, 0, 0, tap, 0))
        if slot is not None:
            shifted = shifted * (slot >= tap)[:, None, None]
        out = out + shifted * (base[tap] + delta[:, :, tap, :, None])
    return out.view(b, t, h)


class BlockConv(nn.Module):
    """The two convolutions around one sublayer (checkpoint names `{attention,mlp}_conv.*`)."""

    def __init__(self, hidden: int, cfg: DFlash2Config):
        super().__init__()
        self.taps, self.groups, self.block = cfg.conv_kernel_size, hidden // cfg.conv_group_size, cfg.block_size
        self.base_kernel = nn.Parameter(torch.empty(2, self.taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * self.taps * self.groups, bias=False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The identity: the sublayer as DFlash runs it."""
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the normed sublayer input [B, T, H] -> (x convolved, the output side's coefficients [B, T, k, G])."""
        delta = self.kernel_projection(x).view(*x.shape[:-1], 2, self.taps, self.groups)
        return grouped_dynamic_conv(x, delta[..., 0, :, :], self.base_kernel[0], self.block), delta[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """y: the sublayer's output [B, T, H]."""
        return grouped_dynamic_conv(y, delta, self.base_kernel[1], self.block)


class CandidateSelector(nn.Module):
    """Rescores the drafter's unary top-K by its predecessor (checkpoint names `candidate_selector.*`)."""

    def __init__(self, hidden: int, vocab: int, cfg: DFlash2Config):
        super().__init__()
        self.top_k = cfg.selector_top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab, cfg.selector_rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab, cfg.selector_rank))
        self.hidden_projection = nn.Linear(hidden, cfg.selector_rank, bias=False)

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        """std: the target's initializer_range (0.02 when it has none)."""
        for weight in (self.predecessor_codebook, self.successor_codebook, self.hidden_projection.weight):
            nn.init.normal_(weight, std=std)

    def score(self, unary: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor, candidates: torch.Tensor):
        """unary: [..., V] logits; hidden: [..., H]; prev: [...] predecessor ids; candidates: [..., K] -> [..., K]
        fp32 scores (training's teacher-forced form of the walk's, speculative/dflash2.py)."""
        context = self.predecessor_codebook[prev].float() * self.hidden_projection(hidden).float()  # [..., r]
        transition = (context[..., None, :] * self.successor_codebook[candidates].float()).sum(-1)
        return unary.float().gather(-1, candidates) + transition
