"""Compiled and padded decode steps (step_mode.py) compute what eager steps compute: greedy output equals
transformers' whatever the draft lengths, padding rows (free slots) and padding drafts change no request's
tokens, a warmed-up engine compiles nothing more while requests come and go, and a target that cannot compile
runs eager with one warning. CUDA graphs themselves (inductor's reduce-overhead mode) need a GPU: the padded,
compiled step they record is what runs here."""

import pytest
import torch
from helpers.oracle import hf_greedy
from helpers.scripted import Cycle
from helpers.tiny_models import make_hf_target
from transformers import AutoModelForCausalLM
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.compilation.step_mode import GRAPH_SHAPES, StepMode, StepShapes
from trtllm_dflash.draft_length.policy import DraftLenPolicy
from trtllm_dflash.sample.sampling import SamplingParams
from trtllm_dflash.utils.errors import DFlashError

pytestmark = pytest.mark.slow  # compiles the decode steps

SHAPES = StepShapes(min_span=16)  # small buckets, so short test contexts cross several
SHAPES_2 = StepShapes(min_span=16, min_rows=2, min_width=2)  # cuda-graphs' minimum sizes: no compiled size is 1


@pytest.fixture(scope="module")
def oracle(pair):
    return AutoModelForCausalLM.from_pretrained(pair[0]).eval()


@pytest.fixture(scope="module")
def compiled(pair):
    return load_pipeline(*pair, step_mode="compile")  # the load-time warm-up compiles every graph


def graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def serve(gen, prompts, plain_only=2) -> list:
    """As a server runs: one allocation of 4 slots; requests of different lengths join while others run (the
    `plain_only`-th one without the drafter's context), finish, and leave free slots that later requests fill or
    that running ones move into. -> the results in prompt order."""
    gen.allocate(4, 160, gen.block)
    gen.policy = Cycle()
    waiting = [Request(tuple(p), 20 + 9 * (i % 3), ignore_eos=True) for i, p in enumerate(prompts)]
    sequences = gen.admit(waiting[:2])
    waiting = waiting[2:]
    while gen.slots.running or waiting:
        gen.step()
        if waiting and len(gen.slots.free()) >= 2:  # two join at once, one of them plain-only
            sequences += gen.admit([waiting.pop(0)], drafting=len(sequences) != plain_only)
            sequences += gen.admit([waiting.pop(0)]) if waiting else []
    return [s.result for s in sequences]


def test_compiled_steps_equal_transformers_and_compile_nothing_after_the_load(compiled, prompts, oracle):
    gen = compiled.generator
    before = graphs()
    results = serve(gen, prompts)
    assert graphs() == before  # batch sizes 1-4, draft lengths 0-15, moves, a plain-only row: no new graph
    assert not gen.verify_pass.failed and not gen.proposer.draft_pass.failed and not gen.prefill_pass.failed
    for prompt, result in zip(prompts, results):
        assert result.output_ids == hf_greedy(oracle, prompt, len(result.output_ids))
    assert sum(r.accepted_tokens for r in results) > 0


