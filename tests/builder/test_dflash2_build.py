"""dflash-build of a DFlash2 pair: the torch backend builds, verifies and decodes it exactly (TP=1 in process, TP=2
through dflash-generate); the trtllm backend refuses it in one line naming the upstream evidence."""

import json
import subprocess
import sys

import pytest
from helpers.dflash2 import SLIDING, library_dflash2
from helpers.oracle import hf_greedy
from helpers.tiny_models import add_tokenizer, hf_config, make_hf_target
from trtllm_dflash.builder.verify import verify_engine
from trtllm_dflash.cli.build import main as build_main
from trtllm_dflash.engine.loader import load_engine
from trtllm_dflash.engine.request import Request
from trtllm_dflash.speculative import DFlash2Proposer

pytest.importorskip("speculators", reason="the test set-up installs speculators (Makefile)")

PROMPT, N = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51], 20


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("d2-build")
    hf = make_hf_target(root / "target", "qwen3", seed=11)
    add_tokenizer(root / "target")
    drafter = library_dflash2(root / "drafter", root / "target", hf_config("qwen3", num_hidden_layers=2, **SLIDING))
    return hf, root / "target", drafter


def build(*args) -> int:
    return build_main([str(a) for a in args])


@pytest.mark.slow  # two builds and a TP=2 dflash-generate process
def test_torch_engines_verify_and_decode_exactly(pair, tmp_path):
    hf, target, drafter = pair
    expected = hf_greedy(hf, PROMPT, N)
    for tp in (1, 2):
        assert build("--target", target, "--drafter", drafter, "--output", tmp_path / f"tp{tp}", "--tp", tp,
                     "--dtype", "float32") == 0
        ok, lines = verify_engine(tmp_path / f"tp{tp}")
        assert ok, lines
    generator = load_engine(tmp_path / "tp1").generator
    assert isinstance(generator.proposer, DFlash2Proposer)
    assert generator.generate([Request(tuple(PROMPT), N, ignore_eos=True)])[0].output_ids == expected
    proc = subprocess.run([sys.executable, "-m", "trtllm_dflash.cli.generate", "--engine", str(tmp_path / "tp2"),
                           "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", str(N), "--ignore-eos",
                           "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["output_ids"] == expected


def test_trtllm_backend_refuses_dflash2_in_one_line(pair, tmp_path, capsys):
    _, target, drafter = pair
    code = build("--target", target, "--drafter", drafter, "--output", tmp_path / "trt", "--backend", "trtllm")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    for needle in ("DFlash2", "PR #18155", "1.4.0rc4", "PR #19159", "non-causal sliding window", "--backend torch"):
        assert needle in err[0], (needle, err[0])
    assert not (tmp_path / "trt").exists()
