"""A DFlash drafter directory in either format drafters circulate in: z-lab's or the `speculators` library's.

Both store the same body tensors under the same names (`fc`, `hidden_norm`, `norm`, `layers.*`); they differ
in config.json (mapped by speculators_format.py) and in the verifier-owned copies a speculators file may carry.
Whatever the input, everything downstream (runtime, engines, TensorRT-LLM) sees z-lab's layout. Conversions
copy tensors untouched (same names, dtypes and bits).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..config.model import DrafterConfig, read_config_json
from ..models.registry import parse_drafter_config
from ..utils.errors import DFlashError
from ..utils.output_dir import building, check_output, publish
from .hf import load_tensors, resolve_model_dir
from .speculators import VERIFIER_OWNED, from_zlab, is_speculators, to_zlab

FORMATS = ("zlab", "speculators")


@dataclass(frozen=True)
class DrafterCheckpoint:
    path: Path
    format: str  # one of FORMATS
    layout: dict  # config.json in z-lab's layout (converted when the directory is in the speculators format)
    config: DrafterConfig

    def tensors(self) -> dict[str, torch.Tensor]:
        """The drafter's own tensors; a speculators file's copies of the verifier's embedding/head are dropped
        (the library itself re-reads them from the verifier on load)."""
        tensors = load_tensors(self.path)
        mapped = [name for name in ("d2t", "t2d") if name in tensors]
        if mapped and self.config.method == "dflash2":  # speculators dflash2/core.py:36-43; TensorRT-LLM refuses too
            raise DFlashError(f"{self.path}: a reduced-vocabulary DFlash2 drafter (tensor '{mapped[0]}') is not "
                              "supported: DFlash2 drafts over the target's full vocabulary")
        if self.format == "speculators":
            for name in VERIFIER_OWNED:
                tensors.pop(name, None)
        return split_qkv(tensors, self.config) if self.config.laguna_drafter else tensors


def split_qkv(tensors: dict[str, torch.Tensor], cfg: DrafterConfig) -> dict[str, torch.Tensor]:
    """A Laguna drafter may ship each layer's `self_attn.qkv_proj.weight` fused ([q | k | v] rows); split by the
    head counts, as TensorRT-LLM does (NVIDIA/TensorRT-LLM@009d8fa4 `_torch/models/modeling_dflash.py`
    DFlashForCausalLM.load_weights). A wrong row count surfaces as v_proj's shape mismatch in check_weights."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    out = {}
    for name, t in tensors.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            base = name[: -len("qkv_proj.weight")]
            out.update({f"{base}q_proj.weight": t[:q], f"{base}k_proj.weight": t[q:q + kv],
                        f"{base}v_proj.weight": t[q + kv:]})
        else:
            out[name] = t
    return out


@dataclass(frozen=True)
class Verifier:
    """The target a speculators checkpoint names (`speculators_config.verifier`)."""
    name_or_path: str
    architectures: tuple[str, ...]

    @classmethod
    def of(cls, name: str | Path, model_dir: Path | None = None) -> Verifier:
        """`name` as given (a path or hub id) is what gets recorded; its config.json names the architectures."""
        archs = read_config_json(model_dir or resolve_model_dir(name)).get("architectures") or []
        return cls(str(name), tuple(archs))


def read_drafter(model_dir: Path) -> DrafterCheckpoint:
    raw = read_config_json(model_dir)
    source = str(model_dir / "config.json")
    fmt = "speculators" if is_speculators(raw) else "zlab"
    layout = to_zlab(raw, source) if fmt == "speculators" else raw
    return DrafterCheckpoint(model_dir, fmt, layout, parse_drafter_config(layout, source))


def config_json(layout: dict, config: DrafterConfig, fmt: str, verifier: Verifier | None = None) -> dict:
    """The config.json of a drafter written in `fmt`; the speculators format records its verifier."""
    if fmt not in FORMATS:
        raise DFlashError(f"unknown drafter format {fmt!r} (choose from {', '.join(FORMATS)})")
    if fmt == "zlab":
        return layout
    if verifier is None:
        raise DFlashError("the speculators format names the drafter's verifier (its target): give --verifier")
    return from_zlab(layout, config, verifier.name_or_path, list(verifier.architectures))


def write_drafter(out: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    """config.json + model.safetensors, each written to a temporary name and renamed (never half-written)."""
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / ".model.safetensors.tmp"),
              metadata={"format": "pt"})
    (out / ".config.json.tmp").write_text(json.dumps(config, indent=2) + "\n")
    os.replace(out / ".model.safetensors.tmp", out / "model.safetensors")
    os.replace(out / ".config.json.tmp", out / "config.json")


def convert_drafter(source: str | Path, output: str | Path, fmt: str, verifier: Verifier | None = None,
                    force: bool = False) -> Path:
    """Write the drafter at `source` (either format) to a new directory `output` in `fmt`; -> `output`.

    Written as dflash-build writes an engine (builder/output.py): assembled in a temporary sibling and renamed
    into place, so a failure or interrupt leaves nothing; `force` replaces only a drafter or an empty directory."""
    ckpt = read_drafter(resolve_model_dir(source))
    out = Path(output).expanduser().absolute()
    if out.exists() and out.resolve() == ckpt.path.resolve():
        raise DFlashError(f"output {out} is the source drafter: write the converted drafter elsewhere")
    check_output(out, force, is_drafter, "a DFlash drafter directory (either format)")
    config, tensors = config_json(ckpt.layout, ckpt.config, fmt, verifier), ckpt.tensors()
    try:  # only writing is in here: an OSError is about the output
        out.parent.mkdir(parents=True, exist_ok=True)
        with building(out) as tmp:  # the output's lock held
            check_output(out, force, is_drafter, "a DFlash drafter directory (either format)")  # again, under it
            write_drafter(tmp, config, tensors)
            publish(tmp, out)
    except OSError as exc:
        raise DFlashError(f"cannot write the drafter under {out.parent}: {exc.strerror or exc}") from None
    return out


def is_drafter(path: Path) -> bool:
    try:
        read_drafter(path)
    except DFlashError:
        return False
    return True
