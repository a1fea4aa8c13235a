"""benchmarks/gpu_decode.py runs end to end (tiny shapes on the CPU; the real run needs a GPU) and its derived
numbers follow from its measurements as its docstring defines them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_decode.py"


def test_tiny_smoke_run_writes_consistent_numbers(tmp_path):
    out = tmp_path / "gpu_decode.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--batches", "1,2", "--repeats", "2",
                          "--step-modes", "eager", "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["shapes"] == "tiny" and list(record["modes"]) == ["eager"] and record["modes"]["eager"]["compile_s"] == 0
    assert record["roofline_step_s"] == pytest.approx(record["weight_bytes_per_step"] / record["copy_bandwidth_bytes_per_s"])
    rows = record["modes"]["eager"]["rows"]
    assert [r["batch"] for r in rows] == [1, 2]
    for row in rows:
        assert len(row["ar_step_samples_s"]) == 2 and row["ar_step_s"] > 0 and 0 < row["drafter_s"] < row["dflash_step_s"]
        assert row["verify_s"] == pytest.approx(row["dflash_step_s"] - row["drafter_s"])
        assert row["projected_speedup_tau_6.49"] == pytest.approx(6.49 * row["ar_step_s"] / row["dflash_step_s"])


def test_without_a_gpu_it_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "no CUDA device here" in run.stderr and "Traceback" not in run.stderr
