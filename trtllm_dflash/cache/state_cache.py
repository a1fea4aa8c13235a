"""Per-slot recurrent state of the linear-attention (Gated DeltaNet) layers, with speculative rollback.

A KV cache rolls back for free (entries past the accepted length are never read), but a recurrent
state is overwritten by every token it sees. Verify therefore reads the state and leaves it alone,
keeping the block's pre-convolution inputs and gates (`stash`); once acceptance is known, `commit`
replays exactly the accepted prefix from the untouched state (the layer recomputes the short
convolution and runs the delta rule with later tokens masked to no-ops). SGLang and vLLM instead
keep the state after each of the K positions and pick one; for DFlash blocks (K = 16) that costs
K whole states per request, this costs K input rows (see `bytes_per_slot`).

Passes whose committed length is known up front (prefill, plain decoding) commit in the pass.
"""

from __future__ import annotations

import torch

from ..config.model import GatedDeltaNetConfig


class RecurrentState:
    def __init__(self, num_layers: int, num_slots: int, block: int, cfg: GatedDeltaNetConfig, world: int,
                 dtype: torch.dtype, device: torch.device | str):
        heads, channels = cfg.num_v_heads // world, cfg.conv_dim // world  # this rank's
        width = cfg.conv_kernel - 1
        # conv: [L, S, C, W-1] the last W-1 inputs of the short convolution (zeros before the first token)
        self.conv = torch.zeros(num_layers, num_slots, channels, width, dtype=dtype, device=device)
        # ssm: [L, S, H_v, D_k, D_v] fp32, the delta-rule state
        self.ssm = torch.zeros(num_layers, num_slots, heads, cfg.head_k_dim, cfg.head_v_dim, device=device)
        # the last deferred pass's inputs: mixed [L, S, K, C] (pre-convolution), gates [L, S, K, 2, H_v] fp32
        self.mixed = torch.zeros(num_layers, num_slots, block, channels, dtype=dtype, device=device)
        self.gates = torch.zeros(num_layers, num_slots, block, 2, heads, device=device)
        self.block = block

    def tensors(self) -> list[tuple[torch.Tensor, tuple[int, ...]]]:
        """Every state tensor with its slot dim (`KVCache.tensors`)."""
        return [(t, (1,)) for t in (self.conv, self.ssm, self.mixed, self.gates)]

    def reset(self, slots: torch.Tensor) -> None:
        """A new sequence in these slots starts from zero state."""
        self.conv[:, slots] = 0
        self.ssm[:, slots] = 0

    def move(self, src: int, dst: int) -> None:
        """A sequence changes slot: its state goes along (the stash lives within one step only)."""
        self.conv[:, dst] = self.conv[:, src]
        self.ssm[:, dst] = self.ssm[:, src]

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # -> conv [B, C, W-1], ssm [B, H_v, D_k, D_v] (gathers: copies, the stored state stays as it is)
        return self.conv[layer][slots], self.ssm[layer][slots]

    def store(self, layer: int, slots: torch.Tensor, window: torch.Tensor, ssm: torch.Tensor,
              lengths: torch.Tensor) -> None:
        """window: [B, C, W-1 + T] old conv state then the pass's inputs; lengths: [B] tokens committed.
        The new conv state is the W-1 inputs before each row's committed end."""
        width = self.conv.shape[-1]
        index = lengths[:, None] + torch.arange(width, device=window.device)  # [B, W-1]
        self.conv[layer][slots] = window.gather(2, index[:, None, :].expand(-1, window.shape[1], -1))
        self.ssm[layer][slots] = ssm

    def stash(self, layer: int, slots: torch.Tensor, mixed: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> None:
        """Keep a deferred pass's inputs for `commit`. mixed: [B, T, C]; g, beta: [B, T, H_v]; T <= block."""
        t = mixed.shape[1]
        self.mixed[layer][slots, :t] = mixed
        self.gates[layer][slots, :t] = torch.stack([g, beta], dim=2)

    def stashed(self, layer: int, slots: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # -> mixed [B, T, C], g [B, T, H_v], beta [B, T, H_v]
        gates = self.gates[layer][slots, :t]
        return self.mixed[layer][slots, :t], gates[:, :, 0], gates[:, :, 1]

    @staticmethod
    def bytes_per_slot(num_layers: int, block: int, cfg: GatedDeltaNetConfig, world: int, dtype: torch.dtype) -> int:
        """Memory one request holds on one rank: state (conv + fp32 delta-rule state) + rollback stash."""
        size = torch.empty(0, dtype=dtype).element_size()
        heads, channels = cfg.num_v_heads // world, cfg.conv_dim // world
        state = channels * (cfg.conv_kernel - 1) * size + heads * cfg.head_k_dim * cfg.head_v_dim * 4
        stash = block * (channels * size + 2 * heads * 4)
        return num_layers * (state + stash)
