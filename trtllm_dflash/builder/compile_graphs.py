"""`dflash-build compile`: compile every step graph a torch engine's server runs on this machine, once, and store
them in the engine directory (graph_store.py) for every later process to load.

The graphs are the load-time warm-up's (`Pipeline.warm_up`: prefill, each batch bucket, the drafter): the same
code path a server and `dflash-generate --engine` take, so what is stored is what they look up. Each rank compiles
in a fresh inductor cache of its own, so every graph and kernel is compiled here (none borrowed from an earlier
run), which is what the stored set must hold.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..compilation.step_mode import StepMode
from ..config.runtime import RuntimeConfig
from ..utils.errors import DFlashError


def compile_engine(engine_dir: str | Path, device: str = "cpu", step_mode: str | None = None,
                   calibrate: bool = True, log=print) -> list[Path]:
    """-> the stored sets (one per rank). calibrate: also measure the step cost for the same key when the engine
    has none (tp 1; a served TP engine calibrates at load)."""
    from ..engine.loader import read_torch_manifest, spawn_ranks
    from ..engine.pipeline import check_device

    check_device(device)
    mode = StepMode.resolve(step_mode, device)
    if not mode.compiled:
        raise DFlashError(f"step mode {mode.mode} compiles nothing: use --step-mode compile or cuda-graphs")
    manifest = read_torch_manifest(Path(engine_dir))
    if manifest.tp_size == 1:
        return [compile_rank(engine_dir, 0, device, mode.mode, calibrate, log)]
    return [spawn_ranks(Path(engine_dir), manifest.tp_size, [], None, device, RuntimeConfig(step_mode=mode.mode),
                        rank_fn=compile_rank_main)]  # rank 0's set; each rank logs its own


def compile_rank(engine_dir, rank: int, device: str, mode: str, calibrate: bool = False, log=None) -> Path:
    from ..compilation.graph_store import GraphStore, graph_key, inductor_counts

    fresh = Path(tempfile.mkdtemp(prefix="dflash-inductor-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(fresh)  # read by inductor on every lookup
    try:
        from ..engine.loader import load_engine, read_torch_manifest

        start = time.perf_counter()
        pipeline = load_engine(engine_dir, rank, device, step_mode=mode, stored_graphs=False)
        compile_s = time.perf_counter() - start
        key = graph_key(read_torch_manifest(Path(engine_dir)), pipeline.generator.device, mode, rank)
        where = GraphStore(Path(engine_dir)).save(key, fresh, compile_s)
        if log:
            log(f"rank {rank}: {inductor_counts()['compiled']} graphs compiled in {compile_s:.1f} s, stored in "
                f"{where}")
        if calibrate and rank == 0:
            calibrate_once(Path(engine_dir), pipeline.generator, log)
        return where
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def calibrate_once(engine_dir: Path, generator, log) -> None:
    """The step-cost model for the same machine and step mode, unless the engine has one covering its range."""
    from ..engine.calibrate import CalibrationPlan, calibration_key, measure
    from ..engine.draft_len import engine_cache
    from ..engine.loader import read_torch_manifest

    limits = read_torch_manifest(engine_dir).limits
    generator.allocate(limits["max_batch_size"], limits["max_seq_len"], generator.block)
    cache, key = engine_cache(engine_dir), calibration_key(generator)
    cached = cache.load(key)
    if cached is not None and cached.covers(generator.slots.usable, generator.block - 1):
        log and log(f"step-cost model: already calibrated ({cached.meta.get('created_utc')})")
        return
    plan = CalibrationPlan.covering(limits["max_batch_size"], generator.block - 1,
                                    generator.capacity - generator.block - 1)
    model = measure(generator, plan)
    where = cache.save(model, key)
    log and log(f"step-cost model: calibrated in {model.meta['calibration_s']:.1f} s, cached in {where}")


def compile_rank_main(engine_dir, rank, device, mode) -> Path:
    """One spawned rank of a TP engine (engine.spawn_ranks); the ranks' warm-ups run their collectives together."""
    return compile_rank(engine_dir, rank, device, mode, log=lambda line: print(f"dflash-build: {line}",
                                                                                file=sys.stderr, flush=True))
