"""Drafters in the `speculators` library's format, checked against the library itself (speculators 0.9.0).

Drafters are built and saved with the library's own classes and run by it as the oracle: the draft logits this
runtime computes during generation equal the library's forward for the same context, and what this project
writes in that format loads in the library and runs the same. Round trips between the formats are bit-exact.
"""

import json

import pytest
import torch
from helpers.oracle import hf_greedy, speculators_blocks
from safetensors.torch import load_file
from helpers.tiny_models import add_tokenizer, drafter_config, drafter_weights, hf_config, make_hf_target, write_drafter
from trtllm_dflash.checkpoint.drafter import Verifier, convert_drafter, read_drafter
from trtllm_dflash.engine.loader import load_engine
from trtllm_dflash.engine.pipeline import load_pipeline
from trtllm_dflash.engine.request import Request

from trtllm_dflash.builder.builder import build_engine
from trtllm_dflash.builder.spec import BuildSpec
from trtllm_dflash.cli.convert import main as convert_main
from trtllm_dflash.cli.generate import main as generate_main
from trtllm_dflash.utils.errors import DFlashError

speculators = pytest.importorskip("speculators", reason="the test set-up installs speculators (Makefile)")

BLOCK, MASK = 8, 95
PROMPTS = [[5, 9, 13, 2, 77, 31, 8], list(range(40, 52))]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """Tiny transformers targets (the oracle) with tokenizers: {kind: (model, dir)}."""
    root = tmp_path_factory.mktemp("spec-targets")
    made = {}
    for kind in ("qwen3", "llama"):
        model = make_hf_target(root / kind, kind, seed=21)
        made[kind] = (model, add_tokenizer(root / kind))
    return made


def library_drafter(path, verifier, layer_config, **options):
    """A DFlash speculator made and saved by the library (its training entry point), weights sharpened so drafts
    vary; aux ids [1, 3] are z-lab's target_layer_ids [0, 2]."""
    from speculators.models.dflash import DFlashDraftModel

    torch.manual_seed(0)
    model = DFlashDraftModel.from_training_args(
        verifier_config=layer_config, verifier_name_or_path=str(verifier), draft_vocab_size=layer_config.vocab_size,
        block_size=BLOCK, target_layer_ids=[1, 3], mask_token_id=MASK, draft_attn_impl="eager", **options)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:  # the draft body; the verifier's embedding and head stay frozen
                p.copy_(torch.randn_like(p) * 0.2 if p.dim() == 2 else 1 + 0.1 * torch.randn_like(p))
    model.save_pretrained(str(path))
    return path


def library_logits(path, sequence: list[int], hf) -> torch.Tensor:
    """The library's own forward (eager attention) over `sequence` -> logits [anchor p, slot, vocab]."""
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    return speculators_blocks(DFlashDraftModel, DFlashSpeculatorConfig, path, sequence, hf)[1]


def run_recording_logits(pipe, prompt, n):
    """Greedy DFlash generation -> (result, draft logits of every step [B - 1, vocab])."""
    drafter, seen = pipe.generator.proposer.drafter, []
    logits = drafter.logits

    def record(*args, **kwargs):
        out = logits(*args, **kwargs)
        seen.append(out[0].detach().clone())
        return out

    drafter.logits = record
    result = pipe.generator.generate([Request(tuple(prompt), n, ignore_eos=True)])[0]  # the trained block size
    return result, seen


def check_against_library(target_dir, hf, drafter_dir, prompt, n=24):
    """Greedy output equals transformers'; every step's draft logits equal the library's for that anchor."""
    result, steps = run_recording_logits(load_pipeline(target_dir, drafter_dir), prompt, n)
    assert result.output_ids == hf_greedy(hf, prompt, n)
    sequence = prompt + result.output_ids
    reference = library_logits(drafter_dir, sequence, hf)
    start, compared = len(prompt), 0
    for ours, accepted in zip(steps, result.acceptance_lengths):
        if start < len(reference):
            torch.testing.assert_close(ours, reference[start, 1:].float(), rtol=1e-4, atol=1e-4)
            compared += 1
        start += accepted
    assert compared >= 3
    return result


