"""The Pareto frontier, interpolation that never extrapolates, and `report` on hand-made run directories."""

import csv
import json

import pytest

from trtllm_dflash.bench.frontier import interpolate, pareto_frontier, read_frontier
from trtllm_dflash.bench.report import make_report
from trtllm_dflash.bench.spec import ReportSpec
from trtllm_dflash.cli.bench import main

PNG = b"\x89PNG\r\n\x1a\n"


def test_frontier_keeps_only_undominated_points():
    points = [(10, 900), (20, 800), (15, 700),  # (15, 700) is dominated by (20, 800)
              (40, 500), (40, 450), (80, 100), (5, 850), (None, 999), (30, None), (20, 800)]
    assert pareto_frontier(points) == [(10, 900), (20, 800), (40, 500), (80, 100)]
    assert pareto_frontier([]) == []
    assert pareto_frontier([(1, 1)]) == [(1, 1)]


def test_frontier_throughput_falls_as_interactivity_rises():
    import random

    rng = random.Random(0)
    front = pareto_frontier((rng.uniform(1, 500), rng.uniform(1, 5000)) for _ in range(300))
    xs, ys = [p[0] for p in front], [p[1] for p in front]
    assert xs == sorted(xs) and ys == sorted(ys, reverse=True) and len(set(xs)) == len(xs)


@pytest.mark.parametrize("method", ["pchip", "linear"])
def test_interpolation_hits_the_points_and_never_extrapolates(method):
    front = [(10, 900), (20, 800), (40, 500), (80, 100)]
    got = interpolate(front, [5, 10, 20, 30, 40, 79.9, 80, 80.1, 1000], method)
    assert got[0] is None and got[-2] is None and got[-1] is None  # outside [10, 80]
    assert got[1] == pytest.approx(900) and got[2] == pytest.approx(800) and got[6] == pytest.approx(100)
    assert 500 < got[3] < 800 and 100 < got[5] < 500  # monotone between neighbours: no overshoot
    dense = interpolate(front, [10 + 0.5 * i for i in range(141)], method)
    assert all(a >= b for a, b in zip(dense, dense[1:]))
    if method == "linear":
        assert got[3] == pytest.approx(650)


def test_interpolation_of_one_or_no_points():
    assert interpolate([(50, 300)], [50, 49, 51]) == [300, None, None]
    assert interpolate([], [50]) == [None]


def test_reading_below_the_lowest_interactivity_is_a_measured_lower_bound():
    """At a floor below every measured point, the deployment delivers at least the best throughput measured at
    or above it (the frontier's first point): reported as that bound, marked, not interpolated; n/a only above."""
    front = [(152, 1068), (200, 913), (266, 700)]
    got = read_frontier(front, [60, 151.9, 152, 180, 266, 267])
    assert got[0] == got[1] == (1068, "at_or_above")
    assert got[2] == (pytest.approx(1068), "frontier") and got[4] == (pytest.approx(700), "frontier")
    assert 913 < got[3][0] < 1068 and got[3][1] == "frontier"
    assert got[5] == (None, None)
    assert read_frontier([(50, 300)], [10, 50, 60]) == [(300, "at_or_above"), (300, "frontier"), (None, None)]
    assert read_frontier([], [10]) == [(None, None)]


def write_run(root, label, points, status="complete", num_gpus=1):
    root.mkdir(parents=True)
    summaries = []
    for load, inter, tput, al in points:
        tpot_ms = 1000 / inter if inter else None
        summaries.append({"point": f"c{load}", "concurrency": load, "request_rate": None, "load": load,
                          "requests": 10, "completed": 10, "failed": 0, "ttft_ms_median": 20.0 * load,
                          "ttft_ms_p99": 30.0 * load, "tpot_ms_median": tpot_ms, "tpot_ms_p99": tpot_ms and tpot_ms * 1.2,
                          "interactivity_median": inter, "interactivity_p99": inter and inter / 1.2,
                          "total_throughput_per_gpu": tput, "output_throughput_per_gpu": tput / 2,
                          "acceptance_length": al, "acceptance_rate": None if al is None else (al - 1) / 7,
                          "acceptance_rate_responses": None})
    (root / "manifest.json").write_text(json.dumps({"label": label, "status": status, "num_gpus": num_gpus,
                                                    "settings": {"api": "triton-http", "model": "m", "isl": 1024,
                                                                 "osl": 1024, "dataset": None}}))
    (root / "summary.json").write_text(json.dumps({"label": label, "status": status, "points": summaries}))
    return root


