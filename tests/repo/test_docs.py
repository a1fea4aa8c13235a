"""The docs cannot drift: in README.md, benchmarks/README.md and docs/*.md every relative link resolves (its #anchor too), every
repository path they name exists, and every command line of their shell code blocks that calls a project CLI
(dflash-*, `python benchmarks/X.py`, `python tools/X.py`, `make X`) parses against that command's own parser.

Conventions the check relies on (docs/index.md repeats them for writers):
- a path is named from the repository root (`trtllm_dflash/...`, `benchmarks/...`, `tests/test_x.py::test_y`);
- shell blocks (```bash, ```sh, ```console or untagged) hold real command lines with real values; a synopsis
  with [optional] parts goes in a ```text block, which is not parsed.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("trtllm_dflash", "benchmarks", "tests", "docs", "tools", "docker", "triton_repo", "engines", ".ci")
PATH = re.compile(r"^(?:%s)/[\w./*\-]*$|^(?:README\.md|Makefile|pyproject\.toml)$" % "|".join(re.escape(t) for t in TOP))
SHELL = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
CLIS = {"dflash-build": "build", "dflash-generate": "generate", "dflash-serve": "serve", "dflash-bench": "bench",
        "dflash-demo": "demo", "dflash-train": "train", "dflash-convert": "convert"}
README_MAX_LINES = 200


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks(text: str) -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m[1]) for m in re.finditer(r"^#+\s+(.*)$", prose(path.read_text()), re.M)}


OUTPUTS = ("engines/", "triton_repo/")  # where commands write: engines/x is an example's output, not a claim


def checked(token: str) -> bool:
    """Whether a path-shaped word is a claim about this repository. Not: an example's output under engines/ or
    triton_repo/ (their READMEs are checked), or an upstream project's path that happens to start like ours
    (`tests/unittest/...` of TensorRT-LLM: three or more parts whose second is no directory here)."""
    path = token.partition("::")[0].rstrip(".,;:)")
    if path.startswith(OUTPUTS) and not path.endswith("README.md"):
        return False
    parts = path.split("/")
    return len(parts) < 3 or (ROOT / parts[0] / parts[1]).is_dir() or "*" in parts[1]


def exists(token: str) -> bool:
    path, _, test = token.partition("::")
    path = path.rstrip(".,;:)")
    # an all-capitals part is a placeholder (trtllm/tables/VERSION.json): some file must fit it
    path = "/".join(re.sub(r"^[A-Z][A-Z0-9_]*(?=\.|$)", "*", part) for part in path.split("/"))
    if any(c in path for c in "*?"):
        return bool(glob.glob(str(ROOT / path)))
    if not (ROOT / path).exists():
        return False
    if test:  # tests/test_x.py::test_name (a parametrised id's [..] dropped)
        return re.search(rf"def {re.escape(test.split('[')[0])}\b", (ROOT / path).read_text()) is not None
    return True


def named_paths(text: str) -> list[str]:
    """Repository paths in inline code spans and in shell blocks' words."""
    spans = re.findall(r"`([^`\n]+)`", prose(text))
    spans += [body for lang, body in blocks(text) if lang in SHELL]
    words = [w.strip("'\"()[],;") for span in spans for w in span.split()]
    return sorted({w for w in words if PATH.match(w.partition("::")[0].rstrip(".,;:)")) and checked(w)})


def command_lines(text: str) -> list[str]:
    """Shell blocks' commands: continuations joined, prompts and comments dropped, split at ; && || | &."""
    out = []
    for lang, body in blocks(text):
        if lang not in SHELL:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"^\s*\$\s+", "", line)
            line = re.sub(r"\s\d*>&\d+", "", line)  # 2>&1
            line = re.sub(r"\s\d+(>>?)", r" \1", line)  # 2> FILE: the target is dropped below
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
            lexer.whitespace_split = True
            try:
                tokens = list(lexer)
            except ValueError:
                continue
            command: list[str] = []
            skip = False
            for tok in tokens + [";"]:
                if skip:
                    skip = False
                elif tok in (">", ">>", "<", "&>"):
                    skip = True
                elif set(tok) <= set(";&|"):
                    if command:
                        out.append(command)
                    command = []
                else:
                    command.append(tok)
    commands = []
    for words in out:
        while words and (re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]) or words[0] in ("nohup", "exec", "env")):
            words = words[1:]
        if words:
            commands.append(words)
    return [shlex.join(w) for w in commands]


class Parsed(BaseException):
    """Raised in place of running the command once its parser has accepted the arguments."""