SLIDING = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64, "use_sliding_window": True}
LAYERS = {  # name: (target kind, draft decoder config, library options)
    "qwen3": ("qwen3", {}, {}),
    "qwen3-sliding": ("qwen3", SLIDING, {}),
    "qwen3-sliding-noncausal": ("qwen3", SLIDING, {"sliding_window_non_causal": True}),
    "llama": ("llama", {}, {}),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_library_drafter_drafts_like_the_library_and_decodes_exactly(targets, tmp_path, name):
    kind, layer_extra, options = LAYERS[name]
    hf, target_dir = targets[kind]
    path = library_drafter(tmp_path / "spec", target_dir, hf_config(kind, num_hidden_layers=2, **layer_extra),
                           **options)
    ckpt = read_drafter(path)
    assert ckpt.format == "speculators" and ckpt.config.target_layer_ids == (0, 2)
    assert ckpt.config.mask_token_id == MASK and ckpt.config.block_size == BLOCK
    for prompt in PROMPTS if name == "qwen3" else PROMPTS[1:]:  # one prompt per variant keeps the suite short
        check_against_library(target_dir, hf, path, prompt)


def test_same_weights_in_both_formats_run_identically_in_every_runtime(targets, tmp_path):
    """The library's drafter and its z-lab copy: the same outputs and acceptance through --drafter and through
    a torch engine; the trtllm engine's drafter is the same z-lab directory from either input."""
    hf, target_dir = targets["qwen3"]
    spec_dir = library_drafter(tmp_path / "spec", target_dir, hf_config("qwen3", num_hidden_layers=2))
    zlab_dir = convert_drafter(spec_dir, tmp_path / "zlab", "zlab")
    runs = {}
    for name, drafter in (("speculators", spec_dir), ("zlab", zlab_dir)):
        pipe = load_pipeline(target_dir, drafter)
        runs[name] = [pipe.generator.generate([Request(tuple(p), 24, ignore_eos=True)], BLOCK)[0] for p in PROMPTS]
        engine = build_engine(BuildSpec(target=str(target_dir), drafter=str(drafter), output=str(tmp_path / f"engine-{name}"),
                                        dtype="float32", tp=1), "test")
        runs[name + "-engine"] = [load_engine(engine).generator.generate(
            [Request(tuple(p), 24, ignore_eos=True)], BLOCK)[0] for p in PROMPTS]
        assert json.loads((engine / "manifest.json").read_text())["drafter"]["format"] == name
    first = [(r.output_ids, r.acceptance_lengths) for r in runs["speculators"]]
    for name, results in runs.items():
        assert [(r.output_ids, r.acceptance_lengths) for r in results] == first, name
    engines = {}
    for name, drafter in (("spec", spec_dir), ("zlab", zlab_dir)):
        out = build_engine(BuildSpec(target=str(target_dir), drafter=str(drafter), output=str(tmp_path / f"trt-{name}"),
                                     backend="trtllm", max_seq_len=256), "test")
        engines[name] = (json.loads((out / "drafter" / "config.json").read_text()),
                         load_file(str(out / "drafter" / "model.safetensors")))
    config, tensors = engines["spec"]
    assert "speculators_model_type" not in config and config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [0, 2], "block_size": BLOCK}
    assert config["torch_dtype"] == "bfloat16"
    assert config == engines["zlab"][0]
    body = {k: v.to(torch.bfloat16) for k, v in load_file(str(spec_dir / "model.safetensors")).items()}
    assert tensors.keys() == body.keys() == engines["zlab"][1].keys()  # the drafter's own tensors, in the build dtype
    assert all(torch.equal(tensors[k], body[k]) and torch.equal(engines["zlab"][1][k], body[k]) for k in body)


