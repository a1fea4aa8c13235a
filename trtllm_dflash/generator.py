"""The speculative generation loop: prefill, then draft_block -> verify -> accept -> commit.

Requests in a batch decode together, each at its own positions and with its own acceptance.
Each owns a cache slot; finished requests leave the running set at the next step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .models.target import TargetModel, TargetStep
from .pairing import check_block_size
from .request import Request, Result
from .sampling import SamplingBatch, sample_rows, token_probs
from .speculative.accept import accept
from .speculative.base import Proposer


@dataclass
class BatchState:
    """Per-slot decoding state of one generate() call, indexed by slot."""

    requests: list[Request]
    results: list[Result]
    generators: list[torch.Generator]
    stops: list[frozenset[int]]
    starts: torch.Tensor  # [N] committed length = position of the anchor
    anchors: torch.Tensor  # [N] last committed token, not yet run through the target
    done: list[bool]

    def running(self) -> list[int]:
        return [i for i, d in enumerate(self.done) if not d]

    def sampling(self, slots: list[int], device) -> SamplingBatch:
        return SamplingBatch.of([self.requests[i].sampling for i in slots], [self.generators[i] for i in slots], device)


class Generator:
    def __init__(self, target: TargetModel, proposer: Proposer, default_stop_ids: tuple[int, ...] = ()):
        self.target, self.proposer = target, proposer
        self.default_stop_ids = default_stop_ids
        self.device = target.lm_head.weight.device
        self.cache = None  # the target's KV cache, allocated per generate() call

    @torch.inference_mode()
    def generate(self, requests: list[Request], block_size: int | None = None) -> list[Result]:
        block = check_block_size(self.proposer.max_block_size if block_size is None else block_size,
                                 self.proposer.max_block_size)
        if not requests:
            return []
        cfg = self.target.config
        for r in requests:
            r.validate(cfg.vocab_size, cfg.max_position_embeddings)
        state = self.prefill(requests, block)
        while True:
            slots = state.running()
            if not slots:
                return state.results
            self.step(state, slots, block)

    def prefill(self, requests: list[Request], block: int) -> BatchState:
        start = time.perf_counter()
        n, longest = len(requests), max(len(r.prompt_ids) for r in requests)
        capacity = longest + max(r.max_new_tokens for r in requests) + block + 1
        self.cache = self.target.new_cache(n, capacity)
        self.proposer.allocate(n, capacity)
        ids = torch.zeros((n, longest), dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, : len(r.prompt_ids)] = torch.tensor(r.prompt_ids)
        ids = ids.to(self.device)
        # Right padding: a padded row writes junk K/V past its prompt, beyond its valid length.
        positions = torch.arange(longest, device=self.device).expand(n, -1)
        slots = torch.arange(n, device=self.device)
        hidden, features = self.target(TargetStep(ids, positions, slots, self.cache, self.proposer.capture_layer_ids))
        lengths = torch.tensor([len(r.prompt_ids) for r in requests], device=self.device)
        last = hidden[torch.arange(n, device=self.device), lengths - 1]  # [N, hidden]
        state = self.new_state(requests, lengths, start)
        sampling = state.sampling(list(range(n)), self.device)
        first = self.first_tokens(self.target.logits(last[:, None]), sampling)
        self.proposer.commit(slots, features, positions)
        state.anchors = first
        now = time.perf_counter()
        for i, token in enumerate(first.tolist()):
            state.results[i].first_token_s = now
            self.emit(state, i, [token], now)
        return state

    def new_state(self, requests: list[Request], lengths: torch.Tensor, start: float) -> BatchState:
        stops = [frozenset() if r.ignore_eos else frozenset(self.default_stop_ids if r.stop_ids is None else r.stop_ids)
                 for r in requests]
        results = [Result(prompt_tokens=len(r.prompt_ids), start_s=start) for r in requests]
        return BatchState(requests, results, [r.sampling.generator() for r in requests], stops,
                          starts=lengths.clone(), anchors=lengths.clone(), done=[False] * len(requests))

    @staticmethod
    def first_tokens(logits: torch.Tensor, sampling: SamplingBatch) -> torch.Tensor:
        # logits: [N, 1, V] -> [N]
        if sampling.all_greedy:
            return logits[:, 0].argmax(-1)
        return sample_rows(token_probs(logits, sampling), sampling.generators)[:, 0]

    def step(self, state: BatchState, running: list[int], block: int) -> None:
        """One speculative step for the running slots: draft a block, verify it, accept a prefix."""
        slots = torch.tensor(running, device=self.device)
        starts, anchors = state.starts[slots], state.anchors[slots]
        sampling = state.sampling(running, self.device)
        drafts, draft_probs = self.proposer.propose(slots, anchors, starts, block, sampling)
        tokens = torch.cat([anchors[:, None], drafts], dim=1)  # [B, K]
        positions = starts[:, None] + torch.arange(tokens.shape[1], device=self.device)
        hidden, features = self.target(TargetStep(tokens, positions, slots, self.cache, self.proposer.capture_layer_ids))
        num_accepted, bonus = accept(drafts, draft_probs, self.target.logits(hidden), sampling)
        self.proposer.commit(slots, features, positions)
        state.starts[slots] = starts + num_accepted + 1
        state.anchors[slots] = bonus
        now = time.perf_counter()
        drafted, accepted, bonuses = drafts.tolist(), num_accepted.tolist(), bonus.tolist()  # host sync
        for row, (i, a) in enumerate(zip(running, accepted)):
            new = drafted[row][:a] + [bonuses[row]]
            state.results[i].drafted_tokens += drafts.shape[1]
            state.results[i].accepted_tokens += a
            state.results[i].acceptance_lengths.append(self.emit(state, i, new, now))

    def emit(self, state: BatchState, i: int, tokens: list[int], now: float) -> int:
        """Append tokens to request i up to its stop token or length limit; -> tokens kept."""
        result, request = state.results[i], state.requests[i]
        room = request.max_new_tokens - len(result.output_ids)
        kept = tokens[:room]
        for j, token in enumerate(kept):
            if token in state.stops[i]:
                kept = kept[: j + 1]
                result.finish_reason = "stop"
                break
        result.output_ids.extend(kept)
        if not result.finish_reason and len(result.output_ids) >= request.max_new_tokens:
            result.finish_reason = "length"
        if result.finish_reason:
            state.done[i] = True
            result.finish_s = now
        return len(kept)