@pytest.fixture
def two_runs(tmp_path):
    # load, median interactivity, throughput per GPU, acceptance length
    plain = write_run(tmp_path / "plain", "plain",
                      [(1, 100, 200, None), (2, 90, 380, None), (4, 60, 700, None), (8, 40, 1200, None)])
    dflash_points = [(1, 300, 500, 3.1), (2, 250, 900, 3.0), (4, 180, 1500, 2.9), (8, 120, 2400, 2.8),
                     (16, 110, 2000, 2.8), (32, None, 0.0, None)]  # at 32 every request failed
    dflash = write_run(tmp_path / "dflash", "dflash", dflash_points, status="aborted")
    return plain, dflash


def test_report_table_ratios_and_na(two_runs, tmp_path):
    plain, dflash = two_runs
    report = make_report(ReportSpec((str(plain), str(dflash)), str(tmp_path / "rep"), "plain", (50, 100, 200, 400)))
    rows = {(r["interactivity"], r["label"]): r for r in report.rows}
    assert rows[(50, "plain")]["throughput_per_gpu"] == pytest.approx(
        interpolate([(40, 1200), (60, 700), (90, 380), (100, 200)], [50])[0])
    plain_50 = rows[(50, "plain")]["throughput_per_gpu"]
    # dflash's frontier starts at 120 tok/s/user: at 50 it delivers at least its best point at or above 50
    assert rows[(50, "dflash")] == {"interactivity": 50, "label": "dflash", "throughput_per_gpu": 2400,
                                    "basis": "at_or_above", "ratio_to_baseline": pytest.approx(2400 / plain_50)}
    assert rows[(50, "plain")]["basis"] == "frontier" and rows[(400, "dflash")]["basis"] is None
    assert rows[(100, "plain")]["throughput_per_gpu"] == pytest.approx(200)
    assert rows[(200, "plain")]["throughput_per_gpu"] is None and rows[(200, "plain")]["ratio_to_baseline"] is None
    at_200 = rows[(200, "dflash")]
    assert at_200["throughput_per_gpu"] is not None and at_200["ratio_to_baseline"] is None  # baseline n/a
    assert rows[(400, "dflash")]["throughput_per_gpu"] is None
    assert rows[(100, "plain")]["ratio_to_baseline"] == pytest.approx(1.0)

    out = tmp_path / "rep"
    table = list(csv.DictReader((out / "table.csv").read_text().splitlines()))
    assert {"interactivity", "label", "throughput_per_gpu", "ratio_to_baseline"} <= set(table[0])
    dflash_50 = [(r["throughput_per_gpu"], r["basis"]) for r in table
                 if r["label"] == "dflash" and r["interactivity"] == "50.0"]
    assert dflash_50 == [("2400.0", "at_or_above")]
    data = json.loads((out / "table.json").read_text())
    assert data["baseline"] == "plain" and data["frontiers"]["dflash"][-1] == [300, 500]
    assert [120, 2400] in data["frontiers"]["dflash"] and [110, 2000] not in data["frontiers"]["dflash"]
    for png in ("frontier.png", "ttft_vs_throughput.png", "acceptance_vs_concurrency.png"):
        assert (out / png).read_bytes()[:8] == PNG and (out / png).stat().st_size > 5000
        assert f"]({png})" in (out / "report.md").read_text()
    md = (out / "report.md").read_text()
    assert f"| 50 | {plain_50:.1f} | ≥ 2400.0 (≥ {2400 / plain_50:.2f}x) |" in md
    assert "| 400 | n/a | n/a |" in md
    assert f"| 200 | n/a | {at_200['throughput_per_gpu']:.1f} (no ratio: plain never reaches this interactivity) |" in md
    assert "aborted" in md  # a partial run is labelled as such


def test_report_cli_ratio_against_baseline(two_runs, tmp_path, capsys):
    plain, dflash = two_runs
    code = main(["report", str(plain), str(dflash), "--baseline", "plain", "--interactivity", "100",
                 "--output", str(tmp_path / "r2"), "--interpolation", "linear"])
    assert code == 0
    row = {r["label"]: r for r in json.loads((tmp_path / "r2" / "table.json").read_text())["rows"]}
    # dflash's frontier has no point at 100 tok/s/user (it starts at 120): its best point above, a lower bound
    assert (row["dflash"]["throughput_per_gpu"], row["dflash"]["basis"]) == (2400, "at_or_above")
    assert row["plain"]["throughput_per_gpu"] == pytest.approx(200)
    assert row["dflash"]["ratio_to_baseline"] == pytest.approx(12)