def same_tensors(a, b) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_round_trips_are_bit_exact(targets, tmp_path):
    _, target_dir = targets["qwen3"]
    verifier = Verifier.of(target_dir)
    cfg = drafter_config(num_target_layers=4)
    weights = {k: v.to(torch.bfloat16) for k, v in drafter_weights(cfg, seed=4).items()}
    zlab = write_drafter(tmp_path / "zlab", cfg, weights)
    spec = convert_drafter(zlab, tmp_path / "spec", "speculators", verifier)
    back = convert_drafter(spec, tmp_path / "zlab-again", "zlab")
    assert same_tensors(load_file(str(back / "model.safetensors")), weights)
    expected = {k: v for k, v in cfg.items() if k != "num_target_layers"}  # speculators has no such field
    assert json.loads((back / "config.json").read_text()) == expected
    lib = library_drafter(tmp_path / "lib", target_dir, hf_config("qwen3", num_hidden_layers=2))
    again = convert_drafter(convert_drafter(lib, tmp_path / "l-zlab", "zlab"), tmp_path / "l-spec", "speculators",
                            verifier)
    assert same_tensors(load_file(str(again / "model.safetensors")), load_file(str(lib / "model.safetensors")))
    original, written = (json.loads((d / "config.json").read_text()) for d in (lib, again))
    assert {k: original[k] for k in written} == written
    assert set(original) - set(written) == {"auto_map", "dtype", "transformers_version"}  # the library's bookkeeping


@pytest.fixture(scope="module")
def shipped():
    """The shipped built-in pair (trained; drafter block 16, target layers 1, 3, 5 of 6)."""
    from trtllm_dflash.pairs import stdlib_pair

    return stdlib_pair()


def test_written_speculators_drafter_loads_and_runs_in_the_library(shipped, tmp_path):
    """The trained built-in drafter written in the speculators format: the library loads it and its forward gives
    this runtime's draft logits; it decodes exactly with the same (real) acceptance as the z-lab original."""
    from transformers import AutoModelForCausalLM

    target_dir, zlab_dir = shipped
    spec = convert_drafter(zlab_dir, tmp_path / "spec", "speculators", Verifier.of(target_dir))
    hf = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    prompt = load_pipeline(target_dir).tokenizer("def load(path):\n    with open(path) as f:\n")["input_ids"]
    result = check_against_library(target_dir, hf, spec, prompt, 32)
    original = load_pipeline(target_dir, zlab_dir).generator.generate([Request(tuple(prompt), 32, ignore_eos=True)])[0]
    assert (result.output_ids, result.acceptance_lengths) == (original.output_ids, original.acceptance_lengths)
    assert sum(result.acceptance_lengths) / len(result.acceptance_lengths) > 2


def test_dflash_train_writes_the_speculators_format(shipped, tmp_path):
    from speculators.models.dflash import DFlashDraftModel

    from trtllm_dflash.train.spec import TrainSpec
    from trtllm_dflash.train.trainer import Progress, train

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return x + {i}"}) + "\n" for i in range(5)))
    out = tmp_path / "drafter"
    train(TrainSpec(str(shipped[0]), str(out), str(data), num_layers=1, block_size=BLOCK, steps=1, max_new_tokens=16,
                    max_prompt_tokens=16, eval_prompts=1, batch_tokens=64, anchors=2, save_format="speculators"),
          Progress(log=lambda msg: None))
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash"
    assert config["speculators_config"]["verifier"] == {"name_or_path": str(shipped[0]),
                                                        "architectures": ["Qwen3ForCausalLM"]}
    library = DFlashDraftModel.from_pretrained(str(out)).state_dict()
    ours = read_drafter(out).tensors()
    assert all(torch.equal(library[k], v) for k, v in ours.items())


def speculators_config(tmp_path, name, cls, **fields):
    """A config the library writes for another algorithm (or DFlash variant), config.json only."""
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    proposals = SpeculatorsConfig(algorithm=name, proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
                                  default_proposal_method="greedy", verifier=VerifierConfig(name_or_path="t",
                                                                                            architectures=[]))
    cls(transformer_layer_config=hf_config("llama" if name == "eagle3" else "qwen3", num_hidden_layers=1),
        draft_vocab_size=96, speculators_config=proposals, **fields).save_pretrained(str(tmp_path / name))
    return tmp_path / name


