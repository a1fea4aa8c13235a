"""Lossless greedy decoding, batching, stopping, block sizes: against transformers' greedy output."""

import pytest
import torch
from helpers.host_traffic import host_traffic_of_steps
from helpers.oracle import hf_greedy
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from helpers.tiny_pair import held_out_prompts
from trtllm_dflash.utils.errors import DFlashError

PROMPTS = [list(range(3, 15)), [7, 50, 2, 9], list(range(60, 90)), [11]]


@pytest.mark.parametrize("block", [8, 3])
def test_greedy_dflash_equals_target_greedy(hf_target, random_drafter, block):
    hf, target_dir = hf_target
    gen = load_pipeline(target_dir, random_drafter).generator
    for prompt in PROMPTS:
        result = gen.generate([Request(tuple(prompt), 24, ignore_eos=True)], block)[0]
        assert result.output_ids == hf_greedy(hf, prompt, 24)
        assert len(result.output_ids) == 1 + sum(result.acceptance_lengths)


def test_plain_decoding_equals_target_greedy(hf_target):
    hf, target_dir = hf_target
    gen = load_pipeline(target_dir).generator
    result = gen.generate([Request(tuple(PROMPTS[0]), 20, ignore_eos=True)])[0]
    assert result.output_ids == hf_greedy(hf, PROMPTS[0], 20)
    assert result.acceptance_lengths == [1] * 19 and result.tau == 1.0 and result.drafted_tokens == 0


def test_batched_equals_one_by_one_with_real_acceptance(builtin):
    """Different prompt lengths and different acceptance per row; each row exactly as alone."""
    gen = load_pipeline(*builtin).generator
    prompts = [p[: 6 + 3 * i] for i, p in enumerate(held_out_prompts(5))]
    requests = [Request(tuple(p), 40 + 7 * i, ignore_eos=True) for i, p in enumerate(prompts)]
    together = gen.generate(requests)
    alone = [gen.generate([r])[0] for r in requests]
    ar = load_pipeline(builtin[0]).generator.generate(requests)
    for t, a, plain, r in zip(together, alone, ar, requests):
        assert t.output_ids == a.output_ids == plain.output_ids
        assert t.acceptance_lengths == a.acceptance_lengths
        assert len(t.output_ids) == r.max_new_tokens
    assert len({tuple(t.acceptance_lengths) for t in together}) > 1
    assert max(max(t.acceptance_lengths) for t in together) > 1


def test_stop_token_truncates_and_ignore_eos_runs_to_the_limit(hf_target, random_drafter):
    hf, target_dir = hf_target
    gen = load_pipeline(target_dir, random_drafter).generator
    free = hf_greedy(hf, PROMPTS[2], 30)
    stop = free[9]
    first = free.index(stop)
    result = gen.generate([Request(tuple(PROMPTS[2]), 30, stop_ids=(stop,))])[0]
    assert result.output_ids == free[: first + 1] and result.finish_reason == "stop"
    assert sum(result.acceptance_lengths) + 1 == len(result.output_ids)
    ignoring = gen.generate([Request(tuple(PROMPTS[2]), 30, stop_ids=(stop,), ignore_eos=True)])[0]
    assert ignoring.output_ids == free and ignoring.finish_reason == "length"


def test_default_stop_is_the_generation_config_eos(builtin):
    pipe = load_pipeline(*builtin)
    assert pipe.target.stop_ids == (256,)
    assert pipe.generator.default_stop_ids == (256,)


def test_block_size_lowerable_not_raisable(builtin):
    gen = load_pipeline(*builtin).generator
    request = Request(tuple(held_out_prompts(1)[0]), 30, ignore_eos=True)
    full = gen.generate([request])[0]
    for block in (1, 2, 5):
        lowered = gen.generate([request], block)[0]
        assert lowered.output_ids == full.output_ids
        assert max(lowered.acceptance_lengths) <= block
    with pytest.raises(DFlashError, match="block size 9 exceeds the drafter's trained block_size 8"):
        gen.generate([request], 9)


def test_statistics_are_consistent(builtin):
    gen = load_pipeline(*builtin).generator
    r = gen.generate([Request(tuple(held_out_prompts(1)[0]), 50, ignore_eos=True)])[0]
    assert r.tau == pytest.approx(sum(r.acceptance_lengths) / len(r.acceptance_lengths))
    # accepted counts what the target accepted; the last step may be cut at the length limit
    assert sum(r.acceptance_lengths) - len(r.acceptance_lengths) <= r.accepted_tokens <= r.drafted_tokens
    assert r.drafted_tokens == 7 * len(r.acceptance_lengths)
    assert 0 < r.ttft_s < r.finish_s - r.start_s
    assert r.tpot_s == pytest.approx((r.finish_s - r.first_token_s) / 49)
    assert r.tokens_per_s == pytest.approx(50 / (r.finish_s - r.start_s))


def test_torch_bfloat16_runs(builtin):
    gen = load_pipeline(*builtin, dtype=torch.bfloat16).generator
    r = gen.generate([Request(tuple(held_out_prompts(1)[0]), 16, ignore_eos=True)])[0]
    assert len(r.output_ids) == 16 and all(0 <= t < 258 for t in r.output_ids)


