"""The draft-length policy inside the generator: exact at any per-step k, deciding from its own steps; the
stored step-cost model `dflash-build calibrate` measures."""

import numpy as np
import pytest
import torch
from helpers.oracle import held_out_ids, hf_greedy
from helpers.scripted import Scripted
from trtllm_dflash.engine.calibrate import (
    PLAIN_LEAD_STEPS,
    CalibrationCache,
    CalibrationPlan,
    calibration_key,
    measure,
)
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.cache.block_pool import default_blocks
from trtllm_dflash.compilation.step_mode import StepMode
from trtllm_dflash.draft_length.policy import AutoDraftLen, DraftLenPolicy, FixedDraftLen
from trtllm_dflash.engine.draft_len import stored_prior
from trtllm_dflash.utils.errors import DFlashError


@pytest.fixture(scope="module")
def prompts(pair):
    return held_out_ids(pair[0], 3)


def test_greedy_output_is_the_targets_at_any_sequence_of_draft_lengths(pair, prompts):
    from transformers import AutoModelForCausalLM

    oracle = AutoModelForCausalLM.from_pretrained(pair[0]).eval()
    gen = load_pipeline(*pair).generator
    script = [0, 5, 1, 15, 0, 0, 2, 3, 9]
    gen.policy = Scripted(script)
    prompts = [p[: 5 + 9 * i] for i, p in enumerate(prompts)]
    results = gen.generate([Request(tuple(p), 30, ignore_eos=True) for p in prompts])
    for prompt, result in zip(prompts, results):
        assert result.output_ids == hf_greedy(oracle, prompt, 30)
        assert result.draft_lengths == (script * 10)[: len(result.draft_lengths)]
        assert all(a <= k + 1 for a, k in zip(result.acceptance_lengths, result.draft_lengths))
        assert result.drafted_tokens == sum(result.draft_lengths)
    assert any(a > 0 for k, a in gen.policy.observed if k)  # drafts were really accepted, not only rejected


def test_the_live_policy_is_exact_and_starts_without_measuring(pair, prompts, tmp_path):
    spec, plain = load_pipeline(*pair).generator, load_pipeline(pair[0]).generator
    spec.policy = AutoDraftLen(stored_prior(CalibrationCache(tmp_path / "none")))
    step = spec.step
    chosen = []
    spec.step = lambda draft_len=None: chosen.append(draft_len) or step(draft_len)
    requests = [Request(tuple(p[:12]), 40, ignore_eos=True) for p in prompts[:2]]
    results = spec.generate(requests)
    assert [r.output_ids for r in results] == [r.output_ids for r in plain.generate(requests)]
    assert set(chosen) == {None}  # every step the generator ran was a request's, none a measurement's
    lengths = [k for r in results for k in r.draft_lengths]
    assert lengths[0] == 0 and max(lengths) > 0  # the bucket's first step is plain, then it drafts
    assert not (tmp_path / "none").exists()


def test_a_pool_smaller_than_the_batch_limit_starts_with_the_live_policy(pair, prompts):
    """16 slots over 4 KV blocks of 16 positions, prompts prefilled 8 tokens a chunk: nothing at start-up asks
    for more (the calibration this policy replaced held 16 requests at once and refused such a pool)."""
    gen, plain = load_pipeline(*pair).generator, load_pipeline(pair[0]).generator
    gen.policy, gen.max_num_tokens = AutoDraftLen(), 8
    gen.allocate(16, 64, gen.block, num_blocks=4)
    request = Request(tuple(prompts[0][:12]), 20, ignore_eos=True)
    seq = gen.admit([request])[0]
    while not seq.done:
        gen.step()
    assert seq.result.output_ids == plain.generate([request])[0].output_ids


def test_a_stored_step_cost_model_is_the_live_policys_prior(pair, tmp_path):
    gen = load_pipeline(*pair).generator
    gen.allocate(1, 64, 4)
    model = measure(gen, CalibrationPlan((1,), (0, 3), (16,), repeats=1))
    CalibrationCache(tmp_path).save(model, calibration_key(gen))
    gen.policy = AutoDraftLen(stored_prior(CalibrationCache(tmp_path)))
    gen.allocate(1, 64, 4)
    seconds = model.step_seconds(1, 16, 3)
    assert gen.policy.times.shape[0].tolist() == pytest.approx(np.log(seconds / seconds[0]).tolist())