@pytest.mark.parametrize("mode", ["eager", "compile"])
@pytest.mark.parametrize("shapes", [SHAPES, SHAPES_2], ids=["from-1", "from-2"])
def test_padded_steps_equal_transformers(pair, compiled, prompts, oracle, mode, shapes):
    """The CUDA-graph step's padding on the CPU: rows rounded up to a power of two (free slots), the verify width
    to a power of two (padding drafts past each row's k), the key span to a bucket; eager and compiled. From 2
    (cuda-graphs' default): a lone request steps as two rows and a plain step as two tokens per row, so no pass
    has a size of 1 (one compiled graph per pass), except plain decoding's: plain-only requests alone step one
    token per row without capturing the target's features, as the plain engine does."""
    gen = compiled.generator if mode == "compile" else load_pipeline(*pair).generator
    gen.set_step_mode(StepMode(mode, shapes))
    passes, drafter_rows = [], []  # (rows, width, key span, running requests); the drafter's rows
    plain_only = []  # (width, features captured) of the passes where no running request keeps the drafter's context
    verify, draft = gen.verify_pass, gen.proposer.draft_pass

    def spy(ids, ctx):
        keeping = any(s.drafting for s in gen.slots.running.values())
        (passes if keeping else plain_only).append((*ids.shape, ctx.kv_len, len(gen.slots.running)))
        if not keeping:
            plain_only[-1] = (ids.shape[1], bool(ctx.capture_layer_ids))
        return verify(ids, ctx)

    gen.verify_pass = spy
    gen.proposer.draft_pass = lambda x, ctx: drafter_rows.append(len(x)) or draft(x, ctx)
    try:
        results = serve(gen, prompts)
        served = len(passes)
        lone = gen.generate([Request(tuple(prompts[2]), 20, ignore_eos=True)])[0]  # one slot
        assert mode == "eager" or not (verify.failed or draft.failed)
    finally:
        gen.verify_pass, gen.proposer.draft_pass = verify, draft
        gen.set_step_mode(StepMode(mode))
    for prompt, result in zip(prompts + [prompts[2]], results + [lone]):
        assert result.output_ids == hf_greedy(oracle, prompt, len(result.output_ids))
    smallest = shapes.min_rows
    # plain-only requests alone run plain decoding's pass: one token per row, no features captured
    assert plain_only and set(plain_only) == {(1, False)}
    assert all(rows in (1, 2, 4) and rows >= max(n, smallest) for rows, _, _, n in passes)
    assert any(rows > n for rows, _, _, n in passes)  # three requests ran as four rows (or one as two)
    widths = {width for _, width, _, _ in passes}
    assert widths == ({1, 2, 4, 8, 16} if smallest == 1 else {2, 4, 8, 16})  # k = 2, 3 as 4 tokens; 7 as 8 ...
    assert all(span in (16, 32, 64, 128, 160) for _, _, span, _ in passes[:served])  # 160: the capacity
    # the lone request's allocation (`generate` sizes it: 57 positions) is rounded up to StepShapes.align, so its
    # widest span is 64, not 57: every span is aligned, as CUDA's compiled graphs guard (step_mode.StepShapes)
    assert {span for _, _, span, _ in passes[served:]} >= {64} and all(span % 16 == 0 for _, _, span, _ in passes)
    assert gen.capacity == len(prompts[2]) + 20 + gen.block + 1 and gen.cache.capacity == 64  # validated: 57
    # a compiled drafter runs every row (an eager one gathers the drafting rows of a mixed step: fewer)
    assert drafter_rows and (mode == "eager" or min(drafter_rows) == smallest)


def test_padding_rows_change_no_sampled_token(pair, prompts):
    """Padding rows are free slots stepping junk: seeded sampled requests draw the same tokens (plain steps: no
    width padding, the rows' random streams are their own)."""
    outputs = []
    for shapes in (None, SHAPES, SHAPES_2):
        gen = load_pipeline(pair[0]).generator
        gen.set_step_mode(StepMode("eager", shapes))
        gen.allocate(4, 100, gen.block)
        requests = [Request(tuple(p), 24, SamplingParams(0.9, top_k=20, seed=i), ignore_eos=True)
                    for i, p in enumerate(prompts[:3])]
        sequences = gen.admit(requests)
        while gen.slots.running:
            gen.step()  # three rows, and with SHAPES a fourth: the free slot; SHAPES_2 pads plain steps' width too
        lone = gen.generate([Request(tuple(prompts[3]), 24, SamplingParams(0.9, top_k=20, seed=7), ignore_eos=True)])
        outputs.append([s.result.output_ids for s in sequences] + [lone[0].output_ids])
    assert outputs[0] == outputs[1] == outputs[2] and len(set(map(tuple, outputs[0]))) == 4


