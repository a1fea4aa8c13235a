"""dflash-train: the objective's mask, that training learns, exact resume, and output the runtime decodes exactly."""

import json
import subprocess
import sys

import pytest
import torch
from helpers.oracle import hf_greedy
from safetensors.torch import load_file
from trtllm_dflash.checkpoint.loader import load_drafter, load_target
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.models.drafter import DFlashDrafter
from trtllm_dflash.train.data import stdlib_prompts
from trtllm_dflash.train.distill import capture_features
from trtllm_dflash.train.objective import block_loss, block_sparse_mask, decay_weights
from trtllm_dflash.train.spec import TrainSpec, default_layer_ids
from trtllm_dflash.train.trainer import Progress, drafter_config, train

SMALL = dict(num_layers=1, block_size=8, max_new_tokens=40, max_prompt_tokens=24, eval_prompts=4, eval_every=1000,
             batch_tokens=256, anchors=4, lr=3e-3)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in stdlib_prompts(36, seed=3)))
    return path


def quiet() -> Progress:
    return Progress(log=lambda msg: None)


def test_mask_is_exactly_the_block_sparse_pattern():
    """Element by element from the definition: query slot j of block a sees context position p iff
    p < anchor_a, and draft slot k iff k belongs to block a."""
    anchors, seq_len, block = torch.tensor([[2, 5], [0, 3]]), 7, 3
    mask = block_sparse_mask(anchors, seq_len, block)
    assert mask.shape == (2, 1, 6, 7 + 6) and mask.dtype == torch.bool
    for n in range(2):
        for q in range(6):
            a = q // block
            for key in range(seq_len + 6):
                if key < seq_len:
                    expected = key < anchors[n, a].item()
                else:
                    expected = (key - seq_len) // block == a
                assert mask[n, 0, q, key].item() == expected, (n, q, key)


def test_block_sees_nothing_at_or_after_its_anchor_nor_other_blocks(builtin):
    """Behaviour, not just the mask: changing features at/after a block's anchor, or another
    block's tokens, leaves that block's loss unchanged."""
    target = load_target(builtin[0]).model
    torch.manual_seed(0)
    drafter = DFlashDrafter(load_drafter(builtin[1]).config)
    cfg = drafter.config
    seqs = torch.randint(0, 256, (1, 40))
    feats = torch.randn(1, 40, len(cfg.target_layer_ids) * cfg.hidden_size)
    weights = decay_weights(cfg.block_size)
    first = torch.tensor([[10]])
    base = block_loss(drafter, target, seqs, feats, first, weights)
    later = feats.clone()
    later[:, 10:] += 5.0  # features at and after the anchor
    assert torch.equal(block_loss(drafter, target, seqs, later, first, weights), base)
    earlier = feats.clone()
    earlier[:, 9] += 5.0  # the last context position before the anchor does matter
    assert not torch.equal(block_loss(drafter, target, seqs, earlier, first, weights), base)
    two = torch.tensor([[10, 25]])
    both = block_loss(drafter, target, seqs, feats, two, weights) * 2 - base  # loss of the second block alone
    other = seqs.clone()
    other[0, 10:18] = (other[0, 10:18] + 1) % 256  # the first block's tokens
    changed = block_loss(drafter, target, other, feats, two, weights) * 2 - block_loss(
        drafter, target, other, feats, first, weights)
    torch.testing.assert_close(changed, both, rtol=0, atol=1e-5)


def test_one_training_step_lowers_the_loss(builtin):
    target = load_target(builtin[0]).model.requires_grad_(False)
    cfg = load_drafter(builtin[1]).config
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    seqs = torch.randint(0, 256, (4, 48))

    feats = capture_features(target, seqs, cfg.target_layer_ids)
    anchors = torch.randint(4, 48 - cfg.block_size, (4, 3))
    weights = decay_weights(cfg.block_size)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    before = block_loss(drafter, target, seqs, feats, anchors, weights)
    before.backward()
    opt.step()
    after = block_loss(drafter, target, seqs, feats, anchors, weights)
    assert after.item() < before.item()


