"""Per-step drafts, acceptance and output against the spec's reference algorithm on the same weights."""

import json

import pytest
import torch
from helpers.oracle import ReferenceDrafter, reference_dflash_greedy
from safetensors.torch import load_file
from helpers.scripted import Scripted
from helpers.tiny_models import drafter_config, write_drafter
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from helpers.tiny_pair import held_out_prompts


def recording(proposer):
    drafts = []
    propose = proposer.propose

    def wrapped(*args):
        result = propose(*args)
        drafts.append(result[0][0].tolist())
        return result

    proposer.propose = wrapped
    return drafts


def compare(target_dir, drafter_dir, prompt, n, block, draft_lens=None):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(target_dir, attn_implementation="eager").eval()
    cfg = json.loads((drafter_dir / "config.json").read_text())
    ref = ReferenceDrafter(cfg, load_file(str(drafter_dir / "model.safetensors")))
    ref_out, ref_lengths, ref_drafts = reference_dflash_greedy(hf, ref, prompt, n, block, draft_lens)
    pipe = load_pipeline(target_dir, drafter_dir)
    if draft_lens is not None:
        pipe.generator.policy = Scripted(draft_lens)
    drafts = recording(pipe.generator.proposer)
    result = pipe.generator.generate([Request(tuple(prompt), n, ignore_eos=True)], block)[0]
    assert drafts == ref_drafts
    assert result.acceptance_lengths == ref_lengths
    assert result.output_ids == ref_out
    return result


@pytest.mark.parametrize("block", [8, 5])
def test_trained_pair_matches_reference_step_by_step(builtin, block):
    target_dir, drafter_dir = builtin
    prompt = held_out_prompts(2)[1]
    result = compare(target_dir, drafter_dir, prompt, 48, block)
    assert max(result.acceptance_lengths) > 1  # acceptance was exercised, not only rejections


def test_drafts_after_long_runs_of_plain_steps_match_reference(builtin):
    """Plain steps (draft length 0) defer the drafter's context K/V and write them in batches (every
    16 plain steps, and before the next drafting step): the drafts after 3, 17 and 20 plain steps in a
    row must be the reference's, which recomputes the drafter's whole context every step."""
    target_dir, drafter_dir = builtin
    prompt = held_out_prompts(2)[1]
    result = compare(target_dir, drafter_dir, prompt, 64, 8, draft_lens=[0] * 17 + [7] + [0] * 3 + [5] + [0] * 20 + [7] * 4)
    assert max(result.acceptance_lengths) > 1


def test_sliding_window_layers_match_reference(hf_target, workdir):
    _, target_dir = hf_target
    cfg = drafter_config(layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         sliding_window=5, use_sliding_window=True)
    drafter_dir = write_drafter(workdir / f"drafter-swa-{target_dir.name}", cfg, seed=5)
    compare(target_dir, drafter_dir, list(range(3, 23)), 24, 8)


def test_random_drafter_matches_reference(hf_target, random_drafter):
    _, target_dir = hf_target
    compare(target_dir, random_drafter, list(range(5, 17)), 20, 8)
