"""Scripted stand-ins for the parts that choose: draft-length policies that replay a list, and a proposer whose
drafts the target accepts exactly as a script says."""

import itertools

import torch
from trtllm_dflash.checkpoint.loader import load_target
from trtllm_dflash.engine.generator import Generator
from trtllm_dflash.engine.request import Request

from helpers.tiny_models import VOCAB
from trtllm_dflash.draft_length.policy import DraftLenPolicy
from trtllm_dflash.speculative.base import Proposer

class Scripted(DraftLenPolicy):
    """Draft lengths from a list, in turn: every k the block allows, plain steps among them."""

    def __init__(self, lengths):
        self.lengths = itertools.cycle(lengths)
        self.observed = []

    def choose(self, batch):
        return next(self.lengths)

    def observe(self, slots, draft_len, accepted, drafting=None):
        self.observed.append((draft_len, max(accepted)))


class Cycle(DraftLenPolicy):
    """Draft lengths in turn: plain steps, short and whole-block drafts."""

    def __init__(self, lengths=(0, 3, 15, 1, 7, 0, 2)):
        self.lengths = itertools.cycle(lengths)

    def choose(self, batch):
        return next(self.lengths)


class ScriptedProposer(Proposer):
    """Drafts the target's own greedy continuation, wrong from a per-row, per-step offset on, so the
    target accepts exactly what the script says (any acceptance pattern, no trained drafter needed)."""

    max_block_size = 6

    def __init__(self, sequences: list[list[int]]):
        self.sequences, self.calls = sequences, 0  # slot s decodes sequences[s] (prompt + continuation)

    def allocate(self, num_slots, capacity):
        pass

    def commit(self, tokens):
        pass

    def move(self, src, dst, length):
        pass

    def propose(self, batch, num_drafts):
        drafts, block_size = [], num_drafts + 1
        for slot, start in enumerate(batch.starts.tolist()):  # row b is slot b (padding rows: free slots)
            known = self.sequences[slot] if slot < len(self.sequences) else []
            truth = known[start + 1 : start + block_size] + [0] * block_size
            right = (self.calls + 2 * slot) % block_size  # 0..block_size-1 correct drafts
            drafts.append([t if k < right else (t + 1) % VOCAB for k, t in enumerate(truth[: block_size - 1])])
        self.calls += 1
        return torch.tensor(drafts), None


def scripted_results(path, expected, prompts, new_tokens) -> list:
    """`prompts` decoded in one batch with ScriptedProposer's acceptance pattern (any target family); outputs
    checked against `expected`; -> the results."""
    proposer = ScriptedProposer([p + e for p, e in zip(prompts, expected)])
    results = Generator(load_target(path).model, proposer).generate(
        [Request(tuple(p), new_tokens, ignore_eos=True) for p in prompts])
    assert [r.output_ids for r in results] == expected
    return results
