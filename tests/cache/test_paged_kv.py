"""The paged KV cache: admission by free blocks, preemption, prefix reuse and chunked prefill, each against
transformers' greedy output (oracle.hf_greedy) and the pool's own accounting."""

import pytest
from helpers.oracle import hf_greedy
from helpers.tiny_models import add_tokenizer, hf_generate, make_hf_hybrid, make_hf_target, write_drafter
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.cache.block_pool import block_hashes
from trtllm_dflash.cache.kv_cache import BLOCK

PROMPTS = [list(range(3, 15)), [7, 50, 2, 9], list(range(60, 90)), [11, 12, 13], list(range(20, 41))]
NEW = 18


def serve(gen, requests):
    """Admit what the pool takes, step, repeat (what serve/loop.py does) -> results in request order."""
    waiting, done = list(requests), []
    while waiting or gen.live():
        n = gen.admissible(waiting)
        if n:
            done += gen.admit(waiting[:n])
            del waiting[:n]
        gen.step()
    by_request = {id(s.request): s.result for s in done}
    return [by_request[id(r)] for r in requests]


def test_a_tiny_pool_admits_by_blocks_preempts_and_keeps_every_token(hf_target, random_drafter):
    """Five requests, three rows, a pool of 7 blocks: requests wait for blocks, running ones are preempted and
    recomputed, and every output equals transformers' greedy decoding."""
    hf, target_dir = hf_target
    gen = load_pipeline(target_dir, random_drafter).generator
    gen.allocate(3, 128, 4, num_blocks=7)
    requests = [Request(tuple(p), NEW, ignore_eos=True) for p in PROMPTS]
    results = serve(gen, requests)
    assert gen.preemptions > 0
    for result, prompt in zip(results, PROMPTS):
        assert result.output_ids == hf_greedy(hf, prompt, NEW)
    assert gen.pool.used() == 0  # every block back (cached ones are free too)


def test_admission_counts_blocks_not_rows(hf_target, random_drafter):
    gen = load_pipeline(hf_target[1], random_drafter).generator
    gen.allocate(4, 256, 8, num_blocks=6)
    request = Request(tuple(range(5, 45)), 8, ignore_eos=True)  # 40 tokens + anchor + block of 8: 4 blocks
    assert gen.admissible([request, request]) == 1
    gen.admit([request])
    assert gen.admissible([request]) == 0 and len(gen.slots.free()) == 3


def test_block_hashes_chain_every_token_before():
    a = block_hashes(list(range(40)))
    b = block_hashes([1] + list(range(1, 40)))
    assert len(a) == 40 // BLOCK and a[0] != b[0] and a[1] != b[1]  # block 1 equal, its prefix not
    assert block_hashes(list(range(40)))[:2] == a


SYSTEM = list(range(30, 70))  # 40 tokens: two full blocks shared by every request below


def test_prefix_hits_reuse_blocks_and_keep_every_token(hf_target, random_drafter):
    """A first request with a shared 40-token prefix finishes; three more with the same prefix reuse its two full
    blocks (K/V and drafter context) and prefill only their own tokens; outputs equal transformers'."""
    hf, target_dir = hf_target
    gen = load_pipeline(target_dir, random_drafter).generator
    gen.allocate(3, 128, 4)
    prompts = [SYSTEM + [5 + i, 9, 3 + i] for i in range(4)]
    requests = [Request(tuple(p), 12, ignore_eos=True) for p in prompts]
    results = serve(gen, requests[:1]) + serve(gen, requests[1:])
    assert gen.pool.hit_requests == 3 and gen.pool.hit_tokens == 3 * 2 * BLOCK
    for result, prompt in zip(results, prompts):
        assert result.output_ids == hf_greedy(hf, prompt, 12)


def test_plain_only_blocks_serve_plain_only_requests_and_drafting_ones_replace_them(hf_target, random_drafter):
    """A plain-only request's full blocks are cached without the drafter's context: a later plain-only request
    reuses them, a drafting one does not (it prefills, and its blocks, with context, replace them in the cache),
    and the next drafting request reuses those. Every output equals transformers' greedy decoding."""
    hf, target_dir = hf_target
    gen = load_pipeline(target_dir, random_drafter).generator
    gen.allocate(3, 128, 4)
    prompts = [SYSTEM + [5 + i, 9, 3 + i] for i in range(4)]
    results, hits = [], []
    for prompt, drafting in zip(prompts, (False, False, True, True)):
        request, before = Request(tuple(prompt), 12, ignore_eos=True), gen.pool.hit_tokens
        seq = gen.admit([request], drafting=drafting)[0]
        hits.append(gen.pool.hit_tokens - before)
        while gen.live():
            gen.step()
        results.append(seq.result)
    assert hits == [0, 2 * BLOCK, 0, 2 * BLOCK]
    for result, prompt in zip(results, prompts):
        assert result.output_ids == hf_greedy(hf, prompt, 12)