def test_other_algorithms_are_refused_in_one_line(targets, tmp_path, capsys):
    from speculators import DSparkSpeculatorConfig, Eagle3SpeculatorConfig

    dflash = {"aux_hidden_state_layer_ids": [1], "mask_token_id": MASK}
    cases = [(speculators_config(tmp_path, "eagle3", Eagle3SpeculatorConfig), "'eagle3' is an EAGLE-3 drafter"),
             (speculators_config(tmp_path, "dspark", DSparkSpeculatorConfig, **dflash), "'dspark' is a DFlash")]
    for path, needle in cases:
        with pytest.raises(DFlashError, match=f"speculators_model_type {needle}"):
            read_drafter(path)
    _, target_dir = targets["qwen3"]
    code = generate_main(["--target", str(target_dir), "--drafter", str(cases[0][0]), "--prompt-ids", "5,6,7",
                          "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "speculators_model_type 'eagle3'" in err, err


@pytest.mark.parametrize("change, needle", [
    ({"sample_from_anchor": True}, "field 'sample_from_anchor' is true"),
    ({"draft_vocab_size": 32}, "field 'draft_vocab_size' 32 != transformer_layer_config.vocab_size 96"),
    ({"target_hidden_size": 64}, "field 'target_hidden_size' 64"),
    ({"mask_token_id": None}, "field 'mask_token_id' must be an int, got None"),
    ({"aux_hidden_state_layer_ids": [0, 2]}, "field 'aux_hidden_state_layer_ids' [0, 2] holds 0"),
    ({"aux_hidden_state_layer_ids": None}, "field 'aux_hidden_state_layer_ids' must be a non-empty list"),
    ({"transformer_layer_config": None}, "field 'transformer_layer_config' must be an object"),
    ({"speculators_config": {"algorithm": "eagle3"}}, "field 'speculators_config.algorithm' is 'eagle3'"),
])
def test_dflash_variants_whose_math_differs_are_refused(targets, tmp_path, change, needle):
    _, target_dir = targets["qwen3"]
    path = library_drafter(tmp_path / "spec", target_dir, hf_config("qwen3", num_hidden_layers=2))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(DFlashError, match=needle.replace("[", r"\[")):
        read_drafter(path)


def test_convert_cli_bad_input_is_one_line_and_writes_nothing(targets, tmp_path, capsys):
    _, target_dir = targets["qwen3"]
    zlab = write_drafter(tmp_path / "zlab")
    (tmp_path / "taken").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("user data")
    cases = [
        (["--to", "speculators"], tmp_path / "a", "give --verifier"),
        (["--to", "hf"], tmp_path / "b", "unknown drafter format 'hf'"),
        (["--to", "zlab"], tmp_path / "taken", "already exists (use --force"),
        (["--to", "zlab", "--force"], zlab, "is the source drafter"),
        (["--to", "zlab", "--force"], tmp_path / "data", "--force replaces only a DFlash drafter directory"),
        (["--to", "speculators", "--verifier", tmp_path / "nowhere"], tmp_path / "c", "no such model directory"),
    ]
    for flags, out, needle in cases:
        code = convert_main([str(a) for a in (zlab, out, *flags)])
        err = capsys.readouterr().err
        assert code == 2 and needle in err and err.count("\n") == 1, (flags, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "taken", "zlab"]  # nothing written or left over
    assert (tmp_path / "data" / "keep.txt").read_text() == "user data"
    assert convert_main([str(zlab), str(tmp_path / "spec"), "--to", "speculators", "--verifier", str(target_dir)]) == 0
    assert read_drafter(tmp_path / "spec").format == "speculators"
    assert convert_main([str(zlab), str(tmp_path / "spec"), "--to", "zlab", "--force"]) == 0  # a drafter: replaced
    assert read_drafter(tmp_path / "spec").format == "zlab"
