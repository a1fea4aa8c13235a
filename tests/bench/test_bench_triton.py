"""dflash-bench end to end: the real tritonserver on loopback serving the built-in pair's torch engine."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.triton import serving
from trtllm_dflash.config.manifest import sha256_file

from trtllm_dflash.cli.bench import main

pytest.importorskip("tritonclient")
pytest.importorskip("aiohttp")
pytestmark = pytest.mark.serve  # the real tritonserver

PNGS = ("frontier.png", "ttft_vs_throughput.png", "acceptance_vs_concurrency.png")


@pytest.fixture(scope="module")
def server(triton_server):
    """The session's server (conftest.py): the same engine and settings; the checks read counters as deltas."""
    return triton_server


def sweep_argv(srv, out, *extra, api="triton-http"):
    ends = srv["ends"]
    url = ends.http_url if api == "triton-http" else f"{ends.host}:{ends.grpc_port}"
    return ["sweep", "--url", url, "--api", api, "--model", "dflash", "--tokenizer", str(srv["engine"]),
            "--metrics-url", ends.metrics_url, "--isl", "24", "--osl", "16", "--warmup", "1", "--output", str(out),
            "--no-progress", *extra]


def rows_by_point(run):
    rows = {}
    for line in (run / "requests.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["point"], []).append(row)
    return rows


def check_run(run, srv, points, per_point):
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["num_gpus"] == 1
    assert manifest["drafter_method"] == "dflash"  # the server's dflash_drafter_info names its drafter's method
    assert manifest["engine"]["manifest_sha256"] == sha256_file(srv["engine"] / "manifest.json")
    summary = json.loads((run / "summary.json").read_text())["points"]
    rows = rows_by_point(run)
    assert [p["point"] for p in summary] == points and sorted(rows) == sorted(points)
    for p in summary:
        mine = rows[p["point"]]
        assert len(mine) == per_point and all(r["ok"] for r in mine), mine
        assert all(r["osl"] == r["osl_server"] == 16 and r["server_finish_reason"] == "length" for r in mine)
        assert all(20 <= r["isl"] <= 24 for r in mine)  # random lengths in [0.8 x 24, 24]
        accepted = sum(r["server_accepted_draft_tokens"] for r in mine)
        drafted = sum(r["server_draft_tokens"] for r in mine)
        delta = p["counters"]
        # nothing else reached the server during the point: the counters saw exactly our requests
        assert delta["requests"] == per_point and delta["generated_tokens"] == sum(r["osl"] for r in mine)
        assert (delta["accepted_tokens"], delta["drafted_tokens"]) == (accepted, drafted)
        if drafted:
            assert p["acceptance_rate"] == pytest.approx(accepted / drafted, abs=1e-12)
            assert p["acceptance_rate_responses"] == pytest.approx(p["acceptance_rate"], abs=1e-12)
            assert p["acceptance_length"] == pytest.approx(1 + accepted / delta["draft_steps"])
        else:  # --draft-len auto may decode a whole point plainly: no rate, not a division by zero
            assert p["acceptance_rate"] is p["acceptance_rate_responses"] is None
        # every batch step drafted 0..block-1 tokens per request; a request is in at most every step
        assert delta["decode_steps"] >= max(r["server_draft_tokens"] > 0 for r in mine)
        assert 0 <= p["draft_len_mean"] <= srv["block"] - 1 and 0 <= p["plain_step_share"] <= 1
        # the pool's counters over the point: every prompt looked up once at admission (again when preempted)
        looked_up = sum(r["isl"] for r in mine)
        assert delta["prefix_tokens"] == looked_up if not delta["preemptions"] else delta["prefix_tokens"] > looked_up
        assert p["preemptions"] == delta["preemptions"]
        assert 0 <= p["prefix_hit_rate"] <= 1
        assert p["output_tokens"] == 16 * per_point and p["total_throughput_per_gpu"] > 0
        tpots = [r["tpot_s"] for r in mine if r["tpot_s"] is not None]
        assert p["tpot_undefined"] == per_point - len(tpots)
        assert all(r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / 15) for r in mine if r["chunks"] > 1)
        if tpots:
            assert p["interactivity_median"] == pytest.approx(1000 / p["tpot_ms_median"])
    return summary


