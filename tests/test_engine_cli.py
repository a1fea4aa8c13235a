"""dflash-generate --engine as a user runs it (a subprocess), on an engine of the shipped pair (no training)."""

import json
import subprocess
import sys

import pytest

from trtllm_dflash.pairs import stdlib_pair

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
