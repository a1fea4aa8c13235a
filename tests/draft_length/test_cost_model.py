"""The step-cost model: interpolation between grid points, monotone pooling, and bad cost files."""

import json

import pytest

from trtllm_dflash.draft_length.cost import CostModel, interpolate, monotone
from trtllm_dflash.utils.errors import DFlashError


def test_interpolation_and_extrapolation():
    assert interpolate((1, 4, 16), [1.0, 4.0, 10.0], 4) == 4.0
    assert interpolate((1, 4, 16), [1.0, 4.0, 10.0], 2) == 2.0
    assert interpolate((1, 4, 16), [1.0, 4.0, 10.0], 10) == 7.0
    assert interpolate((1, 4, 16), [1.0, 4.0, 10.0], 32) == 18.0  # past the end: the last slope
    assert interpolate((4, 16), [1.0, 4.0], 1) == 1.0  # below the first point: flat, never cheaper
    assert interpolate((4, 16), [4.0, 1.0], 40) == 1.0  # past a falling end: flat
    assert interpolate((4,), [3.0], 100) == 3.0


def test_monotone_pools_dips_instead_of_taking_the_maximum():
    assert monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert monotone([5.0, 1.0, 1.0]) == [7 / 3] * 3
    assert monotone([1.0, 2.0]) == [1.0, 2.0]


def test_step_seconds_on_and_between_grid_points(tmp_path):
    seconds = [[[1.0, 2.0, 4.0], [2.0, 3.0, 6.0]], [[3.0, 4.0, 8.0], [4.0, 5.0, 10.0]]]
    model = CostModel((1, 3), (0, 1, 3), (100, 300), seconds, {"device": "cpu: x"})
    assert model.step_seconds(1, 100, 3).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert model.step_seconds(2, 200, 1) == pytest.approx([2.5, 3.5])  # the middle of all four
    assert model.step_seconds(3, 300, 9).tolist() == [4.0, 5.0, 7.5, 10.0]  # capped at the measured maximum
    path = tmp_path / "c.json"
    model.save(path)
    again = CostModel.load(path)
    assert again == model and again.covers(3, 3) and not again.covers(4, 3) and not again.covers(3, 4)


@pytest.mark.parametrize("change, needle", [
    (dict(draft_lens=(1, 2)), "draft_lens must start at 0"),
    (dict(batch_sizes=(2, 1)), "batch_sizes must be increasing integers >= 1"),
    (dict(contexts=()), "contexts must be increasing integers >= 1"),
    (dict(seconds=[[[1.0, 2.0]]]), "seconds must be positive numbers of shape (1, 1, 3)"),
    (dict(seconds=[[[1.0, -2.0, 3.0]]]), "seconds must be positive numbers"),
    (dict(seconds=[[[1.0, "x", 3.0]]]), "seconds must be positive numbers"),
])
def test_bad_cost_models_name_the_problem(change, needle):
    fields = dict(batch_sizes=(1,), draft_lens=(0, 1, 2), contexts=(64,), seconds=[[[1.0, 2.0, 3.0]]])
    with pytest.raises(DFlashError) as err:
        CostModel(**{**fields, **change})
    assert needle in str(err.value)


def test_unreadable_cost_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(DFlashError, match="cannot read step cost model"):
        CostModel.load(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(DFlashError, match="not a step cost model"):
        CostModel.load(bad)
    bad.write_text(json.dumps({"format": "dflash-step-cost/1", "batch_sizes": [1]}))
    with pytest.raises(DFlashError, match="malformed step cost model"):
        CostModel.load(bad)
