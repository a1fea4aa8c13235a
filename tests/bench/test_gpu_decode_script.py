"""benchmarks/gpu_decode.py runs end to end (tiny shapes on the CPU; the real run needs a GPU) and its derived
numbers follow from its measurements as its docstring defines them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_decode.py"


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


def test_schedule_smoke_run_chooses_the_best_draft_length_per_batch(tmp_path):
    """benchmarks/gpu_schedule.py (tiny shapes, eager, on the CPU): the schedule it writes is a valid TensorRT-LLM
    schedule whose every step is the batch's best expected tokens/s, capped by the first, and the stated tau
    holds for the acceptance it solved for."""
    from trtllm_dflash.draft_length.schedule import read_schedule

    out = tmp_path / "gpu_schedule.json"
    run = subprocess.run([sys.executable, str(SCRIPT.with_name("gpu_schedule.py")), "--tiny", "--device", "cpu",
                          "--step-mode", "eager", "--max-batch", "4", "--repeats", "1", "--output", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    a = record["acceptance_per_position"]
    assert sum(a ** i for i in range(16)) == pytest.approx(6.49, rel=1e-6)
    schedule = read_schedule(out.with_suffix(".yaml"))
    assert [b for b, _ in schedule.steps] == [r["batch"] for r in record["rows"]] == [1, 2, 4]
    first = record["rows"][0]["best"]
    for row, (_, k) in zip(record["rows"], schedule.steps):
        rates = row["tokens_per_s"]
        assert row["best"] == rates.index(max(rates)) and k == min(row["best"], first)
        assert rates[3] == pytest.approx(row["batch"] * sum(a ** i for i in range(4)) / row["seconds"][3])


def test_schedules_at_other_acceptance_come_from_the_committed_h100_costs(tmp_path):
    """gpu_schedule.py --from: the committed H100 record's step costs, re-chosen at other taus without a GPU. Each
    scheduled draft length is the batch's best expected tokens/s (computed here from the record's per-batch step
    seconds and the acceptance's closed form), capped by the first; never below plain; at the record's own tau
    the record's schedule."""
    record_path = SCRIPT.parent / "results" / "gpu_h100" / "gpu_schedule_cuda-graphs.json"
    record = json.loads(record_path.read_text())
    out = tmp_path / "taus.json"
    run = subprocess.run([sys.executable, str(SCRIPT.with_name("gpu_schedule.py")), "--from", str(record_path),
                          "--taus", f"1.2,3,{record['tau']}", "--output", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [r["tau"] for r in result["taus"]] == [1.2, 3, record["tau"]]
    for row in result["taus"]:
        a = row["acceptance_per_position"]
        assert sum(a ** i for i in range(16)) == pytest.approx(row["tau"], rel=1e-6)
        best = {}
        for r in record["rows"]:  # seconds per draft length 0..15 at the record's context
            rates = [r["batch"] * sum(a ** i for i in range(k + 1)) / s for k, s in enumerate(r["seconds"])]
            best[r["batch"]] = rates.index(max(rates))
        first = best[record["rows"][0]["batch"]]
        assert row["schedule"] == {str(b): min(k, first) for b, k in best.items()}
        assert all(g >= 1 for g in row["gain_over_plain"].values())
    assert result["taus"][-1]["schedule"] == record["schedule"]
    bad = subprocess.run([sys.executable, str(SCRIPT.with_name("gpu_schedule.py")), "--from", str(record_path),
                          "--taus", "0.5", "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "every tau must be in [1, 16], got 0.5" in bad.stderr and "Traceback" not in bad.stderr


def test_session_writes_both_scripts_records_from_one_build(tmp_path):
    """benchmarks/gpu_session.py (tiny, eager, CPU): gpu_schedule.py's and gpu_decode.py's records from one process,
    each in its script's format; a deadline already passed runs no mode and says so."""
    from trtllm_dflash.draft_length.schedule import read_schedule

    session = SCRIPT.with_name("gpu_session.py")
    run = subprocess.run([sys.executable, str(session), "--tiny", "--device", "cpu", "--step-modes", "eager",
                          "--batches", "1,2", "--repeats", "2", "--max-batch", "2", "--calibration-repeats", "1",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    decode = json.loads((tmp_path / "gpu_decode.json").read_text())
    rows = decode["modes"]["eager"]["rows"]
    assert [r["batch"] for r in rows] == [1, 2] and all(len(r["ar_step_samples_s"]) == 2 for r in rows)
    assert rows[0]["ar_step_roofline_fraction"] == pytest.approx(decode["roofline_step_s"] / rows[0]["ar_step_s"])
    schedule = json.loads((tmp_path / "gpu_schedule_eager.json").read_text())
    assert schedule["step_mode"] == "eager" and [r["batch"] for r in schedule["rows"]] == [1, 2]
    assert [b for b, _ in read_schedule(tmp_path / "gpu_schedule_eager.yaml").steps] == [1, 2]

    late = subprocess.run([sys.executable, str(session), "--tiny", "--device", "cpu", "--step-modes", "eager",
                           "--deadline-s", "0", "--out", str(tmp_path / "late")], capture_output=True, text=True,
                          timeout=600)
    assert late.returncode == 0 and "deadline passed, eager not run" in late.stderr
    assert not (tmp_path / "late" / "gpu_schedule_eager.json").exists()
