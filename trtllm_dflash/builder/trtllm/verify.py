"""`dflash-build verify` of a trtllm engine: the pair, the drafter's published layout and dtype, and the options
against the field table the engine was built with (and TensorRT-LLM's own parsing where it is importable)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import yaml

from ...checkpoint.hf import load_tensors
from ...checkpoint.loader import DTYPES, check_weights
from ...config.manifest import Manifest
from ...config.model import read_config_json
from ...config.pairing import validate_pair
from ...models.registry import build_drafter, parse_drafter_config
from ...utils.errors import DFlashError
from .engine import OPTIONS, options_at
from .fields import check_options
from .tables import FieldTable, known_versions, load_table
from .targets import TrtllmTarget


def check_trtllm(engine_dir: Path, manifest: Manifest) -> list[str]:
    source = engine_dir / "target" / "config.json"
    target = TrtllmTarget.from_dict(read_config_json(engine_dir / "target"), str(source))
    drafter = parse_drafter_config(read_config_json(engine_dir / "drafter"), str(engine_dir / "drafter"))
    validate_pair(target, drafter)
    tensors = load_tensors(engine_dir / "drafter")
    with torch.device("meta"):
        check_weights(build_drafter(drafter), tensors, engine_dir / "drafter")
    check_drafter_dtype(tensors, manifest.dtype, engine_dir / "drafter")
    table, lines = built_table(manifest)
    options = yaml.safe_load((engine_dir / OPTIONS).read_text())
    warnings = check_options(options, table)
    lines += [f"pair: configs valid and matched; drafter in the published DFlash layout, all {len(tensors)} tensors "
              f"{manifest.dtype}", f"options: {OPTIONS} matches the {table.label}",
              *(f"warning: {w}" for w in warnings)]
    return lines + [parse_with_tensorrt_llm(engine_dir, options)]


def check_drafter_dtype(tensors: dict[str, torch.Tensor], dtype: str, where: Path) -> None:
    """TensorRT-LLM sizes and checks the drafter's context by its stored dtype (drafter.py)."""
    for name, tensor in tensors.items():
        if tensor.dtype != DTYPES[dtype]:
            raise DFlashError(f"drafter tensor '{name}' in {where} is {str(tensor.dtype).removeprefix('torch.')}, "
                              f"not the engine's dtype {dtype}")


def built_table(manifest: Manifest) -> tuple[FieldTable, list[str]]:
    """-> (the field table the engine was checked against, report lines on it). Engines built before tables were
    versioned were checked against the 1.3.0rc27 one."""
    record = manifest.backend_details.get("tensorrt_llm") or {"version": "1.3.0rc27"}
    if record["version"] not in known_versions():
        raise DFlashError(f"the engine was checked against TensorRT-LLM {record['version']!r}, whose field table "
                          "this tool does not have: rebuild it with --trtllm-version")
    table = load_table(record["version"])
    if record.get("table_sha256", table.sha256) != table.sha256:
        return table, [f"warning: the {table.label} changed since the build (sha256 {record['table_sha256'][:12]} "
                       f"then, {table.sha256[:12]} now): options re-checked against the current one"]
    return table, []


def parse_with_tensorrt_llm(engine_dir: Path, options: dict) -> str:
    """Build TensorRT-LLM's own argument object from the YAML where tensorrt_llm is importable."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return "skipped: TensorRT-LLM's own argument parsing (tensorrt_llm is not importable here)"
    try:
        from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

        TorchLlmArgs(model=str(engine_dir / "target"), **options_at(engine_dir, options))
    except ImportError as exc:
        return f"skipped: TensorRT-LLM's own argument parsing (import failed: {exc})"
    except Exception as exc:
        raise DFlashError(f"TensorRT-LLM rejects {OPTIONS}: {type(exc).__name__}: {exc}") from None
    return "options: parsed by TensorRT-LLM's TorchLlmArgs"