def test_sweep_then_report_on_the_real_server(server, tmp_path, capsys):
    from trtllm_dflash.bench.frontier import interpolate, pareto_frontier

    http, grpc = tmp_path / "http", tmp_path / "grpc"
    assert main(sweep_argv(server, http, "--concurrency", "1,2", "--prompts-per-point", "4", "--label", "http")) == 0
    assert main(sweep_argv(server, grpc, "--concurrency", "2", "--prompts-per-point", "4", "--label", "grpc",
                           api="triton-grpc")) == 0
    http_points = check_run(http, server, ["c1", "c2"], 4)
    check_run(grpc, server, ["c2"], 4)

    front = pareto_frontier((p["interactivity_median"], p["total_throughput_per_gpu"]) for p in http_points)
    assert front, http_points
    level, beyond = front[0][0], 100 * max(p["interactivity_median"] for p in http_points)
    rep = tmp_path / "report"
    assert main(["report", str(http), str(grpc), "--baseline", "http", "--interactivity", f"{level!r},{beyond!r}",
                 "--output", str(rep)]) == 0
    table = json.loads((rep / "table.json").read_text())
    rows = {(r["interactivity"], r["label"]): r for r in table["rows"]}
    assert rows[(level, "http")]["throughput_per_gpu"] == pytest.approx(front[0][1])  # a measured point
    assert rows[(level, "http")]["ratio_to_baseline"] == pytest.approx(1.0)
    assert rows[(beyond, "http")]["throughput_per_gpu"] is None and rows[(beyond, "grpc")]["throughput_per_gpu"] is None
    grpc_value, grpc_front = rows[(level, "grpc")]["throughput_per_gpu"], [tuple(p) for p in table["frontiers"]["grpc"]]
    if level < grpc_front[0][0]:  # below grpc's measured range: a lower bound, its best point at or above
        assert rows[(level, "grpc")]["basis"] == "at_or_above" and grpc_value == pytest.approx(grpc_front[0][1])
    else:
        assert grpc_value == interpolate(grpc_front, [level])[0]
    if grpc_value is not None:
        assert rows[(level, "grpc")]["ratio_to_baseline"] == pytest.approx(grpc_value / front[0][1])
    csv_lines = (rep / "table.csv").read_text().splitlines()
    assert csv_lines[0] == "interactivity,label,throughput_per_gpu,basis,ratio_to_baseline" and len(csv_lines) == 5
    assert csv_lines[-1].endswith(",grpc,n/a,n/a,n/a")  # above the measured range: no value, no basis, no ratio
    md = (rep / "report.md").read_text()
    for png in PNGS:
        assert (rep / png).read_bytes()[:4] == b"\x89PNG" and f"]({png})" in md
    assert "| http | complete | triton-http | dflash | dflash | 24 / 16 |" in md  # model, then the drafter method


def test_cpu_preset_sweeps_the_builtin_engine(server, tmp_path):
    preset = Path(__file__).resolve().parents[2] / "benchmarks" / "presets" / "cpu-builtin.yaml"
    ends = server["ends"]
    assert main(["sweep", "--preset", str(preset), "--url", ends.http_url, "--metrics-url", ends.metrics_url,
                 "--tokenizer", str(server["engine"]), "--prompts-per-point", "2", "--output", str(tmp_path / "run"),
                 "--no-progress"]) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["settings"]["osl"] == 32 and manifest["settings"]["prompts_per_point"] == 2
    points = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    assert [(p["point"], p["completed"], p["output_tokens"]) for p in points] == [
        ("c1", 2, 64), ("c2", 2, 64), ("c4", 2, 64)]
    assert all(p["counters"]["requests"] == 2 for p in points)  # warm-ups (2 per point) are not counted


