"""RuntimeConfig: validated once, errors naming the field (as a flag) or the Triton model parameter, and the
same config whether it comes from dflash-serve's or dflash-generate's flags or from the parameters dflash-serve
writes into config.pbtxt."""

from types import SimpleNamespace

import pytest

from trtllm_dflash.config.runtime import RuntimeConfig
from trtllm_dflash.engine.generator import Generator
from trtllm_dflash.serve.repository import ModelParameters, ServeSettings, validate_pbtxt, write_repository
from trtllm_dflash.utils.errors import DFlashError

BAD_FIELDS = [
    ("decoding", "eagle", "--decoding must be one of dflash, plain, got 'eagle'"),
    ("step_mode", "fast", "--step-mode must be one of auto, eager, compile, cuda-graphs, got 'fast'"),
    ("draft_len", "many", "--draft-len must be 'auto', a number of draft tokens, or a draft_len_schedule file; "
                          "got 'many'"),
    ("threads", 0, "--threads must be at least 1, got 0"),
    ("max_num_tokens", 0, "--max-num-tokens must be at least 1, got 0"),
    ("prefix_caching", "yes", "--prefix-caching must be true or false, got 'yes'"),
    ("kv_cache_gib", -1.0, "--kv-cache-gib must be positive, got -1.0"),
]


@pytest.mark.parametrize("name, value, message", BAD_FIELDS)
def test_each_field_error_names_the_field_and_value(name, value, message):
    with pytest.raises(DFlashError) as error:
        RuntimeConfig(**{name: value})
    assert str(error.value) == message


@pytest.mark.parametrize("name, text, message", [
    ("threads", "0", "model parameter 'threads' must be at least 1, got 0"),
    ("threads", "many", "model parameter 'threads' must be an integer, got 'many'"),
    ("max_num_tokens", "1.5", "model parameter 'max_num_tokens' must be an integer, got '1.5'"),
    ("kv_cache_gib", "lots", "model parameter 'kv_cache_gib' must be a number, got 'lots'"),
    ("kv_cache_gib", "0", "model parameter 'kv_cache_gib' must be positive, got 0.0"),
    ("prefix_caching", "yes", "model parameter 'prefix_caching' must be 1 or 0, got 'yes'"),
    ("step_mode", "fast", "model parameter 'step_mode' must be one of auto, eager, compile, cuda-graphs, got 'fast'"),
    ("decoding", "eagle", "model parameter 'decoding' must be one of dflash, plain, got 'eagle'"),
])
def test_triton_parameter_errors_name_the_parameter(name, text, message):
    with pytest.raises(DFlashError) as error:
        RuntimeConfig.from_triton_params({name: text})
    assert str(error.value) == message and "\n" not in message


def test_triton_parameters_as_the_model_read_them_before():
    """Absent parameters keep the defaults; prefix_caching "0" turns it off; kv_cache_gib is GiB."""
    assert RuntimeConfig.from_triton_params({}) == RuntimeConfig()
    assert RuntimeConfig.from_triton_params({"prefix_caching": "0"}).prefix_caching is False
    assert RuntimeConfig.from_triton_params({"prefix_caching": "1"}).prefix_caching is True
    assert RuntimeConfig.from_triton_params({"kv_cache_gib": "0.5"}).kv_cache_bytes == 2**29
    assert RuntimeConfig().kv_cache_bytes is None
    some = RuntimeConfig("plain", "eager", "3", 2, False, 8, 0.25)
    assert RuntimeConfig.from_triton_params(some.triton_params()) == some


def test_model_parameters_errors_name_the_parameter():
    params = {"engine_dir": "/e", "tp_size": "1", "max_batch_size": "4", "max_seq_len": "64", "max_queue": "8"}
    parsed = ModelParameters.parse(params)
    assert (parsed.max_batch_size, parsed.max_queue, parsed.admission.max_wait_s) == (4, 8, 0.05)
    with pytest.raises(DFlashError, match="^model parameter 'engine_dir' is missing"):
        ModelParameters.parse({k: v for k, v in params.items() if k != "engine_dir"})
    with pytest.raises(DFlashError, match="^model parameter 'max_queue' must be an integer, got 'x'$"):
        ModelParameters.parse({**params, "max_queue": "x"})
    with pytest.raises(DFlashError, match="^model parameter 'admission_wait_ms' must be .* got '-5'$"):
        ModelParameters.parse({**params, "admission_wait_ms": "-5"})


def test_serve_flags_and_the_parameters_they_write_give_one_config(tmp_path):
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec
    from trtllm_dflash.cli.serve import parser
    from trtllm_dflash.pairs import stdlib_pair

    target, drafter = stdlib_pair()
    engine = build_engine(BuildSpec(str(target), str(drafter), str(tmp_path / "e"), max_seq_len=64), "test")
    flags = ["--threads", "2", "--step-mode", "eager", "--draft-len", "3", "--kv-cache-gib", "0.5",
             "--no-prefix-caching", "--max-num-tokens", "16", "--decoding", "dflash"]
    from_flags = RuntimeConfig.from_flags(parser().parse_args([str(engine), *flags]))
    assert from_flags == RuntimeConfig("dflash", "eager", "3", 2, False, 16, 0.5)
    model = write_repository(engine, tmp_path / "repo", ServeSettings("m", 4, 10, **vars(from_flags)))
    params = {k: v.string_value for k, v in validate_pbtxt((model / "config.pbtxt").read_text()).parameters.items()}
    assert ModelParameters.parse(params).runtime == from_flags
    defaults = write_repository(engine, tmp_path / "repo2", ServeSettings("m", threads=2))
    params = {k: v.string_value for k, v in validate_pbtxt((defaults / "config.pbtxt").read_text()).parameters.items()}
    assert ModelParameters.parse(params).runtime == RuntimeConfig.from_flags(parser().parse_args([str(engine),
                                                                                                 "--threads", "2"]))


def test_generate_flags_give_the_config():
    from trtllm_dflash.cli.generate import parser

    base = ["--target", "builtin", "--prompt-ids", "5", "--max-new-tokens", "4"]
    assert RuntimeConfig.from_flags(parser().parse_args(base)) == RuntimeConfig()
    given = parser().parse_args([*base, "--draft-len", "3", "--threads", "2", "--step-mode", "compile"])
    assert RuntimeConfig.from_flags(given) == RuntimeConfig(step_mode="compile", draft_len="3", threads=2)


def test_configure_sets_the_generator_and_temporarily_restores_it():
    """On a stand-in: the two methods touch only these fields."""
    g = SimpleNamespace(policy="p", prefix_caching=True, max_num_tokens=None, kv_cache_bytes=None,
                        pool=SimpleNamespace(prefix_caching=True))
    Generator.configure(g, RuntimeConfig(prefix_caching=False, max_num_tokens=8, kv_cache_gib=1.0), "q")
    assert (g.policy, g.prefix_caching, g.max_num_tokens, g.kv_cache_bytes) == ("q", False, 8, 2**30)
    Generator.configure(g, RuntimeConfig(kv_cache_gib=1.0), "q", kv_cache_bytes=5)
    assert g.kv_cache_bytes == 5
    with pytest.raises(RuntimeError), Generator.temporarily(g, "probe", prefix_caching=False):
        assert (g.policy, g.pool.prefix_caching) == ("probe", False)
        raise RuntimeError
    assert (g.policy, g.pool.prefix_caching) == ("q", True)
    with Generator.temporarily(g, "probe"):
        assert (g.policy, g.pool.prefix_caching) == ("probe", True)
    assert g.policy == "q"
