"""Attention wired to the paged kernel (op.MODE "triton": the Triton kernel under the CPU interpreter) against a
float64 loop over each row's true history; the built-in pair's greedy output with it against transformers'; the
GPU benchmark's smoke run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.oracle import hf_greedy
from helpers.paged_attention import oracle
from trtllm_dflash.engine.generator import Generator
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from helpers.tiny_pair import held_out_prompts
from trtllm_dflash.cache.kv_cache import KVCache, LayerCacheSpec
from trtllm_dflash.models.attention import AttentionSpec, ForwardContext
from trtllm_dflash.plugins.paged_attention import op, triton_kernel
from trtllm_dflash.speculative import DFlashProposer
from trtllm_dflash.speculative.autoregressive import AutoregressiveProposer
from trtllm_dflash.utils.errors import DFlashError

H, HKV, D = 4, 2, 16


@pytest.fixture
def kernel_calls(monkeypatch):
    """Force the Triton path (the op runs the kernel on the CPU) and count the kernel's calls."""
    calls = []
    run = triton_kernel.paged_attention_triton
    monkeypatch.setattr(op, "MODE", "triton")
    monkeypatch.setattr(triton_kernel, "paged_attention_triton", lambda *a: calls.append(1) or run(*a))
    return calls


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("causal", [True, False])
def test_cached_attend_reads_the_pool_through_the_table(kernel_calls, causal, compiled):
    """Prefill three slots (ragged), then one verify-sized pass over slots [2, 0] (gathered rows); compiled: the
    pass through torch.compile(fullgraph=True) (aot_eager: dynamo and the op's fake kernel, no C++ build)."""
    g = torch.Generator().manual_seed(3)
    spec = AttentionSpec(H, HKV, D, causal=causal)
    cache = KVCache([LayerCacheSpec()], 3, HKV, 64, D, torch.float32, "cpu")
    lengths = [21, 9, 40]
    q, k, v = (torch.randn(3, 40, n, D, generator=g) for n in (H, HKV, HKV))
    ForwardContext.prefill(torch.arange(40).expand(3, -1), cache, torch.arange(3), torch.tensor(lengths)).attend(
        0, spec, q, k, v)
    slots, t = torch.tensor([2, 0]), 5
    positions = torch.tensor([lengths[2], lengths[0]])[:, None] + torch.arange(t)
    q2, k2, v2 = (torch.randn(2, t, n, D, generator=g) for n in (H, HKV, HKV))
    def step(positions, q, k, v):
        return ForwardContext.cached(positions, cache, 45, slots).attend(0, spec, q, k, v)

    run = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
    out = run(positions, q2, k2, v2)
    assert kernel_calls
    keys = [torch.cat([k[s, : lengths[s]], k2[i]]).double() for i, s in enumerate(slots.tolist())]
    values = [torch.cat([v[s, : lengths[s]], v2[i]]).double() for i, s in enumerate(slots.tolist())]
    torch.testing.assert_close(out.double(), oracle(q2, keys, values, positions, causal, D ** -0.5, None),
                               atol=2e-5, rtol=1e-4)


def test_which_passes_take_the_kernel(monkeypatch):
    """Up to a block's 16 queries a row, head_dim a power of two from 16, no window; a long chunk keeps the gather."""
    monkeypatch.setattr(op, "MODE", "triton")
    assert op.use_op(torch.zeros(2, 16, H, D), False) and op.use_op(torch.zeros(2, 1, H, 128), False)
    assert not op.use_op(torch.zeros(2, 17, H, D), False) and not op.use_op(torch.zeros(2, 1, H, D), True)
    assert not op.use_op(torch.zeros(2, 1, H, 8), False) and not op.use_op(torch.zeros(2, 1, H, 96), False)
    monkeypatch.setattr(op, "MODE", "auto")
    assert not op.use_op(torch.zeros(2, 1, H, D), False)  # the CPU keeps gather + SDPA
    monkeypatch.setattr(op, "MODE", "off")
    assert not op.use_op(torch.zeros(2, 1, H, D), False)


def test_bad_setting_is_named(monkeypatch):
    monkeypatch.setattr(op, "MODE", "fast")
    with pytest.raises(DFlashError, match="TRTLLM_DFLASH_PAGED_ATTENTION must be one of auto, triton, off, got 'fast'"):
        op.use_op(torch.zeros(1, 1, H, D), False)


def test_dflash_generation_with_the_kernel_matches_transformers(builtin, kernel_calls):
    """The built-in pair (head_dim 16) drafting and verifying, and plain decoding, through the Triton kernel:
    transformers' greedy output. Small on purpose: the interpreter runs every kernel call in Python."""
    pipe = load_pipeline(*builtin)
    requests = [Request(tuple(p[: 6 + 5 * i]), 12, ignore_eos=True) for i, p in enumerate(held_out_prompts(2))]
    results = Generator(pipe.target.model, DFlashProposer(pipe.drafter.model, pipe.target.model)).generate(requests)
    assert kernel_calls and max(max(r.acceptance_lengths) for r in results) > 1
    plain = Generator(pipe.target.model, AutoregressiveProposer()).generate(requests)  # one query per row
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(builtin[0]), dtype=torch.float32).eval()
    for result, alone, request in zip(results, plain, requests):
        assert result.output_ids == alone.output_ids == hf_greedy(hf, list(request.prompt_ids), 12)


def test_benchmark_smoke_run(tmp_path):
    """benchmarks/paged_attention_gpu.py end to end at tiny shapes on the CPU (the kernel in the interpreter): both
    paths agree and the record holds what its docstring says."""
    out = tmp_path / "paged_attention.json"
    script = Path(__file__).parents[2] / "benchmarks" / "paged_attention_gpu.py"
    run = subprocess.run([sys.executable, str(script), "--tiny", "--device", "cpu", "--batches", "2", "--repeats", "1",
                          "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["shapes"] == "tiny" and [r["queries"] for r in record["rows"]] == [1, 16]
    for row in record["rows"]:
        assert row["max_abs_diff"] < 1e-5 and row["speedup"] == pytest.approx(row["gather_s"] / row["paged_s"])
        assert row["paged_graph_s"] is None and row["floor_s"] > 0
