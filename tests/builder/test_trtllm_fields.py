"""The TensorRT-LLM field tables: their generator (tools/gen_trtllm_fields.py), the per-release choice, and the
option checker built on them.

What these tests prove: the generator turns pydantic class source of the shapes llm_args.py uses into the
expected table (a hand-written source below, with a hand-written expected table); each derived table is exactly
its base plus its recorded changes file; the committed tables hold what the builder writes and what each release
added; the checker rejects unknown keys with the nearest name (or the release that has them) and wrong types. What
they do not prove: that the 1.3.0rc27 table equals what the generator makes from upstream's file -- that file
cannot be committed (upstream code) nor fetched here. Set TRTLLM_LLM_ARGS=/path/to/llm_args.py (of the commit in
that table's `source`) to run that check too.
"""

import importlib.util
import json
import os
from pathlib import Path

import pytest
from packaging.version import Version

from trtllm_dflash.builder.trtllm.fields import check_options, literal_choices
from trtllm_dflash.builder.trtllm.tables import TABLES, known_versions, load_table, table_for
from trtllm_dflash.utils.errors import DFlashError

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gen_trtllm_fields", ROOT / "tools" / "gen_trtllm_fields.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

# Written for this test in the style of llm_args.py: inheritance, Field(...) forms, aliases, a coercing validator,
# enums, a discriminated union (filtered to DFlash like SpeculativeConfig), private and ClassVar members, a class
# nothing reaches, and the removed-arguments table.
SOURCE = '''
class Mode(StrEnum):
    FAST = "fast"
    SLOW = "slow"

class Base(StrictBaseModel):
    depth: NonNegativeInt = Field(default=0, ge=0)
    _private: int = PrivateAttr(1)

class Cache(Base):
    fraction: Optional[float] = Field(default=0.9, ge=0, le=1)
    mode: Mode = Field(default=Mode.FAST, status="beta")
    old: Optional[int] = Field(default=None, deprecated=True)
    sizes: List[int] = Field(default_factory=list, min_length=1)
    LIMIT: ClassVar[int] = 3

    @field_validator("sizes", mode="before")
    @classmethod
    def split(cls, v):
        return v

class DFlashDecodingConfig(Base):
    decoding_type: Literal["DFlash"] = Field(default="DFlash")
    speculative_model: Optional[str] = Field(None, validation_alias=AliasChoices("speculative_model", "model_dir"))

class EagleDecodingConfig(Base):
    decoding_type: Literal["Eagle"] = "Eagle"

class Unreached(StrictBaseModel):
    x: int = 1

SpeculativeConfig: TypeAlias = Annotated[Union[EagleDecodingConfig, DFlashDecodingConfig],
                                         Field(discriminator="decoding_type")]
Backend = Literal["a", "b"]
_TORCH_LLMARGS_REMOVED_ARG_CHECKS: Dict[str, Callable] = {"sampler_type": check}

class TorchLlmArgs(Base):
    model: str = Field()
    cache: Cache = Field(default_factory=Cache, status="prototype")
    speculative_config: Optional[SpeculativeConfig] = Field(default=None)
    backend: Backend = "a"
'''

EXPECTED = {
    "root": "TorchLlmArgs",
    "classes": {
        "Cache": {"fields": {
            "depth": {"type": "NonNegativeInt", "default": "0", "constraints": {"ge": 0}},
            "fraction": {"type": "Optional[float]", "default": "0.9", "constraints": {"ge": 0, "le": 1}},
            "mode": {"type": "Mode", "default": "Mode.FAST", "status": "beta"},
            "old": {"type": "Optional[int]", "default": "None", "status": "deprecated"},
            "sizes": {"type": "List[int]", "default": "<factory list>", "constraints": {"min_length": 1},
                      "coerced": True}}},
        "DFlashDecodingConfig": {"fields": {
            "depth": {"type": "NonNegativeInt", "default": "0", "constraints": {"ge": 0}},
            "decoding_type": {"type": "Literal['DFlash']", "default": "'DFlash'"},
            "speculative_model": {"type": "Optional[str]", "default": "None",
                                  "aliases": ["speculative_model", "model_dir"]}}},
        "TorchLlmArgs": {"fields": {
            "depth": {"type": "NonNegativeInt", "default": "0", "constraints": {"ge": 0}},
            "model": {"type": "str", "default": "<required>"},
            "cache": {"type": "Cache", "default": "<factory Cache>", "status": "prototype"},
            "speculative_config": {"type": "Optional[SpeculativeConfig]", "default": "None"},
            "backend": {"type": "Backend", "default": "'a'"}}},
    },
    "enums": {"Mode": {"FAST": "fast", "SLOW": "slow"}},
    "aliases": {"Backend": "Literal['a', 'b']",
                "SpeculativeConfig": {"union": ["DFlashDecodingConfig"], "discriminator": "decoding_type"}},
    "removed_args": ["sampler_type"],
}


