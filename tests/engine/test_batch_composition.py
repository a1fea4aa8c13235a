"""The float32 exactness guarantee across batch compositions (docs/exactness.md).

A batched server computes a request's step together with whichever requests share the batch; in float32 the
greedy tokens must not depend on that. The oracle is transformers' greedy decoding of each prompt alone. The
shipped pair (a real drafter, so drafts are accepted and rejected) on 16 held-out prompts: plain and DFlash
decoding, each request alone, all 16 at once, and admitted in a staggered order (4 running at a time, newcomers
joining a batch mid-decode), with draft length 15 and with the live policy (fed scripted step times, so the
mix of plain and drafting steps does not depend on this machine's timing).
"""

import pytest
import torch
from helpers.oracle import held_out_ids, hf_greedy
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.draft_length.policy import AutoDraftLen, FixedDraftLen

pytestmark = pytest.mark.slow  # 16 prompts against transformers, in four compositions

NEW_TOKENS = 40
PROMPTS = 16


@pytest.fixture(scope="module")
def prompts(pair):
    return [tuple(ids) for ids in held_out_ids(pair[0], PROMPTS)]


@pytest.fixture(scope="module")
def expected(pair, prompts):
    from transformers import AutoModelForCausalLM

    oracle = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()
    return [hf_greedy(oracle, list(p), NEW_TOKENS) for p in prompts]


class SyntheticTimes(AutoDraftLen):
    """The live policy fed a fixed step time instead of the wall clock's, so the test's plain/drafting mix does
    not depend on the machine: drafting pays at small batches and not at 16 rows (as on this project's CPU),
    seconds = (0.002 + 0.0003 rows) x (1 + 0.06 k)^(rows / 4) per step of k drafts."""

    def timed(self, rows, context, draft_len, seconds):
        super().timed(rows, context, draft_len, (0.002 + 0.0003 * rows) * (1 + 0.06 * draft_len) ** (rows / 4))


def policy(kind: str):
    if kind == "plain":
        return FixedDraftLen(0)
    if kind == "15":
        return FixedDraftLen(15)
    return SyntheticTimes()


def requests(prompts) -> list[Request]:
    return [Request(p, NEW_TOKENS, ignore_eos=True) for p in prompts]


def staggered(generator, prompts, running: int = 4) -> list[list[int]]:
    """Requests admitted as others finish or mid-decode: at most `running` at a time, a newcomer every 3 steps."""
    reqs, results, waiting, step = requests(prompts), {}, list(range(len(prompts))), 0
    capacity = max(len(p) for p in prompts) + NEW_TOKENS + generator.proposer.max_block_size + 1
    generator.allocate(running, capacity, generator.proposer.max_block_size)
    active = {}
    while waiting or generator.slots.running:
        if waiting and len(generator.slots.running) < running and (step % 3 == 0 or not generator.slots.running):
            i = waiting.pop(0)
            active[i] = generator.admit([reqs[i]])[0]
        generator.step()
        step += 1
        for i, seq in list(active.items()):
            if seq.done:
                results[i] = seq.result.output_ids
                del active[i]
    return [results[i] for i in range(len(prompts))]


@pytest.mark.parametrize("kind", ["plain", "15", "auto"])
def test_float32_greedy_output_does_not_depend_on_the_batch(pair, prompts, expected, kind):
    generator = load_pipeline(*pair, dtype=torch.float32).generator
    outputs = {}
    generator.policy = policy(kind)
    outputs["alone"] = [generator.generate(requests([p]))[0].output_ids for p in prompts]
    generator.policy = policy(kind)
    batched = generator.generate(requests(prompts))
    outputs["16 at once"] = [r.output_ids for r in batched]
    generator.policy = policy(kind)
    with torch.inference_mode():
        outputs["staggered"] = staggered(generator, prompts)
    for how, got in outputs.items():
        differ = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
        assert not differ, f"{kind}, {how}: prompts {differ} differ from transformers' greedy output"
    if kind != "plain":  # the check exercised real drafting: drafts were proposed and accepted in the batch
        assert sum(r.accepted_tokens for r in batched) > 0
    if kind == "auto":  # the scripted times draft alone and run 16 rows plain: both kinds of step ran
        lengths = [k for r in batched for k in r.draft_lengths]
        assert 0 in lengths
