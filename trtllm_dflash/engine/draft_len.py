"""`--draft-len`: which policy a served or generating engine uses.

    auto            choose every step from the step times and acceptance this process measures (the default)
    N               always N drafts per step (0: plain decoding through the DFlash engine)
    FILE            a draft_len_schedule file (running batch size -> draft length), as TensorRT-LLM runs it
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..config.manifest import RUNTIME_CACHE
from ..config.runtime import AUTO, draft_len_kind
from ..draft_length.cost import CostModel
from ..draft_length.policy import AutoDraftLen, DraftLenPolicy, FixedDraftLen, ScheduledDraftLen
from ..draft_length.schedule import read_schedule
from ..utils.errors import DFlashError
from ..utils.user_cache import CACHE_DIR_ENV, user_cache_home
from .calibrate import CalibrationCache, CalibrationPlan, calibration_key, measure


def fallback_cache(engine_dir: Path, root: Path | None = None) -> Path:
    """Per engine (by its path), under `root` (default: the user's cache, user_cache.py)."""
    digest = hashlib.sha256(str(engine_dir.resolve()).encode()).hexdigest()[:16]
    return (root or user_cache_home() / "calibration") / digest


def chosen_root() -> Path | None:
    """$TRTLLM_DFLASH_CACHE_DIR: where the user says step-cost models go (None: not set)."""
    chosen = os.environ.get(CACHE_DIR_ENV)
    return Path(chosen) if chosen else None


def engine_cache(engine_dir: Path) -> CalibrationCache:
    """Where an engine's step-cost models are kept, one cache for dflash-generate, dflash-serve and dflash-build
    calibrate alike (a model's key names the machine: calibrate.calibration_key): under $TRTLLM_DFLASH_CACHE_DIR
    when set; else ENGINE/calibration/ when the engine directory is writable, the user's cache when not (a
    read-only mount)."""
    if chosen_root():
        return CalibrationCache(fallback_cache(Path(engine_dir), chosen_root()))
    return CalibrationCache(Path(engine_dir) / RUNTIME_CACHE, fallback_cache(Path(engine_dir)))


def calibrate_engine(engine_dir: Path, max_batch: int | None = None, repeats: int = 3,
                     device: str = "cpu", step_mode: str | None = None) -> tuple[CostModel, Path | None]:
    """`dflash-build calibrate`: measure a torch engine's step cost over its whole range (up to its
    max_batch_size and max_seq_len) and cache it where serving looks; -> (model, where it went)."""
    from .loader import load_engine, read_torch_manifest

    manifest = read_torch_manifest(Path(engine_dir))
    if manifest.tp_size > 1:
        raise DFlashError(f"calibrate measures tp_size 1 engines; this one has tp_size {manifest.tp_size} (a served "
                          "tensor-parallel engine calibrates at load, rank 0 driving every rank)")
    limits = manifest.limits
    batch = max_batch or limits["max_batch_size"]
    if not 1 <= batch <= limits["max_batch_size"]:
        raise DFlashError(f"--max-batch-size must be in 1..{limits['max_batch_size']} (the engine's), got {batch}")
    generator = load_engine(engine_dir, device=device, step_mode=step_mode).generator
    generator.allocate(batch, limits["max_seq_len"], generator.block)
    plan = CalibrationPlan.covering(batch, generator.block - 1, generator.capacity - generator.block - 1, repeats)
    model = measure(generator, plan)
    return model, engine_cache(Path(engine_dir)).save(model, calibration_key(generator))


def stored_prior(cache: CalibrationCache):
    """-> generator -> the step-cost model `dflash-build calibrate` stored for this machine, or None: the live
    policy's prior, read, never measured."""
    return lambda generator: cache.load(calibration_key(generator))


def make_policy(setting: str | int | None, max_draft_len: int, engine_dir: Path | None = None) -> DraftLenPolicy:
    """The policy a `--draft-len` value names (config/runtime.py checks its form); errors name the value. `auto`
    takes an engine's stored step-cost model as its prior where it has one."""
    setting = AUTO if setting is None else str(setting).strip()
    kind = draft_len_kind(setting)
    if kind == AUTO and max_draft_len == 0:  # plain decoding: nothing to choose
        return FixedDraftLen(0)
    if kind == AUTO:
        return AutoDraftLen(stored_prior(engine_cache(Path(engine_dir))) if engine_dir is not None else None)
    if kind == "fixed":
        if int(setting) > max_draft_len:
            raise DFlashError(f"--draft-len {setting} exceeds this engine's largest draft length {max_draft_len} "
                              "(block size - 1)")
        return FixedDraftLen(int(setting))
    schedule = read_schedule(setting)
    too_long = [n for _, n in schedule.steps if n > max_draft_len]
    if too_long:
        raise DFlashError(f"{setting}: draft length {too_long[0]} exceeds this engine's largest draft length "
                          f"{max_draft_len}")
    return ScheduledDraftLen(schedule)
