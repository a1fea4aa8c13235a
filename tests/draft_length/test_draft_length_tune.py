"""dflash-bench tune: a draft_len_schedule from sweep runs at fixed draft lengths (hand-written runs)."""

import json

import pytest

from trtllm_dflash.bench.tune import read_table, schedule_from
from trtllm_dflash.cli.bench import main
from trtllm_dflash.draft_length.schedule import read_schedule
from trtllm_dflash.utils.errors import DFlashError


def write_run(path, throughput: dict[int, float], draft_len_mean=None, failed=0):
    """A sweep run directory as dflash-bench writes it: manifest.json and summary.json's points."""
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"label": path.name, "status": "complete"}))
    points = [{"point": f"c{c}", "concurrency": c, "load": c, "output_throughput": tok_s, "failed": failed,
               "draft_len_mean": draft_len_mean} for c, tok_s in throughput.items()]
    (path / "summary.json").write_text(json.dumps({"points": points}))
    return path


@pytest.fixture
def runs(tmp_path):
    # plain decoding scales with batch; long drafts win alone and lose at 16
    return {
        0: write_run(tmp_path / "plain", {1: 100, 4: 350, 16: 1000}),
        7: write_run(tmp_path / "k7", {1: 180, 4: 420, 16: 900}),
        15: write_run(tmp_path / "k15", {1: 200, 4: 380, 16: 600}),
        "15b": write_run(tmp_path / "k15-repeat", {1: 240, 4: 400, 16: 640}),
    }


def test_schedule_takes_the_fastest_draft_length_at_each_concurrency(runs, tmp_path, capsys):
    out = tmp_path / "schedule.yaml"
    argv = ["tune", f"0={runs[0]}", f"7={runs[7]}", f"15={runs[15]}", f"15={runs['15b']}", "--output", str(out)]
    assert main(argv) == 0
    schedule = read_schedule(out)
    assert schedule.as_option() == {1: 15, 4: 7, 16: 0}  # 15's median at 1 is 220 > 180; plain wins at 16
    assert schedule.max_draft_len == 15 and "dflash-bench tune" in schedule.source
    printed = capsys.readouterr().out
    assert "| 1 | 100.0 | 180.0 | 220.0 | 15 | 2.20x | 1.00x |" in printed
    assert "| 16 | 1000.0 | 900.0 | 620.0 | 0 | 1.00x | 1.61x |" in printed


def test_a_later_winner_longer_than_the_first_is_capped(tmp_path, capsys):
    short = write_run(tmp_path / "k3", {1: 150, 8: 300})
    long_ = write_run(tmp_path / "k9", {1: 140, 8: 320})
    schedule, notes = schedule_from(read_table([f"3={short}", f"9={long_}"]))
    assert schedule.as_option() == {1: 3, 8: 3}
    assert notes == ["concurrency 8: 9 measured best, capped to max_draft_len 3 (TensorRT-LLM requires the smallest "
                     "threshold's length to be the largest)"]


def test_the_draft_length_comes_from_the_runs_counters(tmp_path):
    table = read_table([str(write_run(tmp_path / "a", {1: 10, 2: 30}, draft_len_mean=5.0)),
                        str(write_run(tmp_path / "b", {1: 20, 2: 25}, draft_len_mean=0.0))])
    assert table.draft_lens == [0, 5] and table.best(1) == (0, 20) and table.best(2) == (5, 30)


@pytest.mark.parametrize("mean, needle", [(None, "does not say its draft length"),
                                          (4.5, "the draft length varied during the run")])
def test_runs_without_a_fixed_draft_length_are_refused(tmp_path, mean, needle):
    with pytest.raises(DFlashError, match=needle):
        read_table([str(write_run(tmp_path / "r", {1: 10}, draft_len_mean=mean))])


def test_failed_points_and_bad_paths(tmp_path, capsys):
    with pytest.raises(DFlashError, match="no fixed-concurrency point completed without failures"):
        read_table([f"3={write_run(tmp_path / 'f', {1: 10}, failed=2)}"])
    assert main(["tune", f"3={tmp_path / 'absent'}", "--output", str(tmp_path / "s.yaml")]) == 2
    assert "not a dflash-bench run directory" in capsys.readouterr().err
    assert not (tmp_path / "s.yaml").exists()
