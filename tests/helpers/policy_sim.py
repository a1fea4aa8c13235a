"""Scripted step times and acceptances for the draft-length policy's tests (no model, no clock).

A request's text decides acceptance, whatever the draft lengths: output token t is predictable with probability
`easy(t)`, drawn once per request and seed, and a draft of it is accepted iff it and every draft before it are
predictable. So a fixed draft length, plain decoding and the policy decode the same texts, and the best fixed
length in hindsight is found by running each.
"""

import random

import numpy as np

from trtllm_dflash.draft_length.policy import AutoDraftLen, BatchView, FixedDraftLen

K = 15


def generator(slots: int, block: int = K + 1):
    return type("G", (), {"slots": type("S", (), {"usable": slots}), "block": block})()


def prepared(slots: int = 16, prior=None) -> AutoDraftLen:
    policy = AutoDraftLen(prior)
    policy.prepare(generator(slots))
    return policy


def view(slots, remaining=None, drafting=None) -> BatchView:
    return BatchView(list(slots), 100, remaining or [1000] * len(slots), K, drafting)


class Request:
    def __init__(self, rng: random.Random, easy, tokens: int):
        self.predictable = [rng.random() < easy(t) for t in range(tokens + K + 1)]
        self.tokens, self.emitted, self.drafting = tokens, 0, True

    def accepted(self, k: int) -> int:
        a = 0
        while a < k and self.predictable[self.emitted + a]:
            a += 1
        return a


def simulate(policy, seconds, easy, rows: int = 1, requests: int = 1, tokens: int = 256, seed: int = 0) -> float:
    """Tokens per unit of scripted time: `requests` requests of `tokens` tokens, `rows` at a time (a newcomer
    takes a finished one's place, as a closed-loop client keeps the concurrency); seconds(step, rows, k) is a
    step's time, easy(t) the chance that output token t is predictable."""
    rng = random.Random(seed)
    policy.prepare(generator(rows))
    waiting = [Request(rng, easy, tokens) for _ in range(requests)]
    running: list[Request] = []
    clock, emitted, step = 0.0, 0, 0
    while waiting or running:
        while waiting and len(running) < rows:
            new = waiting.pop(0)
            remaining = [r.tokens - r.emitted for r in running] + [new.tokens]
            new.drafting = policy.drafts_for(BatchView(list(range(len(running) + 1)), 100, remaining, K,
                                                       tuple(r.drafting for r in running) + (True,)))
            running.append(new)
            policy.admit([len(running) - 1], [100])
        batch = BatchView(list(range(len(running))), 100, [r.tokens - r.emitted for r in running], K,
                          tuple(r.drafting for r in running))
        k = policy.choose(batch) if any(r.drafting for r in running) else 0
        if k == 0 and any(r.drafting for r in running):
            for r, keep in zip(running, policy.keeps_context(batch)):
                r.drafting = r.drafting and keep
        accepted = [r.accepted(k) if r.drafting else 0 for r in running]
        dt = seconds(step, len(running), k)
        if any(r.drafting for r in running):
            policy.timed(len(running), 100, k, dt)
            policy.observe(list(range(len(running))), k, accepted, [r.drafting for r in running])
        clock, step = clock + dt, step + 1
        for r, a in zip(running, accepted):
            kept = min(a + 1, r.tokens - r.emitted)
            r.emitted += kept
            emitted += kept
        for i in reversed(range(len(running))):
            if running[i].emitted >= running[i].tokens:
                running.pop(i)
                for src in range(i + 1, len(running) + 1):  # the generator keeps requests in slots 0..n-1
                    policy.move(src, src - 1)
    return emitted / clock


def best_fixed(seconds, easy, **kw) -> tuple[int, float]:
    """-> (draft length, tokens per unit time) of the best fixed length, plain included, on the same texts."""
    rates = [simulate(FixedDraftLen(k), seconds, easy, **kw) for k in range(K + 1)]
    return int(np.argmax(rates)), max(rates)
