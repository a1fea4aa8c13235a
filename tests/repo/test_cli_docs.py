"""docs/cli.md is what the console scripts' parsers say (tools/gen_cli_docs.py regenerates it)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "tools" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_matches_the_parsers():
    assert (ROOT / "docs" / "cli.md").read_text() == generator().render(), \
        "docs/cli.md is stale: run python tools/gen_cli_docs.py"


def test_every_console_script_is_in_the_reference():
    scripts = [line.split("=")[0].strip() for line in (ROOT / "pyproject.toml").read_text()
               .split("[project.scripts]")[1].split("\n[")[0].splitlines() if "=" in line]
    titles = {title.split()[0] for title, _ in generator().commands()}
    assert scripts and set(scripts) == titles, (scripts, titles)


def test_a_changed_parser_makes_the_reference_stale(monkeypatch):
    """The check compares real text: a new flag changes what render() writes."""
    gen = generator()
    before = gen.render()
    from trtllm_dflash.cli import convert

    original = convert.parser

    def with_flag():
        p = original()
        p.add_argument("--brand-new-flag", help="added by the test")
        return p

    monkeypatch.setattr(convert, "parser", with_flag)
    after = gen.render()
    assert after != before and "--brand-new-flag" in after