def test_generator_reads_pydantic_classes():
    assert gen.build_table(SOURCE) == EXPECTED


def test_generator_cli_records_its_source(tmp_path):
    src = tmp_path / "llm_args.py"
    src.write_text(SOURCE)
    out = tmp_path / "table.json"
    assert gen.main(["generate", str(src), "--commit", "abc123", "--version", "9.9.0", "--output", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["source"]["commit"] == "abc123" and table["source"]["version"] == "9.9.0"
    assert len(table["source"]["sha256"]) == 64
    assert {k: v for k, v in table.items() if k != "source"} == EXPECTED
    assert gen.main(["generate", str(tmp_path / "nothing"), "--commit", "x", "--version", "1", "--output",
                     str(out)]) == 2


@pytest.mark.skipif(not os.environ.get("TRTLLM_LLM_ARGS"), reason="set TRTLLM_LLM_ARGS to upstream's llm_args.py")
def test_committed_table_is_what_upstream_generates():
    base = load_table("1.3.0rc27").data
    table = gen.generate(Path(os.environ["TRTLLM_LLM_ARGS"]), base["source"]["commit"], "1.3.0rc27")
    assert {k: v for k, v in table.items() if k != "source"} == {k: v for k, v in base.items() if k != "source"}


@pytest.mark.parametrize("version", ["1.4.0rc1", "1.4.0rc4"])
def test_derived_tables_are_their_base_plus_the_recorded_changes(version):
    """A hand edit of a derived table, or of its base or changes file without re-deriving, fails here."""
    changes = ROOT / "tools" / "trtllm_changes" / f"{version}.json"
    base = TABLES / f"{json.loads(changes.read_text())['base']}.json"
    assert gen.render(gen.derive(base, changes)) == (TABLES / f"{version}.json").read_text()
    source = load_table(version).data["source"]
    assert source["references"][0].startswith(f"https://nvidia.github.io/TensorRT-LLM/{version}/")


def test_tables_by_release():
    assert known_versions() == ["1.3.0rc27", "1.4.0rc1", "1.4.0rc4"]
    assert table_for().version == "1.4.0rc4"  # the newest known
    assert table_for("1.4.0").version == "1.4.0rc4" and table_for("1.4.0rc3").version == "1.4.0rc1"
    assert table_for("1.3.0rc29").version == "1.3.0rc27"
    with pytest.raises(DFlashError, match=r"--trtllm-version 1.2.1: TensorRT-LLM has DFlash from 1.3.0rc27"):
        table_for("1.2.1")
    with pytest.raises(DFlashError, match=r"--trtllm-version 'latest' is not a version"):
        table_for("latest")
    record = table_for("1.3.0rc30").record()
    assert record["upstream"] == "NVIDIA/TensorRT-LLM@58ae162af3cd63f77d6145ef0d8ee83b88bff662"
    assert len(record["table_sha256"]) == 64 and record["version"] == "1.3.0rc27"


@pytest.mark.parametrize("version", ["1.3.0rc27", "1.4.0rc1", "1.4.0rc4"])
def test_committed_tables_have_what_the_builder_writes(version):
    table = load_table(version)
    dflash = table.fields_of("DFlashDecodingConfig")
    assert dflash["attention_backend"]["type"] == "Literal['VANILLA', 'TRTLLM', 'FA4']"
    assert {"mask_token_id", "target_layer_ids", "draft_len_schedule", "use_rejection_sampling"} <= set(dflash)
    assert table.fields_of("KvCacheConfig")["enable_block_reuse"]["default"] == "True"  # why DFlash turns it off
    assert table.fields_of("TorchLlmArgs")["backend"]["status"] == "deprecated"


# what each release added, from its API reference (tools/trtllm_changes/)
ADDED = [({"speculative_config": {"decoding_type": "DFlash", "context_recompute_tail": 8}}, "1.4.0rc1"),
         ({"speculative_config": {"decoding_type": "DFlash", "skip_ctx_buffer_budget_check": True}}, "1.4.0rc1"),
         ({"speculative_config": {"decoding_type": "DFlash", "spec_dec_variant": 1}}, "1.4.0rc1"),
         ({"speculative_config": {"decoding_type": "DFlash", "moe_backend": "CUTEDSL_FC12"}}, "1.4.0rc1"),
         ({"speculative_config": {"decoding_type": "DFlash", "moe_tactic": "fp8_block"}}, "1.4.0rc4"),
         ({"moe_config": {"backend": "CUTEDSL_FC12"}}, "1.4.0rc4"),
         ({"moe_config": {"tactic": "fp8_block", "megamoe_fuse_shared_expert": True}}, "1.4.0rc4")]


@pytest.mark.parametrize("options, since", ADDED)
def test_each_release_accepts_what_it_added_and_older_ones_refuse_it(options, since):
    for version in known_versions():
        if Version(version) >= Version(since):
            assert check_options(options, load_table(version)) == []
        else:
            with pytest.raises(DFlashError) as err:
                check_options(options, load_table(version))
            assert f"TensorRT-LLM {version} field table" in str(err.value)


def test_an_option_a_newer_release_has_names_that_release():
    with pytest.raises(DFlashError) as err:
        check_options({"speculative_config": {"decoding_type": "DFlash", "context_recompute_tail": 8}},
                      load_table("1.3.0rc27"))
    assert str(err.value) == ("TensorRT-LLM option 'speculative_config.context_recompute_tail' is not a field of "
                              "DFlashDecodingConfig (TensorRT-LLM 1.3.0rc27 field table) (it is from TensorRT-LLM "
                              "1.4.0rc1: --trtllm-version 1.4.0rc1 or newer)")
    assert "CUTEDSL_FC12" in literal_choices(load_table("1.4.0rc4"), "MoeConfig", "backend")
    assert "CUTEDSL_FC12" not in literal_choices(load_table("1.4.0rc1"), "MoeConfig", "backend")


def test_unknown_keys_get_the_nearest_name():
    with pytest.raises(DFlashError, match=r"'kv_cache_config.enable_block_resue' is not a field of KvCacheConfig "
                                          r".*did you mean 'kv_cache_config.enable_block_reuse'"):
        check_options({"kv_cache_config": {"enable_block_resue": False}})
    with pytest.raises(DFlashError, match="did you mean 'max_batch_size'"):
        check_options({"max_batch_sise": 8})


@pytest.mark.parametrize("options, needle", [
    ({"kv_cache_config": {"free_gpu_memory_fraction": 1.5}}, "must satisfy le 1, got 1.5"),
    ({"kv_cache_config": {"free_gpu_memory_fraction": "lots"}}, "must be Optional[float], got 'lots'"),
    ({"moe_config": {"backend": "FOO"}}, "'moe_config.backend' must be Literal["),
    ({"stream_interval": 0}, "'stream_interval' must be PositiveInt, got 0"),
    ({"enable_chunked_prefill": "yes"}, "must be bool, got 'yes'"),
    ({"speculative_config": {"decoding_type": "Eagle3"}}, "must be one of 'DFlash'"),
    ({"speculative_config": {"max_draft_len": 3}}, "needs 'decoding_type'"),
    ({"speculative_config": {"decoding_type": "DFlash", "draft_len_schedule": {"a": 1}}}, "dict[int, int]"),
    ({"scheduler_config": {"capacity_scheduler_policy": "FAST"}}, "must be CapacitySchedulerPolicy"),
    ({"sampler_type": "auto"}, "'sampler_type' was removed"),
])
def test_wrong_values_are_named(options, needle):
    with pytest.raises(DFlashError) as err:
        check_options(options)
    assert needle in str(err.value), str(err.value)


def test_valid_options_pass_and_deprecated_ones_warn():
    options = {"cuda_graph_config": {"batch_sizes": [1, 2, 8], "enable_padding": True},  # mode inferred upstream
               "scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"},
               "speculative_config": {"decoding_type": "DFlash", "speculative_model_dir": "/d", "max_draft_len": 7},
               "lora_config": {"defined": "outside llm_args.py, passed through"}}
    assert check_options(options) == []
    assert check_options({"backend": "pytorch"}) == [
        "TensorRT-LLM option 'backend' is deprecated upstream (TensorRT-LLM 1.4.0rc4 field table)"]
