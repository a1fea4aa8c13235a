"""Engines as a user runs them, each in a fresh process, on an engine of the shipped pair (no training):
dflash-generate --engine's limits and threads, dflash-serve's threads parameter, set-up paid at load."""

import json
import os
import subprocess
import sys

import pytest

from trtllm_dflash.pairs import stdlib_pair

pytestmark = pytest.mark.slow  # each check a fresh process
MAX_SEQ_LEN = 64


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from trtllm_dflash.builder.builder import build_engine
    from trtllm_dflash.builder.spec import BuildSpec

    target, drafter = stdlib_pair()
    out = tmp_path_factory.mktemp("engine") / "e"
    return build_engine(BuildSpec(str(target), str(drafter), str(out), dtype="float32", max_seq_len=MAX_SEQ_LEN),
                        "test")


def generate(engine, *args):
    return subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", "--engine", str(engine),
                           "--prompt-ids", "5,6,7", "--ignore-eos", "--draft-len", "3", "--json", *args],
                          capture_output=True, text=True)


def test_a_request_past_the_engines_max_seq_len_is_refused(engine):
    """Issue 13, item 16: 1031 tokens ran on a 1024 engine."""
    over = generate(engine, "--max-new-tokens", str(MAX_SEQ_LEN - 2))
    assert over.returncode == 2 and over.stdout == ""
    assert over.stderr.strip() == (f"dflash-generate: error: prompt length 3 + max_new_tokens {MAX_SEQ_LEN - 2} = "
                                   f"{MAX_SEQ_LEN + 1} exceeds this engine's max_seq_len {MAX_SEQ_LEN}")
    fits = generate(engine, "--max-new-tokens", str(MAX_SEQ_LEN - 3))
    assert fits.returncode == 0, fits.stderr
    assert len(json.loads(fits.stdout)["output_ids"]) == MAX_SEQ_LEN - 3


WARM_UP = """
import json, sys
from trtllm_dflash.engine.request import Request
if sys.argv[1] == "engine":
    from trtllm_dflash.engine.loader import load_engine
    pipeline = load_engine(sys.argv[2])
else:
    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.engine.pipeline import load_pipeline
    pipeline = load_pipeline(*stdlib_pair())
loaded = set(sys.modules)
result = pipeline.generator.generate([Request((5, 6, 7), 8, ignore_eos=True)])[0]
print(json.dumps({"imported": sorted(set(sys.modules) - loaded), "drafted": result.drafted_tokens}))
"""


@pytest.mark.parametrize("how", ["engine", "checkpoints"])
def test_set_up_is_paid_at_load_not_by_the_first_request(engine, how):
    """Issue 13, item 12: the first DFlash step imported torch._dynamo, sympy and triton (the context_kv op's first
    call, about 1 s of its TTFT). Loading warms up through the real step path, drafter included; the first request
    then imports nothing. (A served model loads through load_engine, so its first request too.)"""
    out = subprocess.run([sys.executable, "-c", WARM_UP, how, str(engine)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["imported"] == [] and result["drafted"] > 0


def one_core():
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def test_generate_threads_default_from_the_cores_it_may_use_and_reported(engine):
    """Issue 13, item 13: torch's default is one thread per core of the machine, whatever the process may use."""
    given = generate(engine, "--max-new-tokens", "4", "--threads", "3")
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout)["threads"] == 3
    pinned = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", "--engine", str(engine),
                             "--prompt-ids", "5,6,7", "--max-new-tokens", "4", "--draft-len", "3", "--json"],
                            capture_output=True, text=True, preexec_fn=one_core)
    assert pinned.returncode == 0, pinned.stderr
    assert json.loads(pinned.stdout)["threads"] == 1  # taskset to one core: one thread


@pytest.mark.parametrize("value, message", [("0", "--threads must be at least 1, got 0"),
                                            ("many", "argument --threads: invalid int value: 'many'")])
def test_bad_threads_is_one_line_and_exit_2(engine, tmp_path, value, message):
    bad = generate(engine, "--max-new-tokens", "4", "--threads", value)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr == f"dflash-generate: error: {message}\n"
    serve = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.serve", str(engine), "--repository-only",
                            "--model-repo", str(tmp_path / "repo"), "--threads", value], capture_output=True, text=True)
    assert serve.returncode == 2 and serve.stderr == f"dflash-serve: error: {message}\n"
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("value, message", [
    ("cuda-graphs", "step mode cuda-graphs needs a CUDA device, got 'cpu' (use compile or eager)"),
    ("fast", "argument --step-mode: invalid choice: 'fast' (choose from ")])  # argparse quotes choices by version
def test_bad_step_mode_is_one_line_and_exit_2(engine, value, message):
    bad = generate(engine, "--max-new-tokens", "4", "--step-mode", value)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.startswith(f"dflash-generate: error: {message}")
    assert bad.stderr.count("\n") == 1


def test_serve_passes_threads_to_the_triton_model(engine, tmp_path):
    from trtllm_dflash.serve.repository import validate_pbtxt
    from trtllm_dflash.utils.threads import default_threads

    def threads_param(*extra, **kw):
        repo = tmp_path / f"repo{len(extra)}"
        done = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.serve", str(engine), "--repository-only",
                               "--model-repo", str(repo), *extra], capture_output=True, text=True, **kw)
        assert done.returncode == 0, done.stderr
        return validate_pbtxt((repo / "dflash" / "config.pbtxt").read_text()).parameters["threads"].string_value

    assert threads_param("--threads", "3") == "3"
    assert threads_param() == str(default_threads())  # a TP-1 engine: the cores dflash-serve may use, at most 8