@pytest.mark.parametrize("api", ["triton-http", "triton-grpc"])
def test_unknown_model_on_triton_is_one_line(server, tmp_path, capsys, api):
    argv = sweep_argv(server, tmp_path / "run", api=api)
    argv[argv.index("dflash")] = "nope"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dflash-bench: error: --model: 'nope' is not served at"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("api", ["triton-http", "triton-grpc"])
def test_stuck_requests_time_out_and_free_their_slots(server, tmp_path, capsys, api):
    """Requests past --timeout are cancelled and counted; the server sees the cancellation and frees the slots."""
    from helpers.triton import metrics

    argv = sweep_argv(server, tmp_path / "run", "--concurrency", "2", "--prompts-per-point", "2", "--warmup", "0",
                      "--timeout", "0.3", api=api)
    argv[argv.index("16")] = "400"
    assert main(argv) == 1  # the server is alive and the sweep completes, but the point measured nothing
    p = json.loads((tmp_path / "run" / "summary.json").read_text())["points"][0]
    assert (p["requests"], p["timed_out"], p["completed"]) == (2, 2, 0)
    err = capsys.readouterr().err
    assert "2 of 2 requests failed (2 timed out)" in err
    assert "dflash-bench: error: no request succeeded at point c2; most common error (2 of 2 requests): no " \
           "complete answer after 0.3 s: stuck request, cancelled" in err
    deadline = time.monotonic() + 60
    while metrics(server)["dflash_running_requests"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metrics(server)["dflash_running_requests"] == 0


@pytest.mark.parametrize("api", ["triton-http", "triton-grpc"])
def test_rejected_requests_carry_the_servers_message(server, tmp_path, capsys, api):
    argv = sweep_argv(server, tmp_path / "run", "--concurrency", "1", "--prompts-per-point", "2", "--warmup", "0",
                      api=api)
    argv[argv.index("16")] = "500"  # within max_tokens, but prompt + output exceed the sequence capacity
    assert main(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    # prompts of different lengths: messages that differ only in their numbers count as one error
    assert last.startswith("dflash-bench: error: no request succeeded at point c1; most common error (2 of 2 "
                           "requests): ") and "exceeds this engine's sequence capacity" in last, last
    rows = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    assert [r["error_kind"] for r in rows] == ["server", "server"]
    assert all("exceeds this engine's sequence capacity" in r["error"] and "data:" not in r["error"] for r in rows)


def test_killed_server_ends_the_sweep_with_partial_results(builtin, tmp_path):
    served = serving(builtin, tmp_path, decoding="plain")  # the autoregressive baseline, then killed
    srv = next(served)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "trtllm_dflash.cli.bench", *sweep_argv(srv, run, "--concurrency", "2,4",
           "--prompts-per-point", "40", "--label", "plain")]
    cmd[cmd.index("16")] = "200"  # long outputs: the kill lands mid-point
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not lines(run / "requests.jsonl") >= 3:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        os.killpg(srv["proc"].pid, signal.SIGKILL)  # tritonserver and its Python backend stubs
        srv["proc"].proc.wait(30)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("dflash-bench: error: sweep cut short: the server stopped answering") and str(run) in last
    assert "Traceback" not in err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "aborted" and manifest["error"].endswith("during point c2")
    points = json.loads((run / "summary.json").read_text())["points"]
    assert [p["point"] for p in points] == ["c2"] and points[0]["status"] == "aborted"
    rows = rows_by_point(run)["c2"]
    assert len(rows) == points[0]["requests"] < 40 and points[0]["completed"] >= 3 and points[0]["failed"] >= 1
    assert {r["error_kind"] for r in rows if not r["ok"]} <= {"connection", "cancelled"}
    assert all(r["server_draft_tokens"] == 0 for r in rows if r["ok"])  # plain decoding drafts nothing
    assert points[0]["acceptance_length"] is None
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "repo")], capture_output=True, text=True)
    assert leftover.stdout == ""


def lines(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0
