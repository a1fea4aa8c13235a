"""Compiling a generator's step graphs at load, before any request meets them."""

from __future__ import annotations

from ..compilation.step_mode import PREFILL_ALIGN
from .request import Request


def compile_step_shapes(generator, max_batch: int | None = None) -> None:
    """A compiled generator's graphs, compiled now (at load) rather than in a request. Batches of 1, 2 and 3 rows
    step plain, one draft and the whole block, twice each at growing key spans (symbolic from the first graph),
    then plain with no request keeping the drafter's context (plain decoding's pass), so every specialisation
    (one row or several, one token or a block, features captured or not) is compiled with the sizes that vary
    symbolic. Their admissions compile the prefill's two graphs (one prompt, several), at an aligned prompt length
    (caches of at least PREFILL_ALIGN positions). Leaves the generator allocated and idle.

    max_batch 1: a process that will only ever step one row (`dflash-generate` of one request) gets the one-row
    graphs alone: a batch of one runs in a single slot and never meets the others. Loading a stored graph still
    traces it with dynamo (graph_store.py), so this halves a warm `dflash-generate`'s load (the built-in pair: 4
    graphs traced instead of 10; such a process also prefills eagerly, `engine.load_engine`)."""
    g = generator
    lens = tuple(sorted({0, min(1, g.block - 1), g.block - 1}))
    steps = 2 * len(lens)
    batches = ((1, 1),) if max_batch == 1 else ((1, 1), (4, 2), (4, 3))
    for slots, batch in batches:
        prompts = [(0,) * (2 + i) for i in range(batch)]
        g.allocate(slots, max(2 + batch + steps * g.block + g.block + 1, PREFILL_ALIGN), g.block)
        sequences = g.admit([Request(p, steps * g.block, ignore_eos=True) for p in prompts])
        for k in lens * 2:
            g.step(k)
        if g.block > 1:  # requests alone that keep no drafter context: plain decoding's pass (`Runner.padded`)
            g.stop_drafting([seq for seq in sequences if not seq.done])
            for _ in range(2):
                g.step(0)
        for seq in sequences:
            if not seq.done:
                g.cancel(seq, "warm-up")
    # inductor's compile workers (subprocesses) are idle from here on; left running they made a served model's
    # unload outlast tritonserver's exit timeout. A later compilation, should one happen, starts them again.
    from torch._inductor.async_compile import shutdown_compile_workers

    shutdown_compile_workers()
