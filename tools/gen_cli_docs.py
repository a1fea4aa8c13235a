"""Write docs/cli.md from the console scripts' own argparse parsers, so the reference cannot drift from the code.

    python tools/gen_cli_docs.py            # rewrite docs/cli.md
    python tools/gen_cli_docs.py --check    # exit 1 when docs/cli.md differs from what the parsers say

tests/repo/test_cli_docs.py runs the check in `make test`. Usage lines are formatted at a fixed width, so the text
does not depend on the terminal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "cli.md"
WIDTH = 100


def commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """(title, parser) for every console script in pyproject.toml, subcommands after their command."""
    from trtllm_dflash.cli import bench, build, convert, demo, generate, serve, train

    out = [("dflash-build", build.build_parser())]
    out += [(f"dflash-build {name}", p) for name, p in build.subcommand_parsers().items()]
    out += [("dflash-generate", generate.parser()), ("dflash-serve", serve.parser())]
    top = bench.parser()
    out.append(("dflash-bench", top))
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += [(f"dflash-bench {name}", p) for name, p in action.choices.items()]
    out += [("dflash-demo", demo.parser()), ("dflash-train", train.parser()), ("dflash-convert", convert.parser())]
    return out


def usage(p: argparse.ArgumentParser) -> str:
    f = argparse.HelpFormatter(prog=p.prog, width=WIDTH)
    f.add_usage(p.usage, p._actions, p._mutually_exclusive_groups, prefix="")
    return f.format_help().strip()


def cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def options_table(p: argparse.ArgumentParser) -> list[str]:
    f = argparse.HelpFormatter(prog=p.prog, width=WIDTH)
    rows = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        value = f" {a.metavar or a.dest.upper()}" if a.option_strings and a.nargs != 0 else ""
        name = ", ".join(f"`{o}{value}`" for o in a.option_strings) or f"`{a.metavar or a.dest.upper()}`"
        default = "" if a.default in (None, False, argparse.SUPPRESS) or not a.option_strings else f"`{a.default}`"
        helptext = f._expand_help(a) if a.help else ""
        if a.choices and not isinstance(a, argparse._SubParsersAction):
            helptext += f" (one of: {', '.join(map(str, a.choices))})"
        rows.append(f"| {name} | {cell(default)} | {cell(helptext)} |")
    if not rows:
        return []
    return ["| argument | default | meaning |", "|---|---|---|", *rows]


def render() -> str:
    lines = ["# Command-line reference", "",
             "Generated from the parsers by `python tools/gen_cli_docs.py`; `tests/repo/test_cli_docs.py` fails when this "
             "file is stale. Every command also answers `--help`.", ""]
    for title, p in commands():
        lines += [f"## {title}", ""]
        if p.description:
            lines += [" ".join(p.description.split()), ""]
        lines += ["```text", usage(p), "```", ""]
        table = options_table(p)
        if table:
            lines += [*table, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python tools/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
