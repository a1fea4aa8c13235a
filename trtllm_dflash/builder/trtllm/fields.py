"""TensorRT-LLM LLM-API options checked against upstream's own field table, before a byte is written.

TensorRT-LLM's argument classes forbid unknown keys (pydantic `extra="forbid"`, BaseLlmArgs and every
StrictBaseModel), so a YAML key it does not know fails only inside the container. A field table
(tables.py: one per upstream release) holds the fields of TorchLlmArgs and of every config class its
annotations reach (names, annotations, defaults, constraints, status, aliases). `check_options` walks an options
mapping through the table of the chosen release: unknown keys (with the nearest valid name), values of the wrong
type, deprecated keys (warnings). Classes defined outside llm_args.py (LoraConfig, TelemetryConfig, ...) are passed
through unchecked.
"""

from __future__ import annotations

import ast
import difflib
from functools import lru_cache
from typing import Any

from ...utils.errors import DFlashError
from .tables import FieldTable, first_version_with, table_for

#: The first TensorRT-LLM release whose documentation we read lists DFlashDecodingConfig with the fields this
#: project writes, attention_backend VANILLA|TRTLLM|FA4 included (nvidia.github.io/TensorRT-LLM/1.3.0rc27/
#: llm-api/reference/DFlashDecodingConfig.html): the oldest field table (tables/1.3.0rc27.json).
MIN_TENSORRT_LLM = "1.3.0rc27"

_INTS = {"int": None, "StrictInt": None, "NonNegativeInt": ("ge", 0), "PositiveInt": ("gt", 0)}
_FLOATS = {"float": None, "NonNegativeFloat": ("ge", 0)}
_STRINGS = {"str", "Path"}
_LISTS = {"List", "list", "Set", "set", "Tuple", "tuple"}
_DICTS = {"Dict", "dict"}


class _Mismatch(Exception):
    """The value does not have the annotated type (unions catch it and try the next member)."""


def check_options(options: dict[str, Any], table: FieldTable | None = None) -> list[str]:
    """Raise DFlashError on the first key or value TorchLlmArgs of `table`'s release (default: the newest known)
    would reject; -> warnings (deprecated keys)."""
    table = table or table_for()
    if not isinstance(options, dict):
        raise DFlashError(f"TensorRT-LLM options must be a mapping, got {options!r}")
    removed = sorted(set(options) & set(table.data["removed_args"]))
    if removed:
        raise DFlashError(f"TensorRT-LLM option {removed[0]!r} was removed from TorchLlmArgs ({table.label}); drop it")
    checker = _Checker(table)
    checker.check_class(table.data["root"], options, "")
    return checker.warnings