@contextlib.contextmanager
def stop_after_parsing(monkeypatch):
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        original(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    yield


def parses(words: list[str], monkeypatch) -> tuple[bool, str]:
    """(True, "") when the project command in `words` parses; (False, what it said) otherwise."""
    err = io.StringIO()
    with stop_after_parsing(monkeypatch), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            if words[0] in CLIS:
                module = __import__(f"trtllm_dflash.cli.{CLIS[words[0]]}", fromlist=["main"])
                code = module.main(words[1:])
            else:
                script = words[1]
                monkeypatch.setattr(sys, "argv", [script, *words[2:]])
                runpy.run_path(str(ROOT / script), run_name="__main__")
                code = "ran without parsing"
        except Parsed:
            return True, ""
        except SystemExit as exc:
            if exc.code in (0, None):  # --help
                return True, ""
            code = exc.code
        except Exception as exc:  # a missing script, a failing import: as broken as a bad flag
            code = f"{type(exc).__name__}: {exc}"
    return False, f"exit {code}: {err.getvalue().strip()[-300:]}"


def inline_scripts(text: str) -> list[str]:
    """`python benchmarks/X.py ...` written inline (a results table's command): checked like a block's line."""
    spans = (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose(text)))
    return [span for span in spans if re.match(r"python3? (benchmarks|tools)/\w+\.py\b", span)]


def project_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for line in command_lines(text) + inline_scripts(text):
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            if words[0] in CLIS or (words[0] in ("python", "python3") and len(words) > 1
                                    and re.fullmatch(r"(benchmarks|tools)/\w+\.py", words[1])):
                out.append((rel(doc), line))
    return out


def test_readme_fits_on_a_few_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_relative_links_resolve(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{rel(doc)}: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_named_repository_paths_exist(doc):
    missing = [p for p in named_paths(doc.read_text()) if not exists(p)]
    assert not missing, f"{rel(doc)} names paths that do not exist: {missing}"


def test_project_command_lines_parse(monkeypatch):
    commands = project_commands()
    assert len(commands) >= 10, commands  # the README's quick starts alone hold more
    failed = []
    for doc, line in commands:
        words = shlex.split(line)
        if words[0] == "make":
            continue
        ok, said = parses(words, monkeypatch)
        if not ok:
            failed.append(f"{doc}: {line}\n    {said}")
    assert not failed, "command lines that do not parse:\n" + "\n".join(failed)


def test_make_targets_named_in_the_docs_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = {w[1] for doc in DOCS for w in map(shlex.split, command_lines(doc.read_text()))
             if w[0] == "make" and len(w) > 1}
    assert named and named <= targets, named - targets


# The checker itself, on lines that must fail or pass.

def test_the_checker_catches_a_stale_flag_a_bad_value_and_a_missing_path(monkeypatch, tmp_path):
    assert parses(["dflash-generate", "--target", "builtin", "--prompt", "x", "--max-new-tokens", "8"], monkeypatch)[0]
    assert parses(["dflash-build", "verify", "engines/x"], monkeypatch)[0]
    assert not parses(["dflash-generate", "--no-such-flag"], monkeypatch)[0]
    assert not parses(["dflash-build", "--tp", "two"], monkeypatch)[0]
    assert not parses(["dflash-bench", "sweep", "--concurrency"], monkeypatch)[0]
    assert parses(["python", "benchmarks/cpu_decode.py", "--repeats", "3"], monkeypatch)[0]
    assert not parses(["python", "benchmarks/cpu_decode.py", "--repeats", "three"], monkeypatch)[0]
    assert not parses(["python", "benchmarks/no_such_script.py"], monkeypatch)[0]
    assert not exists("benchmarks/no_such_script.py") and exists("tests/repo/test_docs.py::test_named_repository_paths_exist")
    assert not exists("tests/repo/test_docs.py::test_no_such_test") and exists("benchmarks/presets/NAME.yaml")
    assert named_paths("`benchmarks/gone.py`, `engines/x/target`, `tests/unittest/_torch/a.py`, `docs/x/y.md`") \
        == ["benchmarks/gone.py"]
    text = "```bash\nFOO=1 dflash-serve engines/e --http-port 9000 &  # comment\n" \
           "dflash-bench sweep --url http://x \\\n  --model m > log 2>&1\n```\n```text\ndflash-build [--tp N]\n```\n"
    assert command_lines(text) == ["dflash-serve engines/e --http-port 9000",
                                   "dflash-bench sweep --url http://x --model m"]
    assert slug("The `torch` runtime: one GPU") == "the-torch-runtime-one-gpu"
