"""DFlash2 drafter configs in z-lab's layout: the method and its four fields, each bad value refused in one line."""

import re

import pytest
from helpers.dflash2 import zlab_dflash2_config
from helpers.tiny_models import drafter_config
from trtllm_dflash.config.dflash2 import DFlash2Config
from trtllm_dflash.config.pairing import validate_pair
from trtllm_dflash.models.registry import parse_drafter_config, parse_target_config
from trtllm_dflash.utils.errors import DFlashError


def test_the_published_layout_reads_as_dflash2():
    cfg = parse_drafter_config(zlab_dflash2_config(), "d/config.json")
    assert cfg.method == "dflash2" and cfg.dflash2 == DFlash2Config(3, 8, 8, 4)
    assert cfg.block_size == 8 and cfg.is_causal is False and cfg.target_layer_ids == (0, 2)
    assert cfg.layer_types == ("sliding_attention", "full_attention") and cfg.sliding_window == 64
    assert parse_drafter_config(drafter_config(), "d").method == "dflash"


def test_absent_fields_take_the_speculators_defaults():
    data = zlab_dflash2_config()
    data["dflash_config"] = {k: v for k, v in data["dflash_config"].items() if not k.startswith(("conv", "selector"))}
    data["hidden_size"] = 64  # conv_group_size 16 must divide it
    data["intermediate_size"] = 64
    cfg = parse_drafter_config({**data, "vocab_size": 300}, "d")
    assert cfg.dflash2 == DFlash2Config(2, 16, 256, 16)


@pytest.mark.parametrize("field, value, needle", [
    ("conv_group_size", 5, "field 'conv_group_size' 5 does not divide hidden_size 32"),
    ("conv_kernel_size", 9, "field 'conv_kernel_size' 9 exceeds block_size 8"),
    ("conv_kernel_size", 0, "field 'conv_kernel_size' must be a positive int, got 0"),
    ("selector_top_k", 1, "field 'selector_top_k' must be in 2..vocab_size 96, got 1"),
    ("selector_top_k", 97, "field 'selector_top_k' must be in 2..vocab_size 96, got 97"),
    ("selector_rank", 0, "field 'selector_rank' must be a positive int, got 0"),
    ("selector_rank", "8", "field 'selector_rank' must be a positive int, got '8'"),
])
def test_bad_dflash2_fields_are_one_line(field, value, needle):
    data = zlab_dflash2_config()
    data["dflash_config"][field] = value
    with pytest.raises(DFlashError, match=re.escape(needle)) as err:
        parse_drafter_config(data, "d/config.json")
    assert "\n" not in str(err.value) and str(err.value).startswith("d/config.json: ")


def test_reduced_vocabulary_and_v1_with_dflash2_fields_are_refused():
    with pytest.raises(DFlashError, match=re.escape("field 'draft_vocab_size' 32 != vocab_size 96: a reduced draft")):
        parse_drafter_config({**zlab_dflash2_config(), "draft_vocab_size": 32}, "d")
    v1 = drafter_config()
    v1["dflash_config"]["selector_top_k"] = 4
    with pytest.raises(DFlashError, match="unsupported dflash_config field 'selector_top_k'=4"):
        parse_drafter_config(v1, "d")


def test_a_dflash2_drafter_is_no_target_and_pairing_names_the_mismatch():
    with pytest.raises(DFlashError, match=re.escape("this is a DFlash drafter (DFlash2DraftModel), not a target")):
        parse_target_config(zlab_dflash2_config(), "d")
    target = parse_target_config({**drafter_config(), "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4,
                                  "vocab_size": 100}, "t")
    with pytest.raises(DFlashError, match="drafter vocab_size 96 != target vocab_size 100"):
        validate_pair(target, parse_drafter_config(zlab_dflash2_config(), "d"))