def test_training_learns_and_output_decodes_exactly(builtin, prompts_file, tmp_path):
    """A short run raises held-out acceptance above an untrained drafter's; the written drafter
    is in the published format, loads in the runtime, and greedy output equals transformers'."""
    out = tmp_path / "drafter"
    state = train(TrainSpec(str(builtin[0]), str(out), str(prompts_file), steps=300, **{**SMALL, "batch_tokens": 512}),
                  quiet())
    assert sum(state.losses[-10:]) / 10 < sum(state.losses[:10]) / 10 - 0.5
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 8
    assert config["dflash_config"] == {"mask_token_id": 257, "target_layer_ids": list(default_layer_ids(6, 1))}
    assert set(load_file(out / "model.safetensors")) >= {"fc.weight", "hidden_norm.weight", "norm.weight",
                                                         "layers.0.self_attn.q_proj.weight"}
    pipe = load_pipeline(builtin[0], out)
    prompt = [ord(c) for c in "def load(path):\n    "]
    result = pipe.generator.generate([Request(tuple(prompt), 24, ignore_eos=True)])[0]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(builtin[0]), dtype=torch.float32).eval()
    assert result.output_ids == hf_greedy(hf, prompt, 24)
    untrained = tmp_path / "untrained"
    train(TrainSpec(str(builtin[0]), str(untrained), str(prompts_file), steps=1, **{**SMALL, "lr": 1e-9}), quiet())
    eval_prompts = torch.load(out / "train_state" / "data.pt")["eval"]
    taus = []
    for drafter in (out, untrained):
        results = load_pipeline(builtin[0], drafter).generator.generate(
            [Request(tuple(p), 32, ignore_eos=True) for p in eval_prompts])
        steps = [a for r in results for a in r.acceptance_lengths]
        taus.append(sum(steps) / len(steps))
    assert taus[0] > taus[1] + 0.1, taus


def test_resume_reproduces_the_uninterrupted_run(builtin, prompts_file, tmp_path):
    spec = dict(target=str(builtin[0]), data=str(prompts_file), steps=8, save_every=4, **SMALL)
    train(TrainSpec(output=str(tmp_path / "straight"), **spec), quiet())

    class Stop(Exception):
        pass

    seen = {"steps": 0, "training": False}

    def stage(name, total):
        seen["training"] = name == "training"

    def advance(n=1, **info):
        if seen["training"] and n == 1:
            seen["steps"] += 1
            if seen["steps"] == 5:  # killed one step after the checkpoint at step 4
                raise Stop

    with pytest.raises(Stop):
        train(TrainSpec(output=str(tmp_path / "resumed"), **spec), Progress(stage, advance, lambda m: None))
    assert not (tmp_path / "resumed" / "model.safetensors").exists()  # nothing half-written
    train(TrainSpec(output=str(tmp_path / "resumed"), resume=True, **spec), quiet())
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "resumed" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_drafter_config_follows_the_target(builtin):
    target = load_target(builtin[0])
    config = drafter_config(TrainSpec(str(builtin[0]), "unused", num_layers=3, block_size=16), target)
    assert config["hidden_size"] == target.config.hidden_size and config["num_target_layers"] == 6
    assert config["dflash_config"]["target_layer_ids"] == [1, 2, 3]  # spread over 1 .. L - 3, like the reference


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.train", *args], capture_output=True, text=True)


@pytest.mark.parametrize("content, needle", [
    ('{"prompt": "a"}\n{"prompt": \n', "prompts.jsonl:2: not valid JSON"),
    ('{"prompt": "a"}\n{"text": "b"}\n', "prompts.jsonl:2: needs a non-empty 'prompt' string"),
    ("", "holds no prompts"),
])
def test_bad_data_is_one_line_with_the_line_number(builtin, tmp_path, content, needle):
    data = tmp_path / "prompts.jsonl"
    data.write_text(content)
    out = run_cli("--target", str(builtin[0]), "--output", str(tmp_path / "d"), "--data", str(data), "--steps", "1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert needle in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert not (tmp_path / "d" / "model.safetensors").exists()


def test_bad_settings_are_one_line_errors(builtin, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    cases = [
        (["--output", str(tmp_path / "full")], "exists and is not empty"),
        (["--output", str(tmp_path / "a"), "--block-size", "1"], "--block-size must be at least 2, got 1"),
        (["--output", str(tmp_path / "b"), "--target-layer-ids", "1,9"], "target_layer_ids"),
        (["--output", str(tmp_path / "c"), "--mask-token-id", "999"], "999"),
    ]
    for extra, needle in cases:
        out = run_cli("--target", str(builtin[0]), "--steps", "1", *extra)
        assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr, (extra, out.stderr)
