"""The runtime with the fused context-KV op (and the Triton kernel itself) writing the paged pool, against the
unfused path (same acceptance: the drafter read the same context) and transformers' greedy output."""

import pytest
import torch
from helpers.oracle import hf_greedy
from trtllm_dflash.engine.generator import Generator
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from helpers.tiny_pair import held_out_prompts
from trtllm_dflash.speculative import DFlashProposer


@pytest.mark.parametrize("path", ["op", "triton"])
def test_fused_paths_keep_greedy_output_and_acceptance(builtin, path):
    pipe = load_pipeline(*builtin)
    target, drafter = pipe.target.model, pipe.drafter.model
    requests = [Request(tuple(p[: 5 + 4 * i]), 24, ignore_eos=True) for i, p in enumerate(held_out_prompts(3))]
    unfused = Generator(target, DFlashProposer(drafter, target, "unfused")).generate(requests)
    fused = Generator(target, DFlashProposer(drafter, target, path)).generate(requests)
    assert max(max(r.acceptance_lengths) for r in unfused) > 1
    for a, b in zip(fused, unfused):
        assert a.output_ids == b.output_ids and a.acceptance_lengths == b.acceptance_lengths
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(builtin[0]), dtype=torch.float32).eval()
    for result, request in zip(fused, requests):
        assert result.output_ids == hf_greedy(hf, list(request.prompt_ids), 24)


def test_unknown_context_kv_path(builtin):
    pipe = load_pipeline(*builtin)
    with pytest.raises(ValueError, match="context_kv must be one of"):
        DFlashProposer(pipe.drafter.model, pipe.target.model, "fast")
