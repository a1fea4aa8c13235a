"""DFlash2 drafters in both published layouts: speculators 0.9.0 writes and reads one format, z-lab's is the other;
conversions both ways copy every tensor bit for bit, and what this project writes the library loads."""

import json

import pytest
import torch
from helpers.dflash2 import OPTIONS, SLIDING, dflash2_weights, library_dflash2, write_zlab_dflash2, \
    zlab_dflash2_config
from helpers.tiny_models import hf_config, make_hf_target, write_drafter
from safetensors.torch import load_file
from trtllm_dflash.checkpoint.drafter import Verifier, convert_drafter, read_drafter
from trtllm_dflash.checkpoint.loader import load_drafter
from trtllm_dflash.config.dflash2 import DFlash2Config
from trtllm_dflash.utils.errors import DFlashError

pytest.importorskip("speculators", reason="the test set-up installs speculators (Makefile)")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("d2-target") / "target"
    make_hf_target(path, "qwen3", seed=21)
    return path


@pytest.fixture(scope="module")
def library(target_dir, tmp_path_factory):
    return library_dflash2(tmp_path_factory.mktemp("d2-lib") / "spec", target_dir,
                           hf_config("qwen3", num_hidden_layers=2, **SLIDING))


def same_tensors(a, b) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_the_library_format_loads_as_dflash2(library):
    ckpt = read_drafter(library)
    assert ckpt.format == "speculators" and ckpt.config.method == "dflash2"
    assert ckpt.config.dflash2 == DFlash2Config(**OPTIONS) and ckpt.config.target_layer_ids == (0, 2)
    assert ckpt.config.is_causal is False  # sliding_window_non_causal: the library's DFlash2 default
    assert len(ckpt.tensors()) == 15 * 2 + 6  # v1's 11 a layer + 4 convolution tensors; fc, 2 norms, 3 selector
    assert load_drafter(library).model.candidate_selector is not None


def test_library_to_zlab_and_back_is_bit_exact(library, target_dir, tmp_path):
    zlab = convert_drafter(library, tmp_path / "zlab", "zlab")
    layout = json.loads((zlab / "config.json").read_text())
    assert layout["architectures"] == ["DFlash2DraftModel"] and layout["is_causal"] is False
    assert layout["dflash_config"] == {"mask_token_id": 95, "target_layer_ids": [0, 2], "block_size": 8, **OPTIONS}
    again = convert_drafter(zlab, tmp_path / "spec", "speculators", Verifier.of(target_dir))
    assert same_tensors(load_file(str(again / "model.safetensors")), load_file(str(library / "model.safetensors")))
    original, written = (json.loads((d / "config.json").read_text()) for d in (library, again))
    assert {k: original[k] for k in written} == written
    assert set(original) - set(written) == {"auto_map", "dtype", "transformers_version"}  # the library's bookkeeping


def test_zlab_to_speculators_and_back_is_bit_exact_and_the_library_loads_it(target_dir, tmp_path):
    from speculators.models.dflash2 import DFlash2DraftModel

    cfg = zlab_dflash2_config()
    weights = {k: v.to(torch.bfloat16) for k, v in dflash2_weights(cfg, seed=4).items()}
    zlab = write_drafter(tmp_path / "zlab", cfg, weights)
    spec = convert_drafter(zlab, tmp_path / "spec", "speculators", Verifier.of(target_dir))
    back = convert_drafter(spec, tmp_path / "zlab-again", "zlab")
    assert same_tensors(load_file(str(back / "model.safetensors")), weights)
    assert json.loads((back / "config.json").read_text()) == cfg
    written = json.loads((spec / "config.json").read_text())
    assert written["speculators_model_type"] == written["speculators_config"]["algorithm"] == "dflash2"
    library = DFlash2DraftModel.from_pretrained(str(spec)).state_dict()
    assert all(torch.equal(library[k].to(v.dtype), v) for k, v in weights.items())


def test_a_reduced_vocabulary_dflash2_drafter_is_refused_in_one_line(library, tmp_path):
    cfg = zlab_dflash2_config()
    weights = {**dflash2_weights(cfg), "d2t": torch.zeros(96, dtype=torch.long)}
    with pytest.raises(DFlashError, match="a reduced-vocabulary DFlash2 drafter \\(tensor 'd2t'\\) is not supported"):
        load_drafter(write_drafter(tmp_path / "d2t", cfg, weights))
    config = json.loads((library / "config.json").read_text())
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "config.json").write_text(json.dumps({**config, "draft_vocab_size": 32}))
    with pytest.raises(DFlashError, match="field 'draft_vocab_size' 32 != transformer_layer_config.vocab_size 96"):
        read_drafter(tmp_path / "spec")


def test_a_missing_dflash2_tensor_is_named(tmp_path):
    cfg = zlab_dflash2_config()
    weights = dflash2_weights(cfg)
    del weights["candidate_selector.successor_codebook"]
    with pytest.raises(DFlashError, match="weight 'candidate_selector.successor_codebook' missing"):
        load_drafter(write_drafter(tmp_path / "d", cfg, weights))
    assert load_drafter(write_zlab_dflash2(tmp_path / "ok")).config.method == "dflash2"
