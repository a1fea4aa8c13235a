"""An engine directory written by the release before the package moved into folders (commit abd9d34) still
verifies, loads and decodes to the tokens that release decoded (tests/data/engine_abd9d34.expected.json, written
by that release's `generate_with_engine` at draft lengths 0, 3 and 7)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trtllm_dflash.builder.verify import verify_engine
from trtllm_dflash.engine import Request, generate_with_engine

DATA = Path(__file__).resolve().parents[1] / "data"
EXPECTED = json.loads((DATA / "engine_abd9d34.expected.json").read_text())


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Path:
    """A copy: loading may write caches beside an engine, never into the repository."""
    return Path(shutil.copytree(DATA / "engine_abd9d34", tmp_path_factory.mktemp("previous") / "engine"))


def test_the_previous_releases_engine_verifies(engine):
    ok, lines = verify_engine(engine)
    assert ok, lines


@pytest.mark.parametrize("draft_len", ["0", "3", "7"])
def test_the_previous_releases_engine_decodes_as_that_release_did(engine, draft_len):
    requests = [Request(tuple(p), EXPECTED["max_new_tokens"], ignore_eos=True) for p in EXPECTED["prompts"]]
    results = generate_with_engine(engine, requests, draft_len=int(draft_len))
    assert [r.output_ids for r in results] == EXPECTED["output_ids"][draft_len]