def test_pool_keeps_a_block_without_drafter_context_apart():
    """The pool's bookkeeping on a table of 6 blocks: which blocks a request takes from the cache, with and without
    the drafter's context, and that a replaced block is the first one taken again."""
    from trtllm_dflash.cache.block_pool import BlockPool
    from trtllm_dflash.cache.kv_cache import BlockTable

    pool = BlockPool(BlockTable(2, 4 * BLOCK, 6, "cpu"))
    tokens = list(range(2 * BLOCK + 1))
    assert pool.admit(0, tokens, 2 * BLOCK + 1, context=False) == 0
    plain_blocks = list(pool.rows[0][:2])
    pool.release(0, tokens[: 2 * BLOCK], context=False)
    assert pool.match(tokens, context=True) == [] and pool.match(tokens, context=False) == plain_blocks
    assert pool.cost(tokens, 2 * BLOCK + 1, context=True) == 3 and pool.cost(tokens, 2 * BLOCK + 1, context=False) == 3
    pool.admit(1, tokens, 2 * BLOCK + 1, context=True)  # prefills all three blocks anew: none is a hit
    drafting_blocks = list(pool.rows[1][:2])
    assert not set(drafting_blocks) & set(plain_blocks)
    pool.release(1, tokens[: 2 * BLOCK], context=True)
    assert pool.match(tokens, context=True) == drafting_blocks == pool.match(tokens, context=False)
    order = list(pool.free)  # the replaced blocks, cached no more, are taken before any cached one
    assert max(order.index(b) for b in plain_blocks) < min(order.index(b) for b in drafting_blocks)


def test_chunked_prefill_interleaves_with_decoding_and_keeps_every_token(hf_target, random_drafter):
    """Prompts longer than max_num_tokens = 8 are prefilled 8 tokens a step while a short request decodes."""
    hf, target_dir = hf_target
    gen = load_pipeline(target_dir, random_drafter).generator
    gen.max_num_tokens = 8
    gen.allocate(3, 128, 4)
    prompts = [[7, 50, 2, 9], list(range(60, 90)), list(range(20, 41))]
    requests = [Request(tuple(p), NEW, ignore_eos=True) for p in prompts]
    short = gen.admit(requests[:1])[0]
    gen.step()
    staged = gen.admit(requests[1:2])[0]
    chunks = 0
    while not staged.result.output_ids:
        assert staged in gen.staged and len(gen.slots.running) == 1
        gen.step()
        chunks += 1
    assert chunks == 30 // 8 + 1
    results = serve(gen, requests[2:])
    for result, prompt in zip([short.result, staged.result] + results, prompts):
        assert result.output_ids == hf_greedy(hf, prompt, NEW)


FAMILIES = {  # kind -> (make the transformers model at path, verify block)
    "gpt_oss": (lambda path: make_hf_target(path, "gpt_oss", seed=3), 3),  # MoE, sinks, sliding window 6
    "qwen3_moe": (lambda path: make_hf_target(path, "qwen3_moe", seed=3), 8),  # sliding window 7
    "hybrid": (lambda path: make_hf_hybrid(path, "text", seed=4), 4),  # Gated DeltaNet + full attention
}


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_tiny_pool_and_chunked_prefill_keep_transformers_output(kind, tmp_path, caplog):
    """Sliding-window, MoE and hybrid targets: prompts prefilled 8 tokens a step, a pool small enough to
    preempt, prefix caching asked for (refused with one log line: rings and recurrent state are per row);
    every output equals transformers' greedy generate."""
    make, block = FAMILIES[kind]
    hf = make(tmp_path / "target")
    add_tokenizer(tmp_path / "target")
    prompts = [list(range(3, 21)), [7, 50, 2, 9], list(range(60, 85))]
    expected = [hf_generate(hf, p, 20) for p in prompts]
    gen = load_pipeline(tmp_path / "target", write_drafter(tmp_path / "drafter", seed=8)).generator
    gen.max_num_tokens = 8
    gen.allocate(3, 96, block, num_blocks=6)
    results = serve(gen, [Request(tuple(p), 20, ignore_eos=True) for p in prompts])
    assert [r.output_ids for r in results] == expected
    assert gen.preemptions > 0
    assert not gen.pool.prefix_caching  # these tiny models all have sliding-window or recurrent layers
    assert "prefix caching is off for this target" in caplog.text


def test_calibration_fits_the_pool_or_says_why_not(hf_target, random_drafter):
    """A pool smaller than max_batch x max_seq_len: the step-cost calibration holds its largest batch at the longest
    context the pool can hold for all of it at once, and a pool too small for that batch is refused in one line."""
    from trtllm_dflash.engine.calibrate import CalibrationPlan, measure

    from trtllm_dflash.utils.errors import DFlashError

    gen = load_pipeline(hf_target[1], random_drafter).generator
    gen.allocate(4, 256, 4, num_blocks=12)  # 3 blocks a row: 48 positions less the anchor and a block of 4
    plan = CalibrationPlan((1, 4), (0, 3), (40, 251), repeats=1)
    model = measure(gen, plan)
    assert model.contexts == (40, 43) and gen.pool.used() == 0
    gen.allocate(4, 256, 4, num_blocks=3)  # not a block a row
    with pytest.raises(DFlashError, match=r"KV pool \(3 blocks of 16\) cannot hold 4 requests"):
        measure(gen, plan)