def test_a_target_that_does_not_compile_runs_eager_with_one_warning(tmp_path, capfd):
    """gpt-oss's experts run torch's grouped GEMM, whose compiled kernel takes bf16 only: in float32 the target's
    cached pass and its prefill fail to compile at the load's warm-up, each warns once, and it decodes exactly,
    eagerly."""
    hf = make_hf_target(tmp_path / "t", "gpt_oss", seed=3)
    pipeline = load_pipeline(tmp_path / "t", step_mode="compile")
    gen = pipeline.generator
    assert gen.verify_pass.failed and "bf16" in gen.verify_pass.failed.lower()
    assert gen.prefill_pass.failed and "bf16" in gen.prefill_pass.failed.lower()
    prompt = [5, 6, 7, 8, 9, 10, 11]
    assert gen.generate([Request(tuple(prompt), 16, ignore_eos=True)])[0].output_ids == hf_greedy(hf, prompt, 16)
    warnings = [line for line in capfd.readouterr().err.splitlines() if "does not compile" in line]
    assert len(warnings) == 2 and {w.split(" does not")[0].split("the ")[-1] for w in warnings} == {
        "TargetModel pass", "TargetModel prefill"}  # once per pass


def test_step_modes_are_validated():
    assert StepMode.resolve(None, "cpu").mode == "eager" and StepMode.resolve("auto", "cpu").mode == "eager"
    assert StepMode.resolve("compile", "cpu").shapes is None and StepMode("cuda-graphs").shapes == GRAPH_SHAPES
    assert GRAPH_SHAPES == StepShapes(min_span=256, min_rows=2, min_width=2)
    with pytest.raises(DFlashError, match="cuda-graphs needs a CUDA device, got 'cpu'"):
        StepMode.resolve("cuda-graphs", "cpu")
    with pytest.raises(DFlashError, match="step mode must be one of eager, compile, cuda-graphs .* got 'fast'"):
        StepMode("fast")
    shapes = StepShapes(min_span=256)
    assert [shapes.rows(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8] and shapes.rows(5, 6) == 6
    assert [shapes.width(t, 16) for t in (1, 2, 3, 9, 16)] == [1, 2, 4, 16, 16]
    assert [shapes.span(n) for n in (10, 256, 257, 5000)] == [256, 256, 512, 8192]
    assert [GRAPH_SHAPES.rows(n, 8) for n in (1, 2, 3)] == [2, 2, 4] and GRAPH_SHAPES.rows(1, 1) == 1
    assert [GRAPH_SHAPES.width(t, 16) for t in (1, 2, 3)] == [2, 2, 4] and GRAPH_SHAPES.width(1, 1) == 1


class TimedRecorder(DraftLenPolicy):
    """Whole-block drafts every other step; records which steps the generator times for the live cost correction."""

    def __init__(self):
        self.steps, self.timed_steps = 0, []

    def choose(self, batch):
        self.steps += 1
        return 15 if self.steps % 2 else 0

    def timed(self, rows, context, draft_len, seconds):
        self.timed_steps.append(self.steps)


def test_a_padded_shapes_first_steps_since_the_allocation_are_not_fed_to_the_live_cost(pair, prompts):
    """Their time is CUDA graphs' warm-up and recording (StepMode.settle_calls; one call in eager mode), not a
    step's; a new allocation records every shape again."""
    gen = load_pipeline(*pair).generator
    gen.set_step_mode(StepMode("eager", SHAPES))
    shapes, verify = [], gen.verify_pass
    gen.verify_pass = lambda ids, ctx: shapes.append((*ids.shape, ctx.kv_len)) or verify(ids, ctx)
    try:
        for _ in range(2):  # two allocations, the same requests
            gen.policy, shapes[:] = TimedRecorder(), []
            gen.allocate(2, 120, gen.block)
            gen.admit([Request(tuple(p), 30, ignore_eos=True) for p in prompts[:2]])
            while gen.slots.running:
                gen.step()
            seen = [shape in shapes[:i] for i, shape in enumerate(shapes)]
            assert gen.policy.timed_steps == [i + 1 for i, again in enumerate(seen) if again]
            assert 0 < len(gen.policy.timed_steps) < len(shapes)
    finally:
        gen.verify_pass = verify
        gen.set_step_mode(StepMode("eager"))
