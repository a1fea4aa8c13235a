"""The package's shape from its own imports: rooms, floors, circles, and imports against the layering.

A room is a top-level module or folder of `trtllm_dflash/`. Room A imports room B when any module of A imports
any module of B (module level or inside a function). Floors are the longest import path from a room with no
imports (floor 1); rooms on a circle share a floor. `python tools/layout_report.py` prints the report;
`--json` prints it as one object (the layout test reads it).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

PACKAGE = "trtllm_dflash"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def rooms(root: Path = ROOT) -> list[str]:
    names = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(("_", ".")):
            continue
        if entry.is_dir() and (entry / "__init__.py").exists():
            names.append(entry.name)
        elif entry.suffix == ".py":
            names.append(entry.stem)
    return names


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path, root: Path) -> list[tuple[str, bool]]:
    """(absolute module name, inside `if TYPE_CHECKING`) for every import of the package in the file."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    type_only = {id(n) for node in ast.walk(tree) if _is_type_checking(node) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in type_only) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found += [(f"{base}.{a.name}" if base else a.name, id(node) in type_only) for a in node.names]
            found.append((base, id(node) in type_only))
    return [(name, typ) for name, typ in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def room_of(module: str, names: set[str]) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in names else None


def edges(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(from room, to room) -> the files that make the import (type-only imports marked ` (type)`)."""
    names = set(rooms(root))
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        source = room_of(module_name(path, root), names)
        if source is None:
            continue
        for module, type_only in imported_modules(path, root):
            target = room_of(module, names)
            if target and target != source:
                label = str(path.relative_to(root.parent)) + (" (type)" if type_only else "")
                found.setdefault((source, target), [])
                if label not in found[(source, target)]:
                    found[(source, target)].append(label)
    return found


def circles(names: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one room (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in names:
        if v not in index:
            visit(v)
    return out


def floors(names: list[str], graph: dict[str, set[str]]) -> dict[str, int]:
    group = {v: v for v in names}
    for component in circles(names, graph):
        for v in component:
            group[v] = component[0]
    memo: dict[str, int] = {}

    def floor(g: str, seen: frozenset) -> int:
        if g not in memo:
            members = [v for v in names if group[v] == g]
            below = {group[w] for v in members for w in graph[v]} - {g}
            memo[g] = 1 + max((floor(b, seen | {g}) for b in below if b not in seen), default=0)
        return memo[g]

    return {v: floor(group[v], frozenset()) for v in names}


def report(root: Path = ROOT) -> dict:
    names = rooms(root)
    found = edges(root)
    graph = {v: set() for v in names}
    for (a, b) in found:
        graph[a].add(b)
    level = floors(names, graph)
    cycle = circles(names, graph)
    return {
        "rooms": names,
        "floors": {v: level[v] for v in names},
        "floor_count": max(level.values(), default=0),
        "circles": cycle,
        "imports": {f"{a} -> {b}": files for (a, b), files in sorted(found.items())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = report()
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    by_floor: dict[int, list[str]] = {}
    for name, level in result["floors"].items():
        by_floor.setdefault(level, []).append(name)
    print(f"{len(result['rooms'])} rooms on {result['floor_count']} floors, {len(result['circles'])} circles")
    for level in sorted(by_floor, reverse=True):
        print(f"  {level:2d}: {' '.join(by_floor[level])}")
    for component in result["circles"]:
        print("circle:", " <-> ".join(component))
    return 0


if __name__ == "__main__":
    sys.exit(main())
