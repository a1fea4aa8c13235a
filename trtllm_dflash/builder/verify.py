"""Re-check an engine directory: checksums, configs, the pair, and every weight file's names and shapes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import yaml

from ..checkpoint.hf import load_tensors, read_safetensors
from ..checkpoint.loader import DTYPES, check_weights, tied_weights
from ..config.manifest import Manifest
from ..config.model import DrafterConfig, TargetConfig, read_config_json
from ..config.pairing import validate_pair
from ..distributed.parallel import Parallel
from ..models.drafter import DFlashDrafter
from ..models.registry import parse_drafter_config, parse_target_config
from ..models.target import build_target
from ..utils.errors import DFlashError
from .trtllm_engine import OPTIONS, options_at
from .trtllm_fields import check_options
from .trtllm_tables import known_versions, load_table


def verify_engine(engine_dir: str | Path) -> tuple[bool, list[str]]:
    """-> (ok, report lines). Malformed pieces become report lines, not exceptions."""
    engine_dir = Path(engine_dir)
    manifest = Manifest.read(engine_dir)
    problems = manifest.check_files(engine_dir)
    lines = [f"checksums: {len(manifest.files)} files intact"] if not problems else [f"FAIL {p}" for p in problems]
    try:
        lines += CHECKS[manifest.backend](engine_dir, manifest)
    except DFlashError as exc:
        problems.append(str(exc))
        lines.append(f"FAIL {exc}")
    if manifest.backend == "torch":
        from ..compilation.graph_store import verify_lines

        graph_lines, graph_problems = verify_lines(engine_dir)
        lines, problems = lines + graph_lines, problems + graph_problems
    lines.append("engine OK" if not problems else f"engine BROKEN ({len(problems)} problem(s))")
    return not problems, lines


def read_configs(target_dir: Path, drafter_dir: Path) -> tuple[TargetConfig, DrafterConfig]:
    target = parse_target_config(read_config_json(target_dir), str(target_dir / "config.json"))
    drafter = parse_drafter_config(read_config_json(drafter_dir), str(drafter_dir / "config.json"))
    validate_pair(target, drafter)
    return target, drafter


def check_torch(engine_dir: Path, manifest: Manifest) -> list[str]:
    target, drafter = read_configs(engine_dir / "target", engine_dir / "drafter")
    for rank in range(manifest.tp_size):
        tp = Parallel(rank, manifest.tp_size)
        with torch.device("meta"):
            models = (("target", build_target(target, tp)), ("drafter", DFlashDrafter(drafter, tp)))
        for role, model in models:
            path = engine_dir / role / f"rank{rank}.safetensors"
            check_weights(model, read_safetensors(path), path, tied_weights(model.config))
    return [f"pair: configs valid and matched; weights of {manifest.tp_size} rank(s) match their shapes"]


def check_trtllm(engine_dir: Path, manifest: Manifest) -> list[str]:
    from .trtllm_targets import TrtllmTarget

    source = engine_dir / "target" / "config.json"
    target = TrtllmTarget.from_dict(read_config_json(engine_dir / "target"), str(source))
    drafter = parse_drafter_config(read_config_json(engine_dir / "drafter"), str(engine_dir / "drafter"))
    validate_pair(target, drafter)
    tensors = load_tensors(engine_dir / "drafter")
    with torch.device("meta"):
        check_weights(DFlashDrafter(drafter), tensors, engine_dir / "drafter")
    check_drafter_dtype(tensors, manifest.dtype, engine_dir / "drafter")
    table, lines = built_table(manifest)
    options = yaml.safe_load((engine_dir / OPTIONS).read_text())
    warnings = check_options(options, table)
    lines += [f"pair: configs valid and matched; drafter in the published DFlash layout, all {len(tensors)} tensors "
              f"{manifest.dtype}", f"options: {OPTIONS} matches the {table.label}",
              *(f"warning: {w}" for w in warnings)]
    return lines + [parse_with_tensorrt_llm(engine_dir, options)]


def check_drafter_dtype(tensors: dict[str, torch.Tensor], dtype: str, where: Path) -> None:
    """TensorRT-LLM sizes and checks the drafter's context by its stored dtype (trtllm_drafter.py)."""
    for name, tensor in tensors.items():
        if tensor.dtype != DTYPES[dtype]:
            raise DFlashError(f"drafter tensor '{name}' in {where} is {str(tensor.dtype).removeprefix('torch.')}, "
                              f"not the engine's dtype {dtype}")


def built_table(manifest: Manifest):
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


CHECKS = {"torch": check_torch, "trtllm": check_trtllm}
