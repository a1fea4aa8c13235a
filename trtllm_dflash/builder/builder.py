"""Build an engine directory: plan and check the build, let the backend write into a temporary sibling, rename
at the end."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from .. import __version__
from ..checkpoint.drafter import read_drafter
from ..checkpoint.hf import resolve_model_dir, weight_files
from ..config.manifest import MANIFEST, Manifest, is_engine, sha256_json
from ..config.model import DrafterConfig, read_config_json
from ..config.pairing import check_block_size, validate_pair
from ..distributed.parallel import check_divisible
from ..utils.errors import DFlashError
from ..utils.output_dir import building, check_output, publish
from .backend import backend_for
from .plan import TOKENIZER_FILES, BuildPlan
from .spec import BuildSpec


def plan_build(spec: BuildSpec) -> BuildPlan:
    backend = backend_for(spec.backend)
    target_dir, drafter_dir = resolve_model_dir(spec.target), resolve_model_dir(spec.drafter)
    target_json, checkpoint = read_config_json(target_dir), read_drafter(drafter_dir)
    target = backend.read_target(target_json, str(target_dir / "config.json"))
    drafter = checkpoint.config
    validate_pair(target, drafter)
    block = check_block_size(spec.block_size or drafter.block_size, drafter.block_size)
    max_seq_len = spec.max_seq_len or backend.default_max_seq_len(target, drafter)
    check_max_seq_len(max_seq_len, target, drafter)
    plan = BuildPlan(spec, target_dir, target, target_json, checkpoint, block, max_seq_len,
                     Path(spec.output).expanduser().absolute())
    backend.check_plan(plan)
    check_divisible("drafter", drafter.num_attention_heads, drafter.num_key_value_heads, drafter.intermediate_size,
                    spec.tp)
    if not any((target_dir / f).is_file() for f in TOKENIZER_FILES):
        raise DFlashError(f"the target in {target_dir} has no tokenizer (expected one of tokenizer.json, "
                          "tokenizer_config.json, tokenizer.model)")
    weight_files(target_dir), weight_files(drafter_dir)  # present, or a clear error now
    return plan


def check_max_seq_len(max_seq_len: int, target, drafter: DrafterConfig) -> None:
    for name, limit in (("target", target.max_position_embeddings), ("drafter", drafter.max_position_embeddings)):
        if max_seq_len > limit:
            raise DFlashError(f"max_seq_len {max_seq_len} exceeds the {name}'s max_position_embeddings {limit}")


def build_engine(spec: BuildSpec, command: str) -> Path:
    """-> the engine directory. Nothing is left behind if any step fails or is interrupted (Ctrl-C, SIGTERM,
    SIGHUP); an existing output is replaced only with force, and only if it is an engine or empty."""
    plan = plan_build(spec)
    out = plan.final_dir
    kind = f"an engine directory (with {MANIFEST})"
    check_output(out, spec.force, is_engine, kind)
    parent = prepare_parent(out)
    check_free_space(parent, estimate_bytes(plan))
    with building(out) as tmp:  # the output's lock held
        check_output(out, spec.force, is_engine, kind)  # again: a build of the same output may have just finished
        details = write_backend(plan, tmp)
        manifest_for(plan, command, details).write(tmp)
        publish(tmp, out)
    return out


def write_backend(plan: BuildPlan, tmp: Path) -> dict:
    return backend_for(plan.spec.backend).write(plan, tmp)


def manifest_for(plan: BuildPlan, command: str, details: dict) -> Manifest:
    spec = plan.spec
    return Manifest(
        backend=spec.backend, target=identity(spec.target, plan.target_json),
        drafter={**identity(spec.drafter, plan.drafter_json), "format": plan.drafter_checkpoint.format},
        tp_size=spec.tp, dtype=spec.dtype, quantization=spec.quant, block_size=plan.block_size,
        limits={"max_batch_size": spec.max_batch_size, "max_seq_len": plan.max_seq_len,
                "max_num_tokens": spec.max_num_tokens},
        tokenizer=details.pop("tokenizer", None), build_command=command, tool_version=__version__,
        created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), backend_details=details)


def identity(source: str, config: dict) -> dict:
    shape = config.get("text_config") or config  # a multimodal checkpoint's language model
    return {"source": source, "config_sha256": sha256_json(config), "model_type": config.get("model_type"),
            "architectures": config.get("architectures"),
            **{k: shape.get(k) for k in ("num_hidden_layers", "hidden_size", "vocab_size")}}


def prepare_parent(out: Path) -> Path:
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=parent, prefix=".dflash-write-test-")
        probe.close()
    except OSError as exc:
        raise DFlashError(f"cannot write the engine under {parent}: {exc.strerror or exc}") from None
    return parent


def estimate_bytes(plan: BuildPlan) -> int:
    """Upper bound of what the build writes: the checkpoints' sizes, doubled for fp32 outputs."""
    size = sum(f.stat().st_size for d in (plan.target_dir, plan.drafter_dir) for f in weight_files(d))
    return size * (2 if plan.spec.dtype == "float32" else 1) + (64 << 20)


def check_free_space(parent: Path, needed: int) -> None:
    free = shutil.disk_usage(parent).free
    if free < needed:
        raise DFlashError(f"not enough free disk space under {parent}: about {needed / 2**30:.2f} GiB needed, "
                          f"{free / 2**30:.2f} GiB free")
