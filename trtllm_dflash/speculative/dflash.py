"""DFlash: a block-diffusion drafter conditioned on the target's hidden states."""

from __future__ import annotations

import torch

from ..kv_cache import KVCache
from ..models.attention import ForwardContext
from ..models.drafter import DFlashDrafter
from ..models.target import TargetModel
from ..plugins.context_kv import context_kv_weights
from ..plugins.context_kv.op import write_context_kv
from ..sampling import PROPOSE, sample, token_probs, uniforms
from .base import Proposer, StepBatch

CONTEXT_KV_PATHS = ("op", "triton", "unfused")
# Plain steps whose context K/V wait to be written together. A plain step (draft length 0) needs no
# drafter, but its token's context K/V must exist before the next drafting step: written one step at
# a time they cost a plain step of the built-in pair on CPU about 9 % (0.57 ms of 6.4 ms, batch 1),
# written 16 steps at once about 0.06 ms per step. So a DFlash engine decoding plainly (draft length
# chosen 0) stays near plain decoding's speed.
PENDING_STEPS = 16


class DFlashProposer(Proposer):
    """Keeps a draft cache of context K/V only, appended once per committed token.

    The block's own K/V are scratch inside one drafting pass and never stored, so "cropping
    the draft cache to the context" costs nothing. Context K/V are written by the fused
    `trtllm_dflash::context_kv` op ("op": Triton on CUDA, PyTorch elsewhere), by the Triton kernel
    directly ("triton"), or layer by layer in PyTorch ("unfused", also used for biased drafters).
    """

    def __init__(self, drafter: DFlashDrafter, target: TargetModel, context_kv: str = "op"):
        if context_kv not in CONTEXT_KV_PATHS:
            raise ValueError(f"context_kv must be one of {CONTEXT_KV_PATHS}, got {context_kv!r}")
        self.drafter, self.target = drafter, target
        cfg = drafter.config
        self.capture_layer_ids = tuple(cfg.target_layer_ids)
        self.max_block_size = cfg.block_size
        self.mask_token_id = cfg.mask_token_id
        fusable = not cfg.attention_bias
        self.context_kv = context_kv if fusable else "unfused"
        self.stacked = context_kv_weights(drafter) if self.context_kv != "unfused" else None
        self.cache: KVCache | None = None
        self.draft_pass = drafter  # the drafter's cached pass: the module, or compiled (set_step_mode)
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # deferred (slots, features, positions)

    def allocate(self, num_slots: int, capacity: int) -> None:
        self.cache = self.drafter.new_cache(num_slots, capacity)
        self.pending = []

    def set_step_mode(self, mode) -> None:
        self.draft_pass = mode.compile(self.drafter)

    def tensors(self):
        return self.cache.tensors()

    def commit(self, slots, features, positions) -> None:
        self.flush()
        self.write(slots, features, positions)

    def defer(self, slots, features, positions) -> None:
        # features is a fresh tensor of this step's forward (eager mode), safe to keep until the flush
        self.pending.append((slots, features, positions))
        if len(self.pending) >= PENDING_STEPS:
            self.flush()

    def discard(self) -> None:
        self.pending = []

    def move(self, src: int, dst: int, length: int) -> None:
        self.flush()  # deferred writes name the old slot
        self.cache.move(src, dst, length)

    def flush(self) -> None:
        """Write the deferred plain steps' context K/V as one batch of N = sum of their rows tokens."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        slots = torch.cat([s[:, None].expand(p.shape).reshape(-1) for s, _, p in pending])  # [N]
        features = torch.cat([f.reshape(-1, 1, f.shape[-1]) for _, f, _ in pending])  # [N, 1, F]
        positions = torch.cat([p.reshape(-1, 1) for _, _, p in pending])  # [N, 1]
        self.write(slots, features, positions)

    def write(self, slots, features, positions) -> None:
        """Context K/V of tokens at positions [B, T] of rows in cache slots [B], from features [B, T, F]."""
        if self.context_kv == "unfused":
            ctx = ForwardContext(positions, self.cache, slots)
            for layer, (k, v) in zip(self.cache.layers, self.drafter.context_kv(features, positions)):
                layer.write(ctx, k, v)
            return
        b, t = positions.shape  # flatten to N = B * T tokens, each with its own slot and position
        args = (features.reshape(b * t, -1), positions.reshape(-1), slots[:, None].expand(b, t).reshape(-1),
                self.stacked, self.cache.k, self.cache.v)
        if self.context_kv == "triton":
            from ..plugins.context_kv.triton_kernel import context_kv_triton

            context_kv_triton(*args)
        else:
            write_context_kv(*args)

    def propose(self, batch: StepBatch, num_drafts: int):
        self.flush()  # the drafter attends to every committed token's context K/V
        anchors, block_size = batch.anchors, num_drafts + 1
        block = anchors[:, None].repeat(1, block_size)
        block[:, 1:] = self.mask_token_id
        embeds = self.target.embed_tokens(block) * self.drafter.config.input_embedding_scale
        positions = batch.starts[:, None] + torch.arange(block_size, device=anchors.device)
        # The block's K/V go to the draft cache right after each row's context (scratch entries).
        hidden = self.draft_pass(embeds, ForwardContext.cached(positions, self.cache, batch.key_span(block_size),
                                                               slots=batch.slots))
        # Slot k predicts the token at slot k (no shift); the anchor's output is discarded.
        logits = self.drafter.logits(hidden[:, 1:], self.target.lm_head)  # gathered over ranks
        sampling = batch.sampling
        if sampling.all_greedy:
            return logits.argmax(-1), None
        probs = token_probs(logits, sampling)
        return sample(probs, uniforms(sampling, PROPOSE, probs.shape[1])), probs
