"""The draft-length schedule file: what TensorRT-LLM's draft_len_schedule validator accepts, read and written."""

import json

import pytest

from trtllm_dflash.draft_length.schedule import DraftLenSchedule, read_schedule, write_schedule
from trtllm_dflash.utils.errors import DFlashError


def test_round_trip_and_lookup(tmp_path):
    schedule = DraftLenSchedule.from_mapping({32: 3, 1: 15, 8: 7}, source="tune run 7")
    path = write_schedule(tmp_path / "s.yaml", schedule)
    again = read_schedule(path)
    assert again == schedule and again.steps == ((1, 15), (8, 7), (32, 3)) and again.source == "tune run 7"
    # batch 1 -> 15; 2..8 -> 7; 9..32 -> 3; above the last threshold speculation is off (upstream: 0)
    assert [again.draft_len(b) for b in (1, 2, 8, 9, 32, 33, 500)] == [15, 7, 7, 3, 3, 0, 0]
    assert again.as_option() == {1: 15, 8: 7, 32: 3}
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]  # no temporary left behind
    again.check_for(15)


def test_bare_mapping_and_json_string_keys(tmp_path):
    bare = tmp_path / "bare.yaml"
    bare.write_text("4: 4\n8: 2\n32: 1\n")
    assert read_schedule(bare).steps == ((4, 4), (8, 2), (32, 1))
    as_json = tmp_path / "s.json"
    as_json.write_text(json.dumps({"max_draft_len": 6, "schedule": {"1": 6, "16": 2}}))
    assert read_schedule(as_json).as_option() == {1: 6, 16: 2}


@pytest.mark.parametrize("text, needle", [
    ("schedule: {0: 4}\n", "batch-size threshold must be >= 1, got 0"),
    ("schedule: {1: 4, 8: -1}\n", "draft length must be >= 0, got -1 at batch 8"),
    ("schedule: {1: 4, x: 2}\n", "batch-size threshold must be an integer, got 'x'"),
    ("schedule: {1: 4, 8: true}\n", "must be an integer, got True"),
    ("schedule: {'8': 4, 8: 2}\n", "appears twice"),
    ("schedule: {}\n", "the schedule is empty"),
    ("schedule: [1, 2]\n", "'schedule' must be a mapping"),
    ("schedule: {1: 4}\nmax_draft_len: 5\n", "max_draft_len 5 disagrees with the schedule's first step 1: 4"),
    ("schedule: {1: 4}\nformat: other/9\n", "format 'other/9' is not supported"),
    ("schedule: {1: 4}\nmax_concurency: 8\n", "unknown key 'max_concurency'"),
    ("- 1\n- 2\n", "must be a mapping"),
    ("schedule: {1: 4\n", "is not valid YAML at line"),
])
def test_bad_files_name_the_problem(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(DFlashError, match=None) as err:
        read_schedule(path)
    assert needle in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(DFlashError, match="no such draft-length schedule file"):
        read_schedule(tmp_path / "absent.yaml")


def test_check_against_the_engine_max_draft_len():
    schedule = DraftLenSchedule.from_mapping({1: 7, 16: 3})
    with pytest.raises(DFlashError, match="smallest batch size 1 must map to max_draft_len 15"):
        schedule.check_for(15)
    with pytest.raises(DFlashError, match="draft length 9 at batch 8 exceeds max_draft_len 7"):
        DraftLenSchedule.from_mapping({1: 7, 8: 9}).check_for(7)
