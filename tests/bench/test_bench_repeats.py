"""The demo's DFlash/plain ratio over repeats: per-repeat ratios read as dflash-bench report reads one pair of
runs, then median and range; checked against frontiers whose linear readings are worked out by hand."""

from pathlib import Path

import pytest

from trtllm_dflash.bench.repeats import markdown, ratio_rows
from trtllm_dflash.bench.report import Run, X, Y


def run(label: str, points: list[tuple[float, float]]) -> Run:
    return Run(label, Path(label), {}, [{X: x, Y: y} for x, y in points], "completed")


def test_ratios_median_range_and_bounds():
    plain = [(50, 800), (150, 300)]  # linear: 800 - 5 * (x - 50)
    pairs = [(run("dflash", [(100, 1000), (200, 500)]), run("plain", plain)),
             (run("dflash", [(100, 1100), (200, 700)]), run("plain", plain)),
             (run("dflash", [(100, 900), (120, 800)]), run("plain", plain))]
    rows = {r["interactivity"]: r for r in ratio_rows(pairs, (60, 100, 150, 300), "linear")}
    # 100: plain 550; dflash 1000, 1100, 900 (all on their frontiers)
    assert rows[100]["ratios"] == pytest.approx([1000 / 550, 1100 / 550, 900 / 550])
    assert rows[100]["median"] == pytest.approx(1000 / 550) and not rows[100]["lower_bound"]
    assert (rows[100]["min"], rows[100]["max"]) == pytest.approx((900 / 550, 1100 / 550))
    # 150: plain 300; dflash 750, 900, and the third never reaches 150 (n/a there, not counted)
    assert rows[150]["ratios"][:2] == pytest.approx([750 / 300, 900 / 300]) and rows[150]["ratios"][2] is None
    assert rows[150]["repeats_measured"] == 2 and rows[150]["median"] == pytest.approx(825 / 300)
    # 60: below every dflash run's lowest point: the best measured at or above 60, a lower bound; plain 750
    assert rows[60]["ratios"] == pytest.approx([1000 / 750, 1100 / 750, 900 / 750]) and rows[60]["lower_bound"]
    assert rows[300]["median"] is None and rows[300]["repeats_measured"] == 0
    table = markdown(list(rows.values()), "dflash", "plain")
    assert "| 60 | ≥ 1.33x (1.20–1.47) | 3 of 3 |" in table and "| 300 | n/a | 0 of 3 |" in table
