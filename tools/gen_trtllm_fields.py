#!/usr/bin/env python3
"""Write a TensorRT-LLM field table (trtllm_dflash/builder/trtllm/tables/VERSION.json), one per upstream version.

generate: from TensorRT-LLM's tensorrt_llm/llmapi/llm_args.py. tensorrt_llm cannot be imported without its GPU
libraries, so the pydantic classes are read with `ast`: every class reachable from TorchLlmArgs through its field
annotations, with its fields (inherited ones included), their annotation as written, default, constraints
(ge/gt/le/lt/min_length), status (prototype/beta/deprecated), aliases, and whether a mode='before'/'plain'
validator coerces the input first; enums with their members; type aliases (discriminated unions with their
discriminator).

    python tools/gen_trtllm_fields.py generate TENSORRT_LLM_CHECKOUT --commit SHA --version V [--output PATH]

derive: a version whose llm_args.py is not at hand, from an existing table plus a changes file
(tools/trtllm_changes/V.json: the fields that version's API reference adds or changes, with the pages read).
The output records the base table's sha256 and the changes file, so tests re-derive it and compare.

    python tools/gen_trtllm_fields.py derive tools/trtllm_changes/V.json [--output PATH]

Only standard-library modules are used. The 1.3.0rc27 table was not generated from a checkout (NVIDIA/TensorRT-LLM
is over this environment's fetch limit) but from a hand transcript of the declarations at its commit, then checked
field by field against the stored upstream file; its `source.provenance` says so, and its `source.sha256` is null
because no upstream file was hashed. Run `generate` on a real checkout to replace both.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
from pathlib import Path

LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py"
ROOT = "TorchLlmArgs"
TABLES = Path(__file__).resolve().parent.parent / "trtllm_dflash" / "builder" / "trtllm" / "tables"
ENUM_BASES = {"Enum", "StrEnum", "IntEnum"}
CONSTRAINTS = ("ge", "gt", "le", "lt", "min_length", "max_length")
COERCING_MODES = {"before", "plain", "wrap"}
# This table serves DFlash engines: of the speculative_config union only DFlash's member is kept.
UNION_MEMBERS_KEPT = {"SpeculativeConfig": ("DFlashDecodingConfig",)}
REMOVED_ARGS_TABLE = "_TORCH_LLMARGS_REMOVED_ARG_CHECKS"


def call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return None


def is_field_call(node: ast.AST) -> bool:
    return call_name(node) in ("Field", "PydanticField")


def literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def field_record(stmt: ast.AnnAssign) -> dict:
    """One field: annotation, default, constraints, status, aliases."""
    record = {"type": ast.unparse(stmt.annotation)}
    value = stmt.value
    if value is None:
        record["default"] = "<required>"
        return record
    if not is_field_call(value):
        record["default"] = ast.unparse(value)
        return record
    kwargs = {kw.arg: kw.value for kw in value.keywords if kw.arg}
    if value.args:
        record["default"] = ast.unparse(value.args[0])
    elif "default" in kwargs:
        record["default"] = ast.unparse(kwargs["default"])
    elif "default_factory" in kwargs:
        record["default"] = f"<factory {ast.unparse(kwargs['default_factory'])}>"
    else:
        record["default"] = "<required>"
    constraints = {k: literal(kwargs[k]) for k in CONSTRAINTS if k in kwargs}
    if constraints:
        record["constraints"] = constraints
    if "status" in kwargs:
        record["status"] = literal(kwargs["status"])
    if "deprecated" in kwargs and literal(kwargs["deprecated"]) not in (False, None):
        record["status"] = "deprecated"
    aliases = [literal(a) for key in ("alias", "validation_alias") if key in kwargs
               for a in (kwargs[key].args if call_name(kwargs[key]) == "AliasChoices" else [kwargs[key]])]
    if aliases:
        record["aliases"] = aliases
    return record


def coerced_fields(cls: ast.ClassDef) -> set[str]:
    """Fields a field_validator(mode='before'|'plain'|'wrap') rewrites before pydantic checks the type."""
    names = set()
    for stmt in cls.body:
        for deco in getattr(stmt, "decorator_list", []):
            if call_name(deco) != "field_validator":
                continue
            mode = next((literal(kw.value) for kw in deco.keywords if kw.arg == "mode"), "after")
            if mode in COERCING_MODES:
                names.update(literal(arg) for arg in deco.args)
    return names


def own_fields(cls: ast.ClassDef) -> dict[str, dict]:
    fields = {}
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name = stmt.target.id
        if name.startswith("_") or ast.unparse(stmt.annotation).startswith("ClassVar"):
            continue
        fields[name] = field_record(stmt)
    for name in coerced_fields(cls) & set(fields):
        fields[name]["coerced"] = True
    return fields


def enum_members(cls: ast.ClassDef) -> dict[str, object]:
    return {t.id: literal(stmt.value) for stmt in cls.body if isinstance(stmt, ast.Assign)
            for t in stmt.targets if isinstance(t, ast.Name)}


def alias_record(name: str, value: ast.AST):
    """A type alias: a plain annotation string, or {'union': [...], 'discriminator': ...}."""
    if isinstance(value, ast.Subscript) and ast.unparse(value.value) == "Annotated":
        parts = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
        inner, extras = parts[0], parts[1:]
        discriminator = next((literal(kw.value) for extra in extras if is_field_call(extra)
                              for kw in extra.keywords if kw.arg == "discriminator"), None)
        if discriminator and isinstance(inner, ast.Subscript) and ast.unparse(inner.value) == "Union":
            members = [ast.unparse(m) for m in inner.slice.elts]
            kept = UNION_MEMBERS_KEPT.get(name)
            return {"union": [m for m in members if kept is None or m in kept], "discriminator": discriminator}
    return ast.unparse(value)


def module_symbols(tree: ast.Module):
    """-> (classes by name, enums by name, aliases by name, removed argument names)."""
    classes, enums, aliases, removed = {}, {}, {}, []
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef):
            bases = {ast.unparse(b) for b in stmt.bases}
            (enums if bases & ENUM_BASES else classes)[stmt.name] = stmt
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            if stmt.target.id == REMOVED_ARGS_TABLE and isinstance(stmt.value, ast.Dict):
                removed = [literal(k) for k in stmt.value.keys]
            elif ast.unparse(stmt.annotation) == "TypeAlias":
                aliases[stmt.target.id] = alias_record(stmt.target.id, stmt.value)
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            value = stmt.value
            if isinstance(value, ast.Name) or (isinstance(value, ast.Subscript)
                                               and ast.unparse(value.value) in ("Literal", "Annotated")):
                aliases[stmt.targets[0].id] = alias_record(stmt.targets[0].id, value)
    return classes, enums, aliases, removed


def flattened_fields(name: str, classes: dict) -> dict[str, dict]:
    """Fields of `name` including those of its bases defined in the same file (bases first)."""
    fields: dict[str, dict] = {}
    for base in classes[name].bases:
        if ast.unparse(base) in classes:
            fields.update(flattened_fields(ast.unparse(base), classes))
    fields.update(own_fields(classes[name]))
    return fields


def referenced_names(annotation: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(annotation, mode="eval")) if isinstance(n, ast.Name)}


def build_table(source: str) -> dict:
    """The table for TorchLlmArgs: every class, enum and alias its annotations reach."""
    classes, enums, aliases, removed = module_symbols(ast.parse(source))
    out_classes, out_enums, out_aliases = {}, {}, {}
    pending = [ROOT]
    while pending:
        name = pending.pop()
        if name in out_classes or name in out_enums or name in out_aliases:
            continue
        if name in classes:
            out_classes[name] = {"fields": flattened_fields(name, classes)}
            pending += [ref for f in out_classes[name]["fields"].values() for ref in referenced_names(f["type"])]
        elif name in enums:
            out_enums[name] = enum_members(enums[name])
        elif name in aliases:
            alias = out_aliases[name] = aliases[name]
            pending += alias["union"] if isinstance(alias, dict) else sorted(referenced_names(alias))
    return {"root": ROOT, "classes": dict(sorted(out_classes.items())), "enums": dict(sorted(out_enums.items())),
            "aliases": dict(sorted(out_aliases.items())), "removed_args": sorted(removed)}


def generate(llm_args: Path, commit: str, version: str) -> dict:
    data = llm_args.read_bytes()
    table = build_table(data.decode())
    return {"source": {"repo": "NVIDIA/TensorRT-LLM", "version": version, "commit": commit, "file": LLM_ARGS,
                       "sha256": hashlib.sha256(data).hexdigest(),
                       "generated_by": "tools/gen_trtllm_fields.py"}, **table}


def derive(base_path: Path, changes_path: Path) -> dict:
    """`base_path`'s table with the fields in `changes_path` added or replaced (class by class)."""
    base, changes = json.loads(base_path.read_text()), json.loads(changes_path.read_text())
    table = {k: v for k, v in base.items() if k != "source"}
    table = json.loads(json.dumps(table))  # a deep copy
    for cls, fields in changes["fields"].items():
        if cls not in table["classes"]:
            raise ValueError(f"{changes_path}: class {cls} is not in the {changes['base']} table")
        table["classes"][cls]["fields"].update(fields)
    source = {"repo": "NVIDIA/TensorRT-LLM", "version": changes["version"],
              "derived_from": {"version": changes["base"], "sha256": sha256_file(base_path)},
              "changes": {"file": f"tools/trtllm_changes/{changes_path.name}", "sha256": sha256_file(changes_path)},
              "references": changes["references"], "note": changes["note"],
              "generated_by": "tools/gen_trtllm_fields.py derive"}
    return {"source": source, **table}


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def render(table: dict) -> str:
    return json.dumps(table, indent=1) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="from a TensorRT-LLM checkout's llm_args.py")
    g.add_argument("checkout", type=Path, help="a TensorRT-LLM checkout, or its llm_args.py")
    g.add_argument("--commit", required=True, help="the commit (or tag) the checkout holds")
    g.add_argument("--version", required=True, help="the TensorRT-LLM release it is (e.g. 1.4.0rc4)")
    g.add_argument("--output", type=Path, help="default: trtllm_dflash/builder/trtllm/tables/VERSION.json")
    d = sub.add_parser("derive", help="from an existing table and a changes file")
    d.add_argument("changes", type=Path, help="tools/trtllm_changes/VERSION.json")
    d.add_argument("--output", type=Path, help="default: trtllm_dflash/builder/trtllm/tables/VERSION.json")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "derive":
        table = derive(TABLES / f"{json.loads(args.changes.read_text())['base']}.json", args.changes)
    else:
        path = args.checkout / LLM_ARGS if args.checkout.is_dir() else args.checkout
        if not path.is_file():
            print(f"gen_trtllm_fields: no {LLM_ARGS} under {args.checkout}", file=sys.stderr)
            return 2
        table = generate(path, args.commit, args.version)
    output = args.output or TABLES / f"{table['source']['version']}.json"
    output.write_text(render(table))
    print(f"wrote {output}: {len(table['classes'])} classes, {len(table['enums'])} enums, "
          f"{len(table['aliases'])} aliases, TensorRT-LLM {table['source']['version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
