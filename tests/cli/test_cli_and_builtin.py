"""dflash-generate's JSON contract, and real acceptance with the built-in fitted pair."""

import json
import subprocess
import sys

import pytest
import torch
from trtllm_dflash.checkpoint.loader import load_target
from trtllm_dflash.engine.generator import Generator
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from helpers.tiny_pair import DRAFTER, held_out_prompts
from trtllm_dflash.models.drafter import DFlashDrafter
from trtllm_dflash.models.registry import parse_drafter_config
from trtllm_dflash.speculative import DFlashProposer

KEYS = {"output_ids", "acceptance_lengths", "tau", "ttft_s", "tpot_s", "tokens_per_s", "text"}


def generate_json(*args) -> dict:
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", *args, "--json"],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def test_generate_json_contract_with_builtin_pair(builtin):
    prompt = ",".join(map(str, held_out_prompts(1)[0]))
    spec = generate_json("--target", str(builtin[0]), "--drafter", str(builtin[1]), "--prompt-ids", prompt,
                         "--max-new-tokens", "40", "--ignore-eos")
    plain = generate_json("--target", str(builtin[0]), "--prompt-ids", prompt, "--max-new-tokens", "40",
                          "--ignore-eos")
    assert KEYS <= spec.keys() and KEYS <= plain.keys()
    assert spec["output_ids"] == plain["output_ids"] and len(spec["output_ids"]) == 40
    assert plain["acceptance_lengths"] == [1] * 39 and plain["tau"] == 1.0
    assert spec["tau"] == sum(spec["acceptance_lengths"]) / len(spec["acceptance_lengths"])
    # the draft length of every step (auto: chosen from the run's own step times), plain decoding's all 0
    assert len(spec["draft_lengths"]) == len(spec["acceptance_lengths"]) and set(spec["draft_lengths"]) <= set(range(8))
    assert all(a <= k + 1 for a, k in zip(spec["acceptance_lengths"], spec["draft_lengths"]))
    assert plain["draft_lengths"] == [0] * 39
    assert spec["step_mode"] == plain["step_mode"] == "eager"  # auto on a CPU
    tokenizer = load_target(builtin[0]).tokenizer
    assert spec["text"] == tokenizer.decode(spec["output_ids"])


def test_text_prompt_and_sampling_flags(builtin):
    out = generate_json("--target", "builtin", "--drafter", "builtin", "--prompt", "def main():",
                        "--max-new-tokens", "12", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20",
                        "--seed", "4", "--block-size", "4", "--ignore-eos")
    assert len(out["output_ids"]) == 12 and max(out["acceptance_lengths"]) <= 4


def test_fitted_drafter_accepts_far_more_than_an_untrained_one(builtin):
    """Held-out prompts, greedy, block 8: the fitted drafter's tau is well above 1, output stays exact."""
    pipe = load_pipeline(*builtin)
    requests = [Request(tuple(p), 96, ignore_eos=True) for p in held_out_prompts(8)]
    fitted = pipe.generator.generate(requests)
    torch.manual_seed(0)
    untrained = DFlashDrafter(parse_drafter_config(DRAFTER, "untrained")).eval()
    target = pipe.target.model
    baseline = Generator(target, DFlashProposer(untrained, target)).generate(requests)
    plain = load_pipeline(builtin[0]).generator.generate(requests)
    tau = sum(r.tau for r in fitted) / len(fitted)
    tau_untrained = sum(r.tau for r in baseline) / len(baseline)
    assert tau >= 1.5 and tau_untrained < 1.2, (tau, tau_untrained)
    for a, b, c in zip(fitted, baseline, plain):
        assert a.output_ids == b.output_ids == c.output_ids


@pytest.mark.parametrize("drafter, method", [("builtin", "dflash"), ("builtin-dflash2", "dflash2")])
def test_shipped_pair_is_exact_and_accepts(drafter, method):
    """`builtin` is the shipped stdlib pair (`builtin-dflash2` its DFlash2 drafter): greedy decoding equals
    transformers' greedy decoding on a held-out prompt, and the drafter is accepted (tau well above an untrained
    drafter's 1)."""
    from helpers.oracle import hf_greedy
    from transformers import AutoModelForCausalLM

    from trtllm_dflash.pairs import held_out_texts, stdlib_pair

    text = held_out_texts(1)[0]
    # the whole block every step: --draft-len auto picks k from this machine's timings, so its tau is not a
    # property of the drafter (1.88 at a busy CI's shorter drafts)
    out = generate_json("--target", "builtin", "--drafter", drafter, "--prompt", text, "--max-new-tokens", "48",
                        "--ignore-eos", "--draft-len", "15")
    target, path = stdlib_pair(method)
    assert json.loads((path / "config.json").read_text())["architectures"][0].lower().startswith(method)
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    tokenizer = load_target(target).tokenizer
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert out["output_ids"] == hf_greedy(hf, prompt, 48)
    assert out["tau"] > 2.0 and max(out["acceptance_lengths"]) <= 16


@pytest.fixture(scope="module")
def engine(builtin, tmp_path_factory):
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec

    return build_engine(BuildSpec(str(builtin[0]), str(builtin[1]), str(tmp_path_factory.mktemp("e") / "engine"),
                                  dtype="float32", max_seq_len=128), "test")


def test_closed_pipe_is_quiet(engine):
    """`dflash-build inspect --json | head` with the reader gone: no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "trtllm_dflash.cli.build", "inspect", str(engine), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the tool writes a byte
    assert proc.stderr.read() == b"" and proc.wait(60) == 141