def test_a_cost_model_for_other_threads_is_not_used(pair, tmp_path):
    gen = load_pipeline(*pair).generator
    gen.allocate(1, 64, 4)
    cache = CalibrationCache(tmp_path)
    model = measure(gen, CalibrationPlan((1,), (0, 3), (16,), repeats=1))
    cache.save(model, calibration_key(gen))
    assert cache.load(calibration_key(gen)) == model
    # one cached before cells were timed after lead steps of their kind (its key had no procedure) is not used
    earlier = CalibrationCache(tmp_path / "earlier")
    earlier.save(model, {k: v for k, v in calibration_key(gen).items() if k != "procedure"})
    assert earlier.load(calibration_key(gen)) is None
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert cache.load(calibration_key(gen)) is None
    finally:
        torch.set_num_threads(threads)


class FakeGenerator:
    """Steps cost a scripted time on a fake clock: 1 ms + 0.5 ms per draft token per row + 1 us per context
    token, and the first `step_mode.settle_calls` steps of every (batch, context, draft length) 100 ms (a
    first call's allocations, or CUDA graphs' warm-up and recording: what the calibration must leave out); a
    step right after one of another draft length 2 ms more (a plain step after a whole-block one ran up to
    1.38x a plain run's on the CPU: not what a run of either costs)."""

    def __init__(self, slots=8, capacity=600, block=8, step_mode=StepMode()):
        self.slots = type("Slots", (), {"usable": slots, "running": {}})()
        self.capacity, self.block, self.now, self.rows, self.context = capacity, block, 0.0, 0, 0
        self.device, self.target = torch.device("cpu"), type("T", (), {"tp": type("P", (), {"world": 1})})()
        self.calls, self.step_mode = [], step_mode
        # the default pool: every slot at `capacity` (Generator.allocate), so it bounds nothing here
        self.pool = type("Pool", (), {"num_blocks": default_blocks(slots, capacity)})()

    def admit(self, requests, drafting=None):
        assert drafting is True  # every cell drafts its k, whatever a policy would say of newcomers
        self.rows = len(requests)
        return [type("Seq", (), {"done": False, "slot": i})() for i in range(len(requests))]

    def hold(self, sequences, length):
        self.context = length

    def step(self, k):
        settling = self.calls.count((self.rows, self.context, k)) < self.step_mode.settle_calls
        switched = bool(self.calls) and self.calls[-1][2] != k
        self.calls.append((self.rows, self.context, k))
        self.now += 0.1 if settling else 1e-3 + 5e-4 * k * self.rows + 1e-6 * self.context + 2e-3 * switched

    def cancel(self, seq, reason):
        seq.done = True

    def clock(self):
        return self.now


@pytest.mark.parametrize("mode", ("eager", "cuda-graphs"))
def test_measure_fills_the_grid_from_interleaved_repeats_after_each_cell_settles(mode):
    """Each cell's time is what a run of its steps costs: settled, and timed after a step of its own kind."""
    gen = FakeGenerator(step_mode=StepMode(mode))
    plan = CalibrationPlan.covering(max_batch=6, max_draft_len=7, max_context=500, repeats=3)
    assert plan.batch_sizes == (1, 2, 4, 6) and plan.draft_lens == (0, 1, 2, 4, 7) and plan.contexts == (128, 500)
    model = measure(gen, plan, clock=gen.clock)
    for c, context in enumerate(plan.contexts):
        for b, batch in enumerate(plan.batch_sizes):
            expected = [1e-3 + 5e-4 * k * batch + 1e-6 * context for k in plan.draft_lens]
            assert model.seconds[c][b] == pytest.approx(expected)
    settle = 10 * gen.step_mode.settle_calls  # untimed steps of batch 1: each of its 10 cells settles first
    per_round = 2 * 2 * 5 + 2 * (PLAIN_LEAD_STEPS - 1)  # each cell: untimed steps of its kind, then a timed one
    first_round = [k for rows, _, k in gen.calls[settle:settle + per_round]]
    second_round = [k for rows, _, k in gen.calls[settle + per_round:settle + 2 * per_round]]
    assert first_round[:12] == [0] * (PLAIN_LEAD_STEPS + 1) + [1, 1, 2, 2, 4, 4, 7, 7]
    assert second_round[:8] == [1, 1, 2, 2, 4, 4, 7, 7] and second_round[8:8 + PLAIN_LEAD_STEPS + 1] == [0] * 4
    assert model.meta["worst_cell_max_over_min"] == pytest.approx(1.0)  # no settling step among the samples


