"""dflash-bench sweep settings: presets (the shipped ones too), flags over presets, validation naming the value."""

from pathlib import Path

import pytest

from trtllm_dflash.bench.spec import LoadPoint, SweepSpec
from trtllm_dflash.cli.bench import main
from trtllm_dflash.utils.errors import DFlashError

PRESETS = Path(__file__).parents[2] / "benchmarks" / "presets"
SERVER = {"url": "http://h:8000", "model": "m"}


@pytest.mark.parametrize("name, isl, osl", [("1k1k", 1024, 1024), ("8k1k", 8192, 1024), ("1k8k", 1024, 8192)])
def test_standard_shape_presets(name, isl, osl):
    spec = SweepSpec.from_sources(str(PRESETS / f"{name}.yaml"), SERVER)
    assert (spec.isl, spec.osl, spec.isl_range) == (isl, osl, 0.8)
    assert spec.concurrency == (1, 2, 4, 8, 16, 32, 64)
    assert [spec.requests_for(p) for p in spec.points] == [10, 20, 40, 80, 160, 320, 640]
    assert [spec.warmup_for(p) for p in spec.points] == [2, 4, 8, 16, 32, 64, 128]


def test_cpu_preset_names_the_local_server():
    spec = SweepSpec.from_sources(str(PRESETS / "cpu-builtin.yaml"), {})
    assert (spec.url, spec.model, spec.api) == ("http://127.0.0.1:8000", "dflash", "triton-http")
    assert [p.name for p in spec.points] == ["c1", "c2", "c4"] and spec.requests_for(LoadPoint(4)) == 8


def test_flags_win_over_the_preset(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("concurrency: 1,2\nisl: 64\nosl: 32\nprompts-per-point: 5\nlabel: from-preset\n")
    spec = SweepSpec.from_sources(str(preset), {**SERVER, "osl": 8, "label": None, "concurrency": "4"})
    assert (spec.isl, spec.osl, spec.prompts_per_point, spec.label, spec.concurrency) == (64, 8, 5, "from-preset", (4,))


@pytest.mark.parametrize("text, needle", [
    ("isl: 64\nconcurency: [1, 2]\n", "unknown key 'concurency'"),
    ("isl: [1\n", "is not valid YAML at line"),
    ("- 1\n- 2\n", "must hold a YAML mapping of sweep settings, got list"),
    ("isl: -3\n", "--isl must be a positive integer, got -3"),
    ("concurrency: [1, 2, 2]\n", "--concurrency: repeated value in '1,2,2'"),
    ("dataset: 5\n", "--dataset must be a non-empty string, got 5"),
    ("label: [a, b]\n", "--label must be a non-empty string, got ['a', 'b']"),
    (b"isl: \xff\n", "preset .* is not valid YAML"),
])
def test_bad_presets(tmp_path, text, needle):
    preset = tmp_path / "p.yaml"
    preset.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DFlashError, match=needle.replace("[", r"\[")):
        SweepSpec.from_sources(str(preset), SERVER)


def test_preset_errors_through_the_cli_are_one_line(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text("osl: 32\nfoo: 1\n")
    assert main(["sweep", "--preset", str(preset), "--url", "http://h:1", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert err == f"dflash-bench: error: preset {preset}: unknown key 'foo' (known: " + err.split("(known: ")[1]
    assert err.count("\n") == 1
    assert main(["sweep", "--preset", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err == f"dflash-bench: error: --preset: no such file: {tmp_path / 'none.yaml'}\n"


def test_request_rate_points_and_the_in_flight_cap():
    spec = SweepSpec(**SERVER, request_rate="0.5,2", concurrency=8)
    assert [(p.concurrency, p.rate, p.name) for p in spec.points] == [(8, 0.5, "r0.5-c8"), (8, 2.0, "r2-c8")]
    assert [spec.requests_for(p) for p in spec.points] == [5, 20] and spec.warmup_for(spec.points[0]) == 1
    assert SweepSpec(**SERVER, request_rate=[4]).points == [LoadPoint(None, 4.0)]
    with pytest.raises(DFlashError, match="--concurrency with --request-rate is one in-flight cap, got 1,2"):
        SweepSpec(**SERVER, request_rate="1", concurrency="1,2")
    with pytest.raises(DFlashError, match="--request-rate: '-1' is not a positive number"):
        SweepSpec(**SERVER, request_rate="2,-1")


def test_duration_points_have_no_request_count():
    spec = SweepSpec(**SERVER, duration=30, concurrency=[2])
    assert spec.requests_for(spec.points[0]) is None and spec.warmup_for(spec.points[0]) == 4


@pytest.mark.parametrize("argv, needle", [
    (["sweep", "--model", "m"], "--url is required (a flag, or the preset key 'url')"),
    (["sweep", "--url", "u"], "--model is required"),
    (["sweep", "--url", "u", "--model", "m", "--timeout", "0"], "--timeout must be a positive number, got 0.0"),
    (["sweep", "--url", "u", "--model", "m", "--warmup", "-1"], "--warmup must be a non-negative integer, got -1"),
    (["sweep", "--url", "u", "--model", "m", "--bogus"], "unrecognized arguments: --bogus"),
    ([], "choose a command: sweep, report or tune"),
])
def test_cli_usage_errors_are_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dflash-bench: error: ") and needle in err, err


def test_grpc_url_must_be_host_and_port(tmp_path, capsys):
    from helpers.bench_fakes import byte_tokenizer

    tok = byte_tokenizer(tmp_path / "tok")
    assert main(["sweep", "--api", "triton-grpc", "--url", "http://h:8001", "--model", "m", "--tokenizer",
                 str(tok)]) == 2
    assert "--url for triton-grpc is host:port (or grpc://host:port), got 'http://h:8001'" in capsys.readouterr().err


def test_every_api_has_a_registered_client():
    from trtllm_dflash.bench.clients import REGISTRY, ClientSettings, make_client
    from trtllm_dflash.bench.spec import APIS

    assert set(REGISTRY) == set(APIS)
    with pytest.raises(DFlashError, match="--api: unknown API 'soap'"):
        make_client("soap", ClientSettings("http://h", "m"))


@pytest.mark.parametrize("api, url, expected", [
    ("triton-http", "http://node3:9000", ["http://node3:9002/metrics", "http://node3:8002/metrics"]),
    ("triton-grpc", "node3:9001", ["http://node3:9002/metrics", "http://node3:8002/metrics"]),
    ("triton-http", "http://127.0.0.1:8000", ["http://127.0.0.1:8002/metrics"]),
    ("openai", "http://127.0.0.1:8003", []),
])
def test_metrics_found_where_dflash_serve_puts_them(api, url, expected):
    """dflash-serve's default ports are consecutive (HTTP, gRPC, metrics); a moved HTTP port moves them all."""
    from trtllm_dflash.bench.sweep import metrics_urls

    assert metrics_urls(SweepSpec(url=url, model="dflash", api=api, concurrency=1)) == expected
    given = SweepSpec(url=url, model="dflash", api=api, concurrency=1, metrics_url="http://m:1/metrics")
    assert metrics_urls(given) == ["http://m:1/metrics"]