@pytest.mark.parametrize("args, needle", [
    (["report", "{missing}"], "not a dflash-bench run directory"),
    (["report", "{plain}", "--baseline", "nope"], "--baseline: no run is labelled 'nope'"),
    (["report", "{plain}", "--interactivity", "50,x"], "--interactivity: 'x' is not a positive number"),
    (["report", "{plain}", "{plain}"], "two runs share the label 'plain'"),
    (["report", "{plain}", "--interpolation", "cubic"], "--interpolation: unknown method 'cubic'"),
])
def test_report_bad_input_is_one_line(two_runs, tmp_path, capsys, args, needle):
    plain, _ = two_runs
    argv = [a.format(plain=plain, missing=tmp_path / "missing") for a in args] + ["--output", str(tmp_path / "x")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dflash-bench: error: ") and needle in err, err


def write_plan(path, fronts, isl=1024, gpus=1):
    """A plan.json as dflash-bench plan writes it (bench/plan/__init__.py make_plan), frontiers only."""
    path.mkdir(parents=True)
    frontier = {name: [{"batch": 2 ** i, "draft_len": 0 if name == "plain" else 3, "tok_s_user": x, "tok_s_gpu": y,
                        "tp": 1} for i, (x, y) in enumerate(points)] for name, points in fronts.items()}
    plan = {"format": "dflash-plan/1", "inputs": {"target": "Qwen/Qwen3-8B", "gpus": gpus, "isl": isl, "osl": 1024},
            "provenance": {"system": "h100_sxm", "database": "aiconfigurator-core SILICON h100_sxm trtllm 1.3.0rc20",
                           "acceptance": "--tau 6.49"}, "frontier": frontier, "at_interactivity": []}
    (path / "plan.json").write_text(json.dumps(plan))
    return path


def test_report_overlays_a_plan_beside_the_measured_frontiers(two_runs, tmp_path):
    """--plan: each run's output-throughput frontier and each plan method's, read at the same levels, in the
    table (table.json, report.md) and in plan_overlay.png; differing inputs are said."""
    plain, dflash = two_runs
    plan = write_plan(tmp_path / "plan", {"plain": [(60, 900), (140, 300)], "dflash": [(90, 2500), (400, 600)]},
                      isl=2048)
    report = make_report(ReportSpec((str(plain), str(dflash)), str(tmp_path / "rep"), "plain", (50, 100, 200, 500),
                                    plan=str(plan)))
    rows = {(r["interactivity"], r["label"]): r for r in report.overlay}
    assert rows[(100, "plan: plain")]["output_tok_s_gpu"] == pytest.approx(interpolate([(60, 900), (140, 300)], [100])[0])
    assert rows[(50, "plan: plain")]["basis"] == "at_or_above" and rows[(50, "plan: plain")]["output_tok_s_gpu"] == 900
    assert rows[(500, "plan: dflash")]["output_tok_s_gpu"] is None
    # measured: output throughput (write_run: half the total), the same frontier reading as the headline's
    measured = [(120, 1200), (180, 750), (250, 450), (300, 250)]
    assert rows[(200, "dflash")]["output_tok_s_gpu"] == pytest.approx(interpolate(measured, [200])[0])
    assert rows[(200, "dflash")]["kind"] == "measured" and rows[(200, "plan: dflash")]["kind"] == "plan"
    out = tmp_path / "rep"
    data = json.loads((out / "table.json").read_text())["plan_overlay"]
    assert data["rows"] == json.loads(json.dumps(report.overlay)) and data["plan"] == str(plan / "plan.json")
    assert data["input_mismatches"] == ["plain: ISL 1024, the plan's 2048", "dflash: ISL 1024, the plan's 2048"]
    md = (out / "report.md").read_text()
    assert "## Beside the plan" in md and "](plan_overlay.png)" in md and "plan: dflash: output tok/s/GPU" in md
    assert f"| 100 | " in md and "Inputs differ: plain: ISL 1024" in md
    assert (out / "plan_overlay.png").read_bytes()[:8] == PNG and (out / "plan_overlay.png").stat().st_size > 5000


def test_report_plan_bad_input_is_one_line(two_runs, tmp_path, capsys):
    plain, _ = two_runs
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "plan.json").write_text(json.dumps({"format": "other"}))
    for where, needle in ((tmp_path / "none", "--plan: no plan.json at"), (bad, "is not a dflash-bench plan")):
        assert main(["report", str(plain), "--plan", str(where), "--output", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