def test_greedy_rows_stay_exact_beside_sampled_rows(builtin):
    """One batch, per-request sampling settings: the greedy row is unaffected by its neighbours."""
    from trtllm_dflash.sample.sampling import SamplingParams

    pipe = load_pipeline(*builtin)
    prompts = held_out_prompts(3)
    greedy = Request(tuple(prompts[0]), 40, ignore_eos=True)
    mixed = pipe.generator.generate([
        Request(tuple(prompts[1]), 40, SamplingParams(1.0, seed=1), ignore_eos=True),
        greedy,
        Request(tuple(prompts[2]), 40, SamplingParams(0.7, top_k=5, seed=2), ignore_eos=True),
    ])
    plain = load_pipeline(builtin[0]).generator.generate([greedy])[0]
    assert mixed[1].output_ids == plain.output_ids
    assert all(len(r.output_ids) == 40 for r in mixed)
    assert pipe.generator.generate([]) == []


def test_inflight_admission_joins_and_leaves_between_steps(builtin):
    """Requests join a running batch mid-decode and reuse freed slots; each decodes as if alone."""
    gen = load_pipeline(*builtin).generator
    prompts = held_out_prompts(5)
    requests = [Request(tuple(p[: 4 + 3 * i]), 12 + 6 * i, ignore_eos=True) for i, p in enumerate(prompts)]
    alone = [gen.generate([r])[0].output_ids for r in requests]
    gen.allocate(num_slots=3, capacity=128, block=8)
    first = gen.admit(requests[:1])
    gen.step(), gen.step()
    later = gen.admit(requests[1:3])
    assert {s.slot for s in first + later} == {0, 1, 2} and not gen.slots.free()
    with pytest.raises(DFlashError, match="1 requests but only 0 free slots"):
        gen.admit(requests[3:4])
    done = first + later
    pending = list(requests[3:])
    while gen.slots.running or pending:
        gen.step()
        while pending and gen.slots.free():
            done += gen.admit([pending.pop(0)])
    by_request = {id(s.request): s.result.output_ids for s in done}
    assert [by_request[id(r)] for r in requests] == alone
    with pytest.raises(DFlashError, match="exceeds this engine's sequence capacity"):
        gen.admit([Request((5,), 200)])


def test_running_requests_move_into_free_slots_below_them(builtin):
    """Requests in slots 0, 1 finish first: the survivors in slots 2 and 3 move into slots 0 and 1, so later steps
    run two rows read in place (no cache gathered every step, no junk rows). Drafting and plain steps both; the
    greedy row equals decoding alone, and the seeded sampled row draws what it draws alone."""
    from trtllm_dflash.draft_length.policy import FixedDraftLen
    from trtllm_dflash.sample.sampling import SamplingParams

    gen = load_pipeline(*builtin).generator
    prompts = held_out_prompts(4)
    requests = [Request(tuple(prompts[0][:8]), 5, ignore_eos=True), Request(tuple(prompts[1][:9]), 3, ignore_eos=True),
                Request(tuple(prompts[2][:10]), 60, ignore_eos=True),
                Request(tuple(prompts[3][:7]), 60, SamplingParams(0.8, seed=11), ignore_eos=True)]
    for policy in (FixedDraftLen(), FixedDraftLen(0)):
        gen.policy = policy
        alone = [gen.generate([r])[0].output_ids for r in requests]
        steps = []
        forward = gen.target.forward
        gen.target.forward = lambda ids, ctx: steps.append((ids.shape[0], ctx.prefilling, ctx.rows)) or forward(ids, ctx)
        try:
            together = gen.generate(requests)
        finally:
            del gen.target.forward
        assert [r.output_ids for r in together] == alone
        assert steps[0][:2] == (4, True)  # the prefill, then steps of all four, then of two
        assert steps[1] == (4, False, None) and (2, False, None) in steps
        assert all(rows is None for _, _, rows in steps[1:])  # every step reads slots 0..n-1 in place


@pytest.mark.parametrize("padded", [False, True])
def test_a_decode_step_copies_nothing_from_the_host_and_reads_the_device_once(builtin, monkeypatch, padded):
    """Issue 15's rule, checked structurally on the CPU (on a GPU each of these is a host sync or a blocking copy):
    during steps that draft, decode plainly, mix a plain-only row with drafting ones, sample (plain and top-k) and
    move a request into a free slot, nothing builds a tensor from host data and the device is read once per step
    (the emitted tokens: one [B, k + 2] copy); no .item(), .cpu(), .numpy() or Python conversion of a tensor.
    padded: the CUDA-graph step's shapes (rows, width and key span rounded up to buckets), eagerly."""
    from trtllm_dflash.compilation.step_mode import StepMode, StepShapes
    from trtllm_dflash.sample.sampling import SamplingParams

    gen = load_pipeline(*builtin).generator
    gen.set_step_mode(StepMode("eager", StepShapes(min_span=16) if padded else None))
    prompts = held_out_prompts(3)
    gen.allocate(4, 200, gen.block)
    gen.admit([Request(tuple(prompts[0][:20]), 3, SamplingParams(1.0, seed=1), ignore_eos=True)])
    plain_only = gen.admit([Request(tuple(prompts[1][:20]), 60, ignore_eos=True)], drafting=False)[0]
    gen.admit([Request(tuple(prompts[2][:20]), 60, SamplingParams(0.7, top_k=5, seed=2), ignore_eos=True)])
    moved = []
    move = gen.caches.move
    gen.caches.move = lambda seq, dst: (moved.append(dst), move(seq, dst))
    lengths = (4, 0, 4, 0, 4, 4, 0)
    calls = host_traffic_of_steps(gen, lengths, monkeypatch)
    assert calls == ["tolist"] * len(lengths)
    assert moved == [0] and not plain_only.drafting and len(gen.slots.running) == 2
