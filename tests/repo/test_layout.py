"""The package's shape, measured from its own imports (tools/layout_report.py) and sizes: the goals of
docs/architecture.md hold, and the floors it draws are the floors the imports make."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "trtllm_dflash"

# docs/architecture.md's floors, bottom first: a room imports only rooms on floors below its own.
FLOORS = [
    ["utils"],
    ["config"],
    ["distributed", "sample", "draft_length", "plugins"],
    ["cache", "compilation"],
    ["models"],
    ["checkpoint", "speculative"],
    ["engine"],
    ["builder"],
    ["bench", "serve"],
    ["train"],
    ["pairs"],
    ["cli"],
]
MAX_ROOMS, MAX_FLOORS = 26, 12
MAX_MODULE_LINES, MAX_CLASS_LINES = 450, 300


def layout_report():
    spec = importlib.util.spec_from_file_location("layout_report", REPO / "tools" / "layout_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.report(PACKAGE)


@pytest.fixture(scope="module")
def report():
    return layout_report()


def test_rooms_floors_and_no_circles(report):
    assert report["circles"] == []
    assert len(report["rooms"]) <= MAX_ROOMS, report["rooms"]
    assert report["floor_count"] <= MAX_FLOORS


def test_every_room_is_on_a_drawn_floor(report):
    drawn = [room for floor in FLOORS for room in floor]
    assert sorted(drawn) == sorted(report["rooms"])
    text = (REPO / "docs" / "architecture.md").read_text()
    assert [room for room in drawn if f"{room}/" not in text] == []


def test_imports_point_down_the_drawn_floors(report):
    level = {room: i for i, floor in enumerate(FLOORS) for room in floor}
    upward = []
    for edge, files in report["imports"].items():
        source, target = edge.split(" -> ")
        if level[target] >= level[source]:
            upward.append(f"{edge}: {', '.join(files)}")
    assert upward == []


def test_the_check_sees_an_import_that_points_up(tmp_path):
    spec = importlib.util.spec_from_file_location("layout_report", REPO / "tools" / "layout_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pkg = tmp_path / "trtllm_dflash"
    for room, body in {"low": "from ..high import x\n", "high": "from ..low import y\n"}.items():
        (pkg / room).mkdir(parents=True)
        (pkg / room / "__init__.py").write_text("")
        (pkg / room / "m.py").write_text(body)
    found = module.report(pkg)
    assert found["circles"] == [["high", "low"]]
    assert set(found["imports"]) == {"low -> high", "high -> low"}


def python_files():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(REPO)): n for p in python_files() if (n := len(p.read_text().splitlines()))
            > MAX_MODULE_LINES}
    assert long == {}


def test_no_class_is_over_the_line_limit():
    big = {}
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                big[f"{path.relative_to(REPO)}::{node.name}"] = node.end_lineno - node.lineno + 1
    assert big == {}