def test_measure_refuses_a_busy_or_too_small_generator():
    gen = FakeGenerator()
    gen.slots.running = {0: object()}
    with pytest.raises(DFlashError, match="idle generator"):
        measure(gen, CalibrationPlan((1,), (0,), (16,)))
    with pytest.raises(DFlashError, match="exceeds the allocation"):
        measure(FakeGenerator(slots=2), CalibrationPlan((1, 4), (0,), (16,)))


@pytest.fixture(scope="module")
def tiny_engine(pair, tmp_path_factory):
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec

    out = tmp_path_factory.mktemp("engine") / "e"
    return build_engine(BuildSpec(str(pair[0]), str(pair[1]), str(out), dtype="float32", max_batch_size=2,
                                  max_seq_len=160), "test")


def cli(module, *args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", f"trtllm_dflash.cli.{module}", *args], capture_output=True, text=True)


def test_build_calibrate_caches_with_the_engine_and_verify_ignores_it(tiny_engine):
    done = cli("build", "calibrate", str(tiny_engine), "--threads", "1", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    assert "context 128: ms per step" in done.stdout and "1 threads" in done.stdout
    files = list((tiny_engine / "calibration").glob("step-cost-*.json"))
    assert len(files) == 1 and f"cached in {files[0]}" in done.stdout
    assert cli("build", "verify", str(tiny_engine)).returncode == 0  # a runtime cache, not part of the build
    bad = cli("build", "calibrate", str(tiny_engine), "--max-batch-size", "3")
    assert bad.returncode == 2 and bad.stderr.strip() == \
        "dflash-build: error: --max-batch-size must be in 1..2 (the engine's), got 3"


def test_generate_with_a_fixed_draft_length_or_a_schedule(tiny_engine, tmp_path):
    import json

    args = ("--engine", str(tiny_engine), "--prompt-ids", "5,6,7,8", "--max-new-tokens", "20", "--ignore-eos",
            "--json")
    fixed = json.loads(cli("generate", *args, "--draft-len", "3").stdout)
    assert set(fixed["draft_lengths"]) == {3}
    schedule = tmp_path / "s.yaml"
    schedule.write_text("schedule: {1: 5, 4: 2}\n")
    scheduled = json.loads(cli("generate", *args, "--draft-len", str(schedule)).stdout)
    assert set(scheduled["draft_lengths"]) == {5} and scheduled["output_ids"] == fixed["output_ids"]
    for value, message in (("16", "--draft-len 16 exceeds this engine's largest draft length 15 (block size - 1)"),
                           ("often", "--draft-len must be 'auto', a number of draft tokens, or a draft_len_schedule "
                                     "file; got 'often'")):
        bad = cli("generate", *args, "--draft-len", value)
        assert bad.returncode == 2 and bad.stderr.strip() == f"dflash-generate: error: {message}"


class PlainOnlyFor(Scripted):
    """Scripted draft lengths; requests admitted while `plain_admissions` lasts are admitted plain-only."""

    def __init__(self, lengths, plain_admissions: int):
        super().__init__(lengths)
        self.plain_admissions = plain_admissions

    def drafts_for(self, batch):
        self.plain_admissions -= 1
        return self.plain_admissions < 0


class RecordingWrites:
    """Wraps a proposer and records the drafter's context K/V it writes (deferred tokens count once written):
    the slot of every written token (`slots`), and the (slot, position) pairs of each write (`commits`)."""

    def __init__(self, proposer):
        self.inner, self.slots, self.commits = proposer, [], []
        write = proposer.write

        def recording(slots, features, positions):
            self.slots += slots.tolist()
            self.commits.append([(s, p) for s, row in zip(slots.tolist(), positions.tolist()) for p in row])
            write(slots, features, positions)

        proposer.write = recording

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):  # what the generator sets (the block table) reaches the proposer
        if name in ("inner", "slots", "commits"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)


def capturing(gen) -> list:
    """Record the capture layer ids of every target pass of `gen`."""
    captures, forward = [], gen.target.forward

    def recording(ids, ctx):
        captures.append(ctx.capture_layer_ids)
        return forward(ids, ctx)

    gen.target.forward = recording
    return captures


def test_plain_only_admission_skips_the_drafter_and_stays_exact(pair, prompts):
    """A request admitted plain-only (the policy's drafts_for said no) gets no drafter context K/V and drafts
    nothing; a drafting request beside it drafts on in the same steps (the plain-only row verifies padding), with
    exactly the acceptance it has alone at the same draft lengths; outputs are the target's."""
    from transformers import AutoModelForCausalLM

    oracle = AutoModelForCausalLM.from_pretrained(pair[0]).eval()
    prompt_a, prompt_b = prompts[0][:20], prompts[1][:14]
    gen = load_pipeline(*pair).generator
    gen.proposer = writes = RecordingWrites(gen.proposer)
    gen.policy = PlainOnlyFor([15, 15, 0, 15, 7], plain_admissions=0)
    gen.allocate(2, 96, gen.block)
    a = gen.admit([Request(tuple(prompt_a), 48, ignore_eos=True)])[0]
    while len(a.result.output_ids) < 10:
        gen.step()
    gen.policy.plain_admissions = 1  # the next admission is plain-only
    b = gen.admit([Request(tuple(prompt_b), 24, ignore_eos=True)])[0]
    assert a.drafting and not b.drafting and (a.slot, b.slot) == (0, 1)
    together = len(a.result.draft_lengths)
    while gen.slots.running:
        gen.step()
    assert 1 not in writes.slots  # no drafter work for the plain-only request (nor for it in slot 0 once a left)
    assert writes.slots.count(0) == len(writes.slots)
    assert a.result.output_ids == hf_greedy(oracle, prompt_a, 48)
    assert b.result.output_ids == hf_greedy(oracle, prompt_b, 24)
    assert set(b.result.draft_lengths) == {0}  # b drafted nothing ...
    assert set(a.result.draft_lengths[together:together + len(b.result.draft_lengths)]) > {0}  # ... a did meanwhile
    alone = load_pipeline(*pair).generator
    alone.policy = Scripted(a.result.draft_lengths)
    again = alone.generate([Request(tuple(prompt_a), 48, ignore_eos=True)])[0]
    assert again.draft_lengths == a.result.draft_lengths and again.acceptance_lengths == a.result.acceptance_lengths
    assert max(a.result.acceptance_lengths[together:]) > 1


@pytest.mark.parametrize("sampled", [(True, True), (False, True), (True, False)], ids=["both", "plain-row", "drafting-row"])
def test_plain_only_rows_beside_drafting_ones_sample_as_they_would_alone(pair, prompts, sampled):
    """Seeded sampling (T = 1) in steps that mix a drafting row with a plain-only one: the plain-only row's tokens
    are those of a plain decode of it alone, and the drafting row's those of it alone at the same draft lengths
    (each row's uniforms are its own, so speculative sampling of the mixed step is each row's own: lossless as
    the plain and the drafting step are). Either row greedy, the other sampled, too (the mixed step then carries
    one-hot proposals for greedy drafting rows)."""
    from trtllm_dflash.sample.sampling import SamplingParams

    def params(on, seed):
        return SamplingParams(1.0, seed=seed) if on else SamplingParams()

    req_a = Request(tuple(prompts[0][:20]), 40, params(sampled[0], 11), ignore_eos=True)
    req_b = Request(tuple(prompts[1][:14]), 24, params(sampled[1], 12), ignore_eos=True)
    gen = load_pipeline(*pair).generator
    gen.policy = PlainOnlyFor([15, 3, 0, 8], plain_admissions=0)
    gen.allocate(2, 96, gen.block)
    a = gen.admit([req_a])[0]
    gen.step()
    gen.policy.plain_admissions = 1
    b = gen.admit([req_b])[0]
    while gen.slots.running:
        gen.step()
    assert set(b.result.draft_lengths) == {0} and {3, 8, 15} <= set(a.result.draft_lengths[1:])
    alone = load_pipeline(*pair).generator
    alone.policy = Scripted(a.result.draft_lengths)
    assert alone.generate([req_a])[0].output_ids == a.result.output_ids
    alone.policy = Scripted([0])
    assert alone.generate([req_b])[0].output_ids == b.result.output_ids


def test_draft_length_zero_runs_the_ops_of_plain_decoding(pair, prompts):
    """--draft-len 0 through the DFlash engine: requests are admitted plain-only, no target features are captured
    (prefill or steps) and no drafter context is written; outputs are the target's."""
    from transformers import AutoModelForCausalLM

    gen = load_pipeline(*pair).generator
    gen.proposer = writes = RecordingWrites(gen.proposer)
    gen.policy = FixedDraftLen(0)
    captures = capturing(gen)
    requests = [Request(tuple(p[:16]), 12, ignore_eos=True) for p in prompts[:2]]
    results = gen.generate(requests)
    oracle = AutoModelForCausalLM.from_pretrained(pair[0]).eval()
    assert [r.output_ids for r in results] == [hf_greedy(oracle, p[:16], 12) for p in prompts[:2]]
    assert writes.slots == [] and len(captures) == 12 and set(captures) == {()}  # prefill + 11 plain steps
    assert {k for r in results for k in r.draft_lengths} == {0}


class RecordingSteps(FixedDraftLen):
    """A fixed draft length that logs what the generator reports after each step."""

    def __init__(self, draft_len):
        super().__init__(draft_len)
        self.log = []

    def timed(self, rows, context, draft_len, seconds):
        self.log.append(("timed", rows, draft_len))

    def observe(self, slots, draft_len, accepted, drafting=None):
        self.log.append(("observe", len(slots), draft_len))

    def plain_only_step(self):
        self.log.append(("plain_only",))


def test_steps_of_plain_only_requests_alone_report_only_that_they_ran(pair, prompts):
    """A step whose rows are all plain-only teaches nothing (none of them drafts again): the policy hears
    `plain_only_step` instead of `timed` and `observe`. A step with a request that keeps the drafter's context
    beside a plain-only one reports both, for every row."""
    gen = load_pipeline(*pair).generator
    gen.policy = policy = RecordingSteps(3)
    gen.allocate(2, 96, gen.block)
    drafting = gen.admit([Request(tuple(prompts[0][:20]), 4, ignore_eos=True)])[0]
    plain_only = gen.admit([Request(tuple(prompts[1][:20]), 12, ignore_eos=True)], drafting=False)[0]
    while gen.slots.running:
        gen.step()
    mixed = len(drafting.result.draft_lengths)  # the steps while the drafting request ran
    assert 1 <= mixed < len(plain_only.result.draft_lengths)
    assert policy.log[: 2 * mixed] == [("timed", 2, 3), ("observe", 2, 3)] * mixed
    assert policy.log[2 * mixed:] == [("plain_only",)] * (len(plain_only.result.draft_lengths) - mixed)
    assert set(plain_only.result.draft_lengths) == {0}


def test_a_drafting_step_writes_the_drafters_context_of_kept_tokens_only(pair, prompts):
    """Each drafting step writes the drafter's context K/V of exactly the tokens the target kept (each row's
    anchor and accepted drafts, at their positions), not of the whole block; output stays the target's."""
    from transformers import AutoModelForCausalLM

    gen = load_pipeline(*pair).generator
    gen.proposer = record = RecordingWrites(gen.proposer)
    cut = [p[:12 + 7 * i] for i, p in enumerate(prompts[:2])]
    results = gen.generate([Request(tuple(p), 40, ignore_eos=True) for p in cut])
    oracle = AutoModelForCausalLM.from_pretrained(pair[0]).eval()
    assert [r.output_ids for r in results] == [hf_greedy(oracle, p, 40) for p in cut]
    steps = record.commits[1:]  # the first is the prefill's (every prompt position)
    assert len(steps) == max(len(r.acceptance_lengths) for r in results)
    first_done = min(len(r.acceptance_lengths) for r in results)  # the other request then moves to slot 0
    for slot, (prompt, result) in enumerate(zip(cut, results)):
        start = len(prompt)  # the anchor's position: the first output token sits there
        last = len(result.acceptance_lengths) - 1
        for i, kept in enumerate(result.acceptance_lengths):
            where = 0 if i >= first_done else slot
            written = sorted(p for s, p in steps[i] if s == where)
            # the last step may accept past max_new_tokens: the output keeps fewer than the target accepted
            assert written == list(range(start, start + kept)) if i < last else written[:kept] == list(
                range(start, start + kept))
            start += kept
    assert any(len(rows) < 2 * gen.block for rows in steps)  # drafts were rejected: fewer rows than the blocks


class DropsContextAfter(Scripted):
    """Scripted draft lengths; `keeps_context` says no from its `after`-th call (a plain step's) on."""

    def __init__(self, lengths, after: int):
        super().__init__(lengths)
        self.after, self.asked = after, 0

    def keeps_context(self, batch):
        self.asked += 1
        return [self.asked < self.after] * len(batch.slots)


def test_requests_that_stop_drafting_run_plain_decodings_ops_and_stay_exact(pair, prompts):
    """At a plain step the policy's keeps_context says no: every running request becomes plain-only. From then on
    no target features are captured, no drafter context is written and none is left deferred, no step drafts,
    and the outputs are the target's."""
    from transformers import AutoModelForCausalLM

    gen = load_pipeline(*pair).generator
    gen.proposer = writes = RecordingWrites(gen.proposer)
    gen.policy = DropsContextAfter([3, 0, 0, 2, 0], after=3)  # asked at steps 2, 3 and 5: no at step 5
    captures = capturing(gen)
    at_stop = []
    stop = gen.stop_drafting
    gen.stop_drafting = lambda running: (stop(running), at_stop.append((len(writes.slots), list(writes.inner.pending))))
    requests = [Request(tuple(p[:16]), 24, ignore_eos=True) for p in prompts[:2]]
    results = gen.generate(requests)
    oracle = AutoModelForCausalLM.from_pretrained(pair[0]).eval()
    assert [r.output_ids for r in results] == [hf_greedy(oracle, p[:16], 24) for p in prompts[:2]]
    assert at_stop == [(at_stop[0][0], [])] and len(writes.slots) == at_stop[0][0]  # nothing deferred, nothing after
    assert all(r.draft_lengths[:5] == [3, 0, 0, 2, 0] and set(r.draft_lengths[5:]) == {0} for r in results)
    # prefill and steps 1-4 capture; the stop comes before step 5 runs, so step 5 is plain decoding's already
    assert all(ids for ids in captures[:5]) and set(captures[5:]) == {()} and len(captures) > 8


class DropsSlot(Scripted):
    """Scripted draft lengths; `keeps_context` says no for `slot` (only) from its first call on."""

    def __init__(self, lengths, slot: int):
        super().__init__(lengths)
        self.slot = slot

    def keeps_context(self, batch):
        return [s != self.slot for s in batch.slots]


def test_one_request_stops_drafting_while_the_others_draft_on(pair, prompts):
    """keeps_context is per request: at a plain step one of two requests stops paying for the drafter's context.
    It writes no drafter context from then on and drafts nothing; the other drafts on in the same steps, with
    the acceptance it has alone at the same draft lengths; outputs are the target's."""
    from transformers import AutoModelForCausalLM

    gen = load_pipeline(*pair).generator
    gen.proposer = writes = RecordingWrites(gen.proposer)
    gen.policy = DropsSlot([4, 0, 15, 7], slot=1)
    cut = [p[:16] for p in prompts[:2]]
    at_stop = []
    stop = gen.stop_drafting
    gen.stop_drafting = lambda seqs: (at_stop.append(len(writes.slots)), stop(seqs))
    results = gen.generate([Request(tuple(p), 32, ignore_eos=True) for p in cut])
    oracle = AutoModelForCausalLM.from_pretrained(pair[0]).eval()
    assert [r.output_ids for r in results] == [hf_greedy(oracle, p, 32) for p in cut]
    assert len(at_stop) == 1 and 1 not in writes.slots[at_stop[0]:] and 0 in writes.slots[at_stop[0]:]
    assert results[1].draft_lengths[:2] == [4, 0] and set(results[1].draft_lengths[2:]) == {0}
    assert results[0].draft_lengths[:4] == [4, 0, 15, 7]
    alone = load_pipeline(*pair).generator
    alone.policy = Scripted(results[0].draft_lengths)
    again = alone.generate([Request(tuple(cut[0]), 32, ignore_eos=True)])[0]
    assert again.acceptance_lengths == results[0].acceptance_lengths


class Manual(DraftLenPolicy):
    """The draft length the test sets (`k`), every step."""

    k = 0

    def choose(self, batch):
        return self.k


def test_deferred_context_of_a_request_that_ends_before_any_drafting_step_is_never_written(pair, prompts):
    """Plain steps put off the drafter's context K/V until a drafter pass reads it. A request that ends before any
    drafting step never has its context written, and its slot's next owner gets only its own: no (slot, position)
    is written twice, and its drafts are accepted exactly as when it decodes alone at the same draft lengths (a
    stale context would change what the drafter proposes). Outputs are the target's."""
    from transformers import AutoModelForCausalLM

    gen = load_pipeline(*pair).generator
    gen.proposer = writes = RecordingWrites(gen.proposer)
    gen.policy = policy = Manual()
    gen.prefix_caching = False  # with it, a finished request's context is written to be cached with its blocks
    gen.allocate(2, 128, gen.block)
    a, b = gen.admit([Request(tuple(prompts[0][:24]), 6, ignore_eos=True),
                      Request(tuple(prompts[1][:18]), 16, ignore_eos=True)])
    moves = []
    gen.caches.move = lambda seq, dst: moves.append(dst)  # (none: b, in slot 1, ends before c in slot 0)
    while not a.done:
        gen.step()
    assert writes.slots == []  # every step so far was plain: nothing written yet
    c = gen.admit([Request(tuple(prompts[2][:20]), 64, ignore_eos=True)])[0]  # outlives b: no move to slot 0
    assert c.slot == 0
    gen.step()  # a plain step of b and c: deferred
    policy.k = 15
    while gen.slots.running:
        gen.step()
    written = [pair for commit in writes.commits for pair in commit]
    assert moves == [] and len(written) == len(set(written))  # nothing of a's under c's positions in slot 0
    assert {p for s, p in written if s == 0} >= set(range(20))  # c's prompt context, from its prefill
    oracle = AutoModelForCausalLM.from_pretrained(pair[0]).eval()
    for seq, prompt in ((b, prompts[1][:18]), (c, prompts[2][:20])):
        assert seq.result.output_ids == hf_greedy(oracle, prompt, seq.request.max_new_tokens)
        alone = load_pipeline(*pair).generator
        alone.policy = Scripted(seq.result.draft_lengths)
        again = alone.generate([Request(tuple(prompt), seq.request.max_new_tokens, ignore_eos=True)])[0]
        assert again.acceptance_lengths == seq.result.acceptance_lengths
    assert max(c.result.acceptance_lengths) > 1  # the drafter's context was real: drafts were accepted


def test_a_drafting_step_writes_the_prompts_deferred_context_before_its_timer_and_the_plain_steps_within(
        pair, prompts, monkeypatch):
    """Before a drafting step the prompts' deferred context is written outside the step's time (admission's cost,
    which no step model prices); the plain steps' deferred context is part of the drafting step that needs it."""
    import time

    import trtllm_dflash.engine.generator as generator_module

    gen = load_pipeline(*pair).generator
    gen.proposer = writes = RecordingWrites(gen.proposer)
    gen.policy = policy = Manual()
    gen.allocate(2, 96, gen.block)
    gen.admit([Request(tuple(prompts[0][:12]), 20, ignore_eos=True)])
    gen.step()
    gen.step()  # two plain steps: positions 12 and 13 deferred
    assert writes.commits == []
    with torch.inference_mode():  # as the generator's steps call it
        gen.proposer.flush(prompts_only=True)
    assert writes.commits == [[(0, p) for p in range(12)]]  # the prompt only
    gen.admit([Request(tuple(prompts[1][:9]), 20, ignore_eos=True)])
    clock = []  # writes made before each clock read of the step (the first: its start)

    class Clock:
        @staticmethod
        def perf_counter():
            clock.append(len(writes.commits))
            return time.perf_counter()

    monkeypatch.setattr(generator_module, "time", Clock)
    policy.k = 3
    gen.step()
    assert writes.commits[1] == [(1, p) for p in range(9)]  # slot 1's prompt, before the step's timer
    assert clock[0] == 2 and sorted(writes.commits[2]) == [(0, 12), (0, 13)]  # slot 0's plain steps, in the step


def test_a_worker_rank_follows_the_stop_of_drafting(pair, prompts, monkeypatch):
    """Tensor parallel: rank 0's generator sends the stop with the slots, and a worker replaying rank 0's messages
    ends in the same state with the same output (its steps capture nothing from then on either)."""
    from trtllm_dflash.serve import lockstep

    sent = []
    monkeypatch.setattr(lockstep, "broadcast", lambda message=None: sent.append(message))
    spec = load_pipeline(*pair).generator
    rank0 = lockstep.LockstepGenerator(spec.target, spec.proposer, spec.default_stop_ids)
    rank0.policy = DropsContextAfter([2, 0], after=1)
    request = Request(tuple(prompts[0][:16]), 12, ignore_eos=True)
    rank0.allocate(2, 64, rank0.block)
    seq = rank0.admit([request])[0]
    while rank0.slots.running:
        rank0.step()
    assert ("stop_drafting", ([seq.slot],)) in sent and not seq.drafting
    worker = load_pipeline(*pair).generator
    captures = capturing(worker)
    messages = iter(sent + [("stop", ())])
    monkeypatch.setattr(lockstep, "broadcast", lambda message=None: next(messages))
    lockstep.follow(worker)
    assert len(captures) == len(seq.result.draft_lengths) + 1  # prefill and every step
    assert all(ids for ids in captures[:2]) and set(captures[2:]) == {()}
    assert seq.result.draft_lengths[:2] == [2, 0] and set(seq.result.draft_lengths[2:]) == {0}


def test_a_worker_rank_moves_requests_as_rank_0_does(pair, prompts, monkeypatch):
    """Tensor parallel: requests move into free slots inside the step, on every rank alike (no message needed):
    a worker replaying rank 0's messages makes the same moves and emits the same tokens."""
    from trtllm_dflash.serve import lockstep

    sent = []
    monkeypatch.setattr(lockstep, "broadcast", lambda message=None: sent.append(message))
    spec = load_pipeline(*pair).generator
    rank0 = lockstep.LockstepGenerator(spec.target, spec.proposer, spec.default_stop_ids)
    moves = {"rank0": [], "worker": []}

    def recording(gen, name):
        move = gen.caches.move
        gen.caches.move = lambda seq, dst: (moves[name].append((seq.slot, dst)), move(seq, dst))

    recording(rank0, "rank0")
    rank0.allocate(3, 96, rank0.block)
    seqs = rank0.admit([Request(tuple(p[:16]), n, ignore_eos=True) for p, n in zip(prompts[:3], (4, 30, 40))])
    while rank0.slots.running:
        rank0.step()
    assert moves["rank0"] and moves["rank0"][0] == (2, 0)
    worker = load_pipeline(*pair).generator
    recording(worker, "worker")
    admitted = []
    admit = worker.admit
    worker.admit = lambda *args: admitted.extend(admit(*args)) or admitted
    messages = iter(sent + [("stop", ())])
    monkeypatch.setattr(lockstep, "broadcast", lambda message=None: next(messages))
    lockstep.follow(worker)
    assert moves["worker"] == moves["rank0"]
    assert [s.result.output_ids for s in admitted] == [s.result.output_ids for s in seqs]


class RecordingEnds(PlainOnlyFor):
    """PlainOnlyFor that logs every observe and release, in order."""

    def __init__(self, lengths, plain_admissions: int):
        super().__init__(lengths, plain_admissions)
        self.log = []

    def observe(self, slots, draft_len, accepted, drafting=None):
        self.log.append(("observe", tuple(slots)))

    def release(self, slot, drafting):
        self.log.append(("release", slot, drafting))


def test_the_policy_hears_of_each_request_ending_once_after_its_last_step(pair, prompts):
    """`release(slot, drafting)` (how the cost policy judges a prompt length's newcomer probes): once per request,
    after the last step that ran it, with whether it still kept the drafter's context; a cancelled request too."""
    gen = load_pipeline(*pair).generator
    gen.policy = policy = RecordingEnds([15, 0, 3], plain_admissions=0)
    gen.allocate(3, 96, gen.block)
    a, b = gen.admit([Request(tuple(prompts[0][:20]), 9, ignore_eos=True),
                      Request(tuple(prompts[1][:20]), 30, ignore_eos=True)])
    policy.plain_admissions = 1
    c = gen.admit([Request(tuple(prompts[2][:20]), 30, ignore_eos=True)])[0]
    while a.slot in gen.slots.running:
        gen.step()
    gen.cancel(c, "cancelled")
    while gen.slots.running:
        gen.step()
    releases = [entry for entry in policy.log if entry[0] == "release"]
    assert releases == [("release", 0, True), ("release", 2, False), ("release", b.slot, True)]
    for _, slot, _ in releases:  # each after the last step whose rows held the slot, before the slot's next use
        at = policy.log.index(("release", slot, slot != 2))
        assert any(slot in entry[1] for entry in policy.log[:at] if entry[0] == "observe")
    assert policy.log[-1] == ("release", b.slot, True) and b.slot in policy.log[-2][1]
