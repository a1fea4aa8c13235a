"""Every cited result exists: each `benchmarks/results/...` path named in the package's and the benchmarks' code
(comments, docstrings, defaults), in docs/*.md, README.md, the result records' own .md files and
benchmarks/README.md (there also `results/...`, relative to benchmarks/) is a file or folder of this repository,
and so is every repository path in backticks in the package's and the benchmarks' code. tests/repo/test_docs.py checks the docs' backticked paths and links.

A citation may name several files at once: `gpu_policy.{json,log}` (each must exist) or `gpu_schedule_*.json`
(some file must fit). A template (`results/{name}.json`, `$OUT/...`) is not a citation and is skipped, nor is
a benchmark script's own default output (`OUT = ... "results" / "x.json"`), which exists once the script has run.
"""

from __future__ import annotations

import glob
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = ("trtllm_dflash", "benchmarks", "tests", "docs", "tools", "docker", "triton_repo", ".ci")
RESULT = re.compile(r"benchmarks/results/[\w./*{},\-]*")
BACKTICKED = re.compile(r"`((?:%s)/[\w./*{},\-]*)`" % "|".join(re.escape(t) for t in TOP))
TRAILING = ".,;:)'\"`"


def sources() -> list[Path]:
    code = sorted((ROOT / "trtllm_dflash").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    docs = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    records = sorted((ROOT / "benchmarks" / "results").rglob("*.md"))  # a device run's RUN.md cites its files
    return code + docs + records


def expand(path: str) -> list[str] | None:
    """`a.{json,log}` -> [a.json, a.log]; None for a template whose braces hold a name (`{name}.json`)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            choices.append([part])
        elif "," in part:
            choices.append(part.split(","))
        else:
            return None
    return ["".join(c) for c in itertools.product(*choices)]


def exists(path: str, base: Path = ROOT) -> bool:
    if any(c in path for c in "*?"):
        return bool(glob.glob(str(base / path)))
    return (base / path).exists()


def own_outputs(text: str) -> set[str]:
    """The results a benchmark script writes by default: `Path(__file__).parent / "results" / "x.json"`."""
    return {f"benchmarks/results/{m[1]}" for m in re.finditer(r'"results"\s*/\s*"([\w.\-]+)"', text)}


def citations(source: Path, text: str) -> list[tuple[str, Path]]:
    """(cited path, what it is relative to) for each citation in `text`."""
    found = [(m[0], ROOT) for m in RESULT.finditer(text)]
    if source.suffix == ".py":
        found += [(m[1], ROOT) for m in BACKTICKED.finditer(text)]
    if source == ROOT / "benchmarks" / "README.md":
        found += [(m[0], ROOT / "benchmarks") for m in re.finditer(r"(?<![\w/])results/[\w./*{},\-]*", text)]
    out, skip = [], own_outputs(text)
    for cited, base in found:
        cited = cited.rstrip(TRAILING)
        if cited.endswith("/results") or cited.endswith("/results/"):
            continue  # the folder itself, named as a place ("under benchmarks/results/")
        for path in expand(cited) or []:
            if path.rstrip(TRAILING) not in skip:
                out.append((path.rstrip(TRAILING), base))
    return out


def missing(source: Path, text: str) -> list[str]:
    return sorted({path for path, base in citations(source, text) if not exists(path, base)})


@pytest.mark.parametrize("source", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_files_exist(source):
    absent = missing(source, source.read_text())
    assert not absent, f"{source.relative_to(ROOT)} cites files that do not exist: {absent}"


def test_a_missing_citation_fails():
    """The check itself: a fake citation is reported, a real one, a brace list and a glob are not."""
    text = ("# benchmarks/results/no_such_run.json, benchmarks/results/cpu_decode.json,\n"
            "# benchmarks/results/gpu_h100/gpu_schedule_*.json and `benchmarks/results/{name}.json`\n"
            "# `trtllm_dflash/no_such_module.py`")
    assert missing(ROOT / "trtllm_dflash" / "x.py", text) == ["benchmarks/results/no_such_run.json",
                                                              "trtllm_dflash/no_such_module.py"]
    assert missing(ROOT / "README.md", "benchmarks/results/gpu_h100/{RUN.md,nope.log}") == [
        "benchmarks/results/gpu_h100/nope.log"]
    script = 'OUT = Path(__file__).parent / "results" / "not_run_yet.json"  # writes benchmarks/results/not_run_yet.json'
    assert missing(ROOT / "benchmarks" / "x.py", script) == []