class _Checker:
    """One walk of an options mapping through one table; collects deprecation warnings."""

    def __init__(self, table: FieldTable):
        self.table, self.data, self.warnings = table, table.data, []

    def check_class(self, cls: str, value: dict, path: str) -> None:
        fields = self.table.fields_of(cls)
        names = {alias: name for name, f in fields.items() for alias in (name, *f.get("aliases", ()))}
        for key, item in value.items():
            where = f"{path}{key}"
            if key not in names:
                hint = self.hint(cls, str(key), list(names), path)
                raise DFlashError(f"TensorRT-LLM option '{where}' is not a field of {cls} ({self.table.label}){hint}")
            field = fields[names[key]]
            if field.get("status") == "deprecated":
                self.warnings.append(f"TensorRT-LLM option '{where}' is deprecated upstream ({self.table.label})")
            self.check_field(field, item, where)

    def hint(self, cls: str, key: str, names: list[str], path: str) -> str:
        newer = first_version_with(cls, key, after=self.table.version)
        if newer:
            return f" (it is from TensorRT-LLM {newer}: --trtllm-version {newer} or newer)"
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        return f" (did you mean '{path}{close[0]}'?)" if close else ""

    def check_field(self, field: dict, value: Any, where: str) -> None:
        try:
            self.check(_parse(field["type"]), value, where, bool(field.get("coerced")))
        except _Mismatch:
            if field.get("coerced") and not isinstance(value, dict):
                return  # an upstream mode='before' validator rewrites this value first: its type is not ours to judge
            raise DFlashError(f"TensorRT-LLM option '{where}' must be {field['type']}, got {value!r} "
                              f"({self.table.label})") from None
        for bound, limit in field.get("constraints", {}).items():
            if not _within(bound, limit, value):
                raise DFlashError(f"TensorRT-LLM option '{where}' must satisfy {bound} {limit}, got {value!r} "
                                  f"({self.table.label})")

    def check(self, node: ast.expr, value: Any, where: str, coerced: bool = False) -> None:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.check_union([node.left, node.right], value, where, coerced)
        if isinstance(node, ast.Constant) and node.value is None:
            if value is not None:
                raise _Mismatch
            return None
        if isinstance(node, ast.Subscript):
            return self.check_generic(node, value, where, coerced)
        name = ast.unparse(node)
        if name in self.data["classes"]:
            if not isinstance(value, dict):
                raise _Mismatch
            return self.check_class(name, value, f"{where}.")
        if name in self.data["aliases"]:
            alias = self.data["aliases"][name]
            if isinstance(alias, dict):
                return self.check_tagged_union(alias, value, where, coerced)
            return self.check(_parse(alias), value, where, coerced)
        if name in self.data["enums"]:
            return _check_enum(self.data["enums"][name], value)
        return _check_scalar(name, value)

    def check_generic(self, node: ast.Subscript, value: Any, where: str, coerced: bool) -> None:
        head = ast.unparse(node.value)
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return self.check_union([ast.Constant(None), args[0]], value, where, coerced)
        if head == "Union":
            return self.check_union(args, value, where, coerced)
        if head == "Annotated":
            return self.check(args[0], value, where, coerced)
        if head == "Literal":
            if not any(type(value) is type(choice) and value == choice for choice in map(ast.literal_eval, args)):
                raise _Mismatch
            return None
        if head in _LISTS:
            if not isinstance(value, (list, tuple)) or (head in ("Tuple", "tuple") and len(value) != len(args)):
                raise _Mismatch
            for i, item in enumerate(value):
                self.check(args[min(i, len(args) - 1)], item, f"{where}[{i}]")
            return None
        if head in _DICTS:
            if not isinstance(value, dict):
                raise _Mismatch
            for key, item in value.items():
                self.check(args[0], key, where)
                self.check(args[1], item, f"{where}.{key}")
            return None
        return None  # a generic this table does not model: accepted unchecked

    def check_union(self, members: list[ast.expr], value: Any, where: str, coerced: bool) -> None:
        for member in members:
            try:
                return self.check(member, value, where, coerced)
            except _Mismatch:
                continue
        raise _Mismatch

    def check_tagged_union(self, alias: dict, value: Any, where: str, coerced: bool) -> None:
        """A pydantic discriminated union: the member whose discriminator Literal holds the value's tag."""
        if not isinstance(value, dict):
            raise _Mismatch
        tag = alias["discriminator"]
        if tag not in value:
            if not coerced:  # only a mode='before' validator upstream (cuda_graph_config's) infers the tag
                raise DFlashError(f"TensorRT-LLM option '{where}' needs '{tag}' (one of {self.tags(alias)})")
            return self.check_class(alias["union"][0], value, f"{where}.")
        for member in alias["union"]:
            if value[tag] in self.tag_values(member, tag):
                return self.check_class(member, value, f"{where}.")
        raise DFlashError(f"TensorRT-LLM option '{where}.{tag}' must be one of {self.tags(alias)} in the "
                          f"{self.table.label}, got {value[tag]!r}")

    def tag_values(self, cls: str, tag: str) -> list:
        node = _parse(self.table.fields_of(cls)[tag]["type"])
        return [ast.literal_eval(a) for a in (node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice])]

    def tags(self, alias: dict) -> str:
        return ", ".join(repr(v) for member in alias["union"] for v in self.tag_values(member, alias["discriminator"]))


def literal_choices(table: FieldTable, cls: str, field: str) -> tuple:
    """The values of a Literal[...] field (MoeConfig.backend): what a flag naming it may take in this release."""
    node = _parse(table.fields_of(cls)[field]["type"])
    return tuple(ast.literal_eval(e) for e in (node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]))


def _within(bound: str, limit, value) -> bool:
    if bound in ("min_length", "max_length"):
        if not hasattr(value, "__len__"):
            return True
        return len(value) >= limit if bound == "min_length" else len(value) <= limit
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return True  # None, or a value the type check already judged
    return {"ge": value >= limit, "gt": value > limit, "le": value <= limit, "lt": value < limit}[bound]


@lru_cache(maxsize=None)
def _parse(annotation: str) -> ast.expr:
    return ast.parse(annotation, mode="eval").body


def _check_scalar(name: str, value: Any) -> None:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if name in _INTS:
        ok = is_number and isinstance(value, int) and (_INTS[name] is None or _within(*_INTS[name], value))
    elif name in _FLOATS:
        ok = is_number and (_FLOATS[name] is None or _within(*_FLOATS[name], value))
    elif name == "bool":
        ok = isinstance(value, bool)
    elif name in _STRINGS:
        ok = isinstance(value, str)
    else:  # Any, object, or a class defined outside llm_args.py: not ours to check
        ok = True
    if not ok:
        raise _Mismatch


def _check_enum(members: dict, value: Any) -> None:
    spellings = {str(v).lower() for v in members.values()} | {k.lower() for k in members}
    if not (str(value).lower() in spellings and isinstance(value, (str, int)) and not isinstance(value, bool)):
        raise _Mismatch
