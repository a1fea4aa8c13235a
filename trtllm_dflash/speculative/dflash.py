"""DFlash: a block-diffusion drafter conditioned on the target's hidden states."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..cache.kv_cache import KVCache
from ..models.attention import ForwardContext
from ..models.drafter import DFlashDrafter
from ..models.target import TargetModel
from ..plugins.context_kv import context_kv_weights
from ..plugins.context_kv.op import write_context_kv
from ..sample.sampling import PROPOSE, sample, token_probs, uniforms
from .base import ContextTokens, Proposer, StepBatch

CONTEXT_KV_PATHS = ("op", "triton", "unfused")
# Bytes of deferred context features held before they are written anyway (F = captured layers x hidden values
# per token: 3 KB for the built-in pair in float32, 40 KB for Qwen3-8B's 5 captured layers in bf16, where this
# is about 6,500 tokens). A plain step (draft length 0) needs no drafter, but its tokens' context K/V must
# exist before the next drafting step reads them. Written only when a drafter pass reads them, a request that
# ends or stops drafting first never pays them (benchmarks/results/plain_only_admission.json).
PENDING_BYTES = 256 << 20


def nbytes(tokens: ContextTokens) -> int:
    return tokens.features.numel() * tokens.features.element_size()


class DFlashProposer(Proposer):
    """Keeps a draft cache of context K/V only, appended once per committed token.

    The block's own K/V are scratch inside one drafting pass and never stored, so "cropping
    the draft cache to the context" costs nothing. Context K/V of every layer are written into the paged
    pool by the fused `trtllm_dflash::context_kv` op ("op": Triton on CUDA, PyTorch elsewhere), by the
    Triton kernel directly ("triton"), or layer by layer in PyTorch ("unfused", also used for biased drafters and
    Laguna's: the op computes DFlash's projection only).
    """

    def __init__(self, drafter: DFlashDrafter, target: TargetModel, context_kv: str = "op"):
        if context_kv not in CONTEXT_KV_PATHS:
            raise ValueError(f"context_kv must be one of {CONTEXT_KV_PATHS}, got {context_kv!r}")
        self.drafter, self.target = drafter, target
        cfg = drafter.config
        self.capture_layer_ids = tuple(cfg.target_layer_ids)
        self.max_block_size = cfg.block_size
        self.mask_token_id = cfg.mask_token_id
        fusable = not cfg.attention_bias and not cfg.laguna_drafter
        self.context_kv = context_kv if fusable else "unfused"
        self.stacked = context_kv_weights(drafter) if self.context_kv != "unfused" else None
        self.cache: KVCache | None = None
        self.draft_pass = drafter  # the drafter's cached pass: the module, or compiled (set_step_mode)
        self.pending: list[tuple[ContextTokens, list[int]]] = []  # deferred tokens, and their rows' slot epochs
        self.pending_bytes = 0
        self.epochs: list[int] = []  # [S] bumped when a slot's owner ends or stops drafting

    def allocate(self, num_slots: int, capacity: int) -> None:
        self.cache = self.drafter.new_cache(num_slots, capacity, self.table)
        self.pending, self.pending_bytes, self.epochs = [], 0, [0] * num_slots

    def set_step_mode(self, mode) -> None:
        self.draft_pass = mode.compile(self.drafter)

    def tensors(self):
        return self.cache.tensors()

    def commit(self, tokens: ContextTokens) -> None:
        self.flush()  # earlier tokens first: a slot's position is written in the order its tokens ran
        self.write_tokens([tokens.kept()])

    def defer(self, tokens: ContextTokens) -> None:
        # tokens.features: a fresh tensor of the pass (eager, or copied out of graph memory), safe to keep
        self.pending.append((tokens, [self.epochs[s] for s in tokens.slot_ids]))
        self.pending_bytes += nbytes(tokens)
        if self.pending_bytes >= PENDING_BYTES:
            self.flush()

    def release(self, slot: int) -> None:
        self.epochs[slot] += 1  # its deferred tokens are dropped at the flush

    def discard(self) -> None:
        self.pending, self.pending_bytes = [], 0

    def move(self, src: int, dst: int, length: int) -> None:
        self.flush()  # deferred tokens name the old slot
        self.cache.move(src, dst, length)

    def flush(self, prompts_only: bool = False) -> None:
        """Write the deferred tokens (every one, or the prompts') of requests that still keep the drafter's context,
        as one batch of N tokens. Any order is right: a slot's owner writes each of its positions once."""
        pending = [entry for entry in self.pending if entry[0].prompt or not prompts_only]
        if not pending:
            return
        if prompts_only:
            self.pending = [entry for entry in self.pending if not entry[0].prompt]
            self.pending_bytes = sum(nbytes(tokens) for tokens, _ in self.pending)
        else:
            self.discard()
        self.write_tokens([tokens.kept() for tokens in (self.current(*entry) for entry in pending) if tokens is not None])

    def write_tokens(self, kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """kept: (slots [N], features [N, F], positions [N]) parts, written as one batch of their tokens."""
        if kept:
            slots, features, positions = (torch.cat(parts) if len(kept) > 1 else parts[0] for parts in zip(*kept))
            self.write(slots, features[:, None], positions[:, None])

    def current(self, tokens: ContextTokens, epochs: list[int]) -> ContextTokens | None:
        """`tokens` less the rows whose slot has been released since they were deferred (their keep cleared row by
        row: a few device writes, no tensor from host data); None when no token is left."""
        stale = [i for i, (s, e) in enumerate(zip(tokens.slot_ids, epochs)) if self.epochs[s] != e]
        if not stale:
            return tokens
        counts, keep = list(tokens.counts), tokens.keep.clone()
        for i in stale:
            counts[i] = 0
            keep[i] = False
        return replace(tokens, keep=keep, counts=counts) if any(counts) else None

    def write(self, slots, features, positions) -> None:
        """Context K/V of tokens at positions [B, T] of rows in cache slots [B], from features [B, T, F]."""
        if self.context_kv == "unfused":
            ctx = ForwardContext(positions, self.cache, slots)
            for layer, (k, v) in zip(self.cache.layers, self.drafter.context_kv(features, positions)):
                layer.write(ctx, k, v)
            return
        b, t = positions.shape  # flatten to N = B * T tokens, each with its own slot and position
        flat = positions.reshape(-1)
        blocks, offsets = self.cache.table.locate(slots[:, None].expand(b, t).reshape(-1), flat)  # [N] each
        args = (features.reshape(b * t, -1), flat, blocks, offsets, self.stacked, self.cache.k, self.cache.v)
        if self.context_kv == "triton":
            from ..plugins.context_kv.triton_kernel import context_kv_triton  # triton is imported only here

            context_kv_triton(*args)
        else:
            write_context_kv(*args)

    def propose(self, batch: StepBatch, num_drafts: int):
        hidden = self.draft_block(batch, num_drafts)
        # Slot k predicts the token at slot k (no shift); the anchor's output is discarded.
        logits = self.drafter.logits(hidden[:, 1:num_drafts + 1], self.target.lm_head)  # gathered over ranks
        sampling = batch.sampling
        if sampling.all_greedy:
            return logits.argmax(-1), None
        probs = token_probs(logits, sampling)
        return sample(probs, uniforms(sampling, PROPOSE, probs.shape[1])), probs

    def draft_block(self, batch: StepBatch, num_drafts: int) -> torch.Tensor:
        """The drafter's pass over each row's block [anchor, MASK x (K - 1)] -> final-normed hidden [B, K, hidden],
        K >= num_drafts + 1."""
        self.flush()  # the drafter attends to every committed token's context K/V
        # The whole block is drafted and the first num_drafts kept: the drafter was trained on full blocks of mask
        # tokens, and a shorter block drafts worse early tokens (built-in pair, batch 1, accepted drafts per step:
        # k=1 0.69 -> 0.78, k=2 1.17 -> 1.36, k=4 2.00 -> 2.12, k=8 2.85 -> 2.92; draft_len_batch1.py --blocks).
        # The pass costs what a whole block's does; the calibration times it so (it times `Generator.step(k)`).
        anchors, block_size = batch.anchors, max(num_drafts + 1, batch.block)
        block = anchors[:, None].repeat(1, block_size)
        block[:, 1:] = self.mask_token_id
        embeds = self.target.embed_tokens(block) * self.drafter.config.input_embedding_scale
        positions = batch.starts[:, None] + torch.arange(block_size, device=anchors.device)
        # The block's K/V go to the draft cache right after each row's context (scratch entries).
        return self.draft_pass(embeds, ForwardContext.cached(positions, self.cache, batch.key_span(block_size),
                                                             slots=batch.slots))
