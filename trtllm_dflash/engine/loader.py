"""Run a `torch` engine directory: one rank in-process, or N tensor-parallel ranks.

N ranks are started by the runtime itself (spawned processes on loopback: gloo on CPUs, NCCL on
GPUs) or by `torchrun` (multi-node: every process calls `generate_with_engine`, rank 0 reports).
Every rank runs the same generation on the same inputs; collectives keep them in step.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..checkpoint.hf import load_tokenizer, read_safetensors, stop_token_ids
from ..checkpoint.loader import DTYPES, LoadedDrafter, LoadedTarget, drafter_from_tensors, target_from_tensors
from ..compilation.graph_store import graph_key, inductor_counts, use_stored_graphs
from ..compilation.step_mode import StepMode
from ..config.manifest import Manifest
from ..config.model import read_config_json
from ..config.runtime import AUTO, DECODINGS, RuntimeConfig
from ..distributed.parallel import Parallel
from ..distributed.rendezvous import join_local_group
from ..models.registry import parse_drafter_config, parse_target_config
from ..speculative import AutoregressiveProposer, drafter_proposer
from ..utils.errors import DFlashError
from ..utils.threads import set_threads
from .draft_len import make_policy
from .generator import Generator
from .pipeline import Pipeline, check_device
from .request import Request, Result

WORKER_TIMEOUT_S = 3600


def read_torch_manifest(engine_dir: Path) -> Manifest:
    manifest = Manifest.read(engine_dir)
    if manifest.backend != "torch":
        raise DFlashError(f"{engine_dir} is a '{manifest.backend}' engine: the portable runtime runs 'torch' engines "
                          "(serve trtllm engines with TensorRT-LLM)")
    return manifest


def load_engine(engine_dir: str | Path, rank: int = 0, device: str = "cpu", decoding: str = "dflash",
                step_mode: str | None = None, stored_graphs: bool = True, max_batch: int | None = None) -> Pipeline:
    """One rank of a torch engine, reading only that rank's weight files. decoding="plain" skips the
    drafter and decodes autoregressively with the target (the baseline a benchmark compares against).
    step_mode: eager, compile or cuda-graphs (step_mode.py); None: the device's default. Compiled modes load the
    graphs `dflash-build compile` stored for this machine (graph_store.py) unless stored_graphs is False; the
    seconds spent on each part of the start go to `pipeline.startup`. max_batch: the most requests this process will
    step together (None: any, as a server; 1: `dflash-generate`'s one request warms only the one-row graphs)."""
    start = time.perf_counter()
    if decoding not in DECODINGS:
        raise DFlashError(f"unknown decoding {decoding!r} (expected one of {', '.join(DECODINGS)})")
    engine_dir = Path(engine_dir)
    manifest = read_torch_manifest(engine_dir)
    mode = StepMode.resolve(step_mode, device)
    tp, dtype = Parallel(rank, manifest.tp_size), DTYPES[manifest.dtype]
    t_dir, d_dir = engine_dir / "target", engine_dir / "drafter"
    t_cfg = parse_target_config(read_config_json(t_dir), str(t_dir / "config.json"))
    d_cfg = parse_drafter_config(read_config_json(d_dir), str(d_dir / "config.json"))
    shard = f"rank{rank}.safetensors"
    target = target_from_tensors(t_cfg, read_safetensors(t_dir / shard), t_dir / shard, tp, dtype, device)
    tokenizer = load_tokenizer(engine_dir / manifest.tokenizer) if manifest.tokenizer else None
    stops = stop_token_ids(t_dir, t_cfg.eos_token_ids, tokenizer)
    loaded_target = LoadedTarget(target, t_cfg, t_dir, tokenizer, stops)
    if decoding == "plain":
        pipeline = Pipeline(Generator(target, AutoregressiveProposer(), stops), loaded_target, None)
    else:
        drafter = drafter_from_tensors(d_cfg, read_safetensors(d_dir / shard), d_dir / shard, tp, dtype, device)
        proposer = drafter_proposer(drafter, target)
        proposer.max_block_size = manifest.block_size  # the engine's block size is the limit
        pipeline = Pipeline(Generator(target, proposer, stops), loaded_target, LoadedDrafter(drafter, d_cfg, d_dir))
    pipeline.generator.set_step_mode(mode, prefills_once=max_batch == 1)
    weights_s = time.perf_counter() - start
    stored = False
    if mode.compiled and stored_graphs:
        log = (lambda line: print(f"trtllm_dflash: {line}", file=sys.stderr, flush=True)) if rank == 0 else None
        key = graph_key(manifest, pipeline.generator.device, mode.mode, rank)
        stored = use_stored_graphs(engine_dir, key, device, log)
    compiled_before = inductor_counts()["compiled"] if mode.compiled else 0
    pipeline.warm_up(max_batch)  # every rank alike: the first request pays no set-up (a served model's included)
    compiled = inductor_counts()["compiled"] - compiled_before if mode.compiled else 0
    pipeline.startup = {"weights_s": weights_s, **pipeline.startup, "graphs": graph_source(mode, stored, compiled)}
    return pipeline


def graph_source(mode: StepMode, stored: bool, compiled: int) -> str:
    """How the warm-up got its graphs: none (eager), loaded (every one from the engine's stored set), compiled (N
    of them), or from inductor's own cache (an earlier process on this machine compiled them)."""
    if not mode.compiled:
        return "none"
    if compiled:
        return f"compiled {compiled}"
    return "loaded" if stored else "inductor's local cache"


def kv_pool_lines(engine_dir: Path) -> list[str]:
    """`dflash-build inspect`: what the paged KV pool holds per rank, from the models built on the meta device (no
    weights read): bytes of K/V per token (target and drafter context), tokens per GiB of --kv-cache-gib, and the
    pool a CPU server sizes by default (every row at max_seq_len)."""
    from ..cache.block_pool import default_blocks
    from ..cache.kv_cache import BLOCK
    from ..models.registry import build_drafter
    from ..models.target import build_target

    manifest = read_torch_manifest(engine_dir)
    tp, dtype = Parallel(0, manifest.tp_size), DTYPES[manifest.dtype]
    t_dir, d_dir = engine_dir / "target", engine_dir / "drafter"
    with torch.device("meta"):
        target = build_target(parse_target_config(read_config_json(t_dir), str(t_dir / "config.json")), tp)
        drafter = build_drafter(parse_drafter_config(read_config_json(d_dir), str(d_dir / "config.json")), tp)
    generator = Generator(target.to(dtype), drafter_proposer(drafter.to(dtype), target, context_kv="unfused"), set())
    per_block = generator.block_bytes()
    if not per_block:
        return ["kv pool      nothing paged (every layer keeps a window ring or recurrent state per row)"]
    limits = manifest.limits
    default = default_blocks(limits["max_batch_size"], limits["max_seq_len"])  # Generator.allocate's default
    return [f"kv pool      {per_block / BLOCK:,.0f} B of K/V per token per rank ({manifest.dtype}, target and drafter "
            f"context); --kv-cache-gib 1 holds {2**30 // per_block * BLOCK:,} tokens; the CPU default "
            f"(max_batch_size x max_seq_len) {default * BLOCK:,} tokens = {default * per_block / 2**30:.2f} GiB"]


def generate_with_engine(engine_dir: str | Path, requests: list[Request], block_size: int | None = None,
                         device: str = "cpu", draft_len: str | int | None = AUTO,
                         threads: int | None = None, step_mode: str | None = None) -> list[Result]:
    """draft_len: see engine/draft_len.py. Ranks of a TP > 1 engine run independently here, so they
    must choose alike: 'auto' (timed per rank) becomes the whole block there; N and schedules are kept.
    threads: torch threads of the ranks this spawns (None: threads.default_threads for tp_size ranks);
    a rank in this process keeps the caller's setting. step_mode: see `load_engine`."""
    check_device(device)
    runtime = RuntimeConfig(step_mode=step_mode or AUTO, draft_len=str(AUTO if draft_len is None else draft_len),
                            threads=threads)
    StepMode.resolve(runtime.step_mode, device)  # a bad mode fails here, not in a spawned rank
    manifest = read_torch_manifest(Path(engine_dir))
    for r in requests:  # generate() sizes its cache per call: without this it would run past the built limit
        r.check_length(manifest.limits["max_seq_len"], "this engine's max_seq_len")
    if manifest.tp_size > 1 and runtime.draft_len.strip() == AUTO:
        runtime = replace(runtime, draft_len=str(manifest.block_size - 1))
    if dist.is_available() and dist.is_initialized():  # under torchrun: this process is one rank
        if dist.get_world_size() != manifest.tp_size:
            raise DFlashError(f"world size {dist.get_world_size()} != the engine's tp_size {manifest.tp_size}")
        return run_rank(engine_dir, dist.get_rank(), rank_device(device, dist.get_rank()), requests, block_size,
                        runtime)
    if manifest.tp_size == 1:
        return run_rank(engine_dir, 0, device, requests, block_size, runtime)
    return spawn_ranks(Path(engine_dir), manifest.tp_size, requests, block_size, device, runtime)


def run_rank(engine_dir, rank: int, device: str, requests: list[Request], block_size: int | None,
             runtime: RuntimeConfig) -> list[Result]:
    generator = load_engine(engine_dir, rank, device, runtime.decoding, runtime.step_mode,
                            max_batch=len(requests)).generator
    generator.configure(runtime, make_policy(runtime.draft_len, generator.block - 1, Path(engine_dir)))
    return generator.generate(requests, block_size)


def init_from_torchrun(device: str) -> None:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, MASTER_ADDR/PORT in the env)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")


def rank_device(device: str, rank: int) -> str:
    return f"cuda:{rank % torch.cuda.device_count()}" if device.startswith("cuda") else device


def spawn_ranks(engine_dir: Path, world: int, requests, block_size, device, runtime: RuntimeConfig,
                rank_fn=None) -> list[Result]:
    """rank_fn(engine_dir, rank, device, step_mode): what each rank runs instead of the generation (rank 0's
    return value is returned), e.g. `dflash-build compile`'s."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, str(engine_dir), requests, block_size, device,
                                                  runtime, results, rank_fn), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        return _collect(results, procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def _collect(results, procs) -> list[Result]:
    waited = 0
    while True:
        try:
            kind, payload = results.get(timeout=1)
            break
        except queue.Empty:
            waited += 1
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or waited > WORKER_TIMEOUT_S:
                raise DFlashError(f"a tensor-parallel rank exited with code {dead[0].exitcode if dead else 'timeout'}")
    if kind == "error":
        raise DFlashError(payload)
    return payload


def _rank_main(rank, world, port, engine_dir, requests, block_size, device, runtime: RuntimeConfig, results,
               rank_fn=None) -> None:
    set_threads(runtime.threads, world)
    try:
        join_local_group("nccl" if device.startswith("cuda") else "gloo", rank, world, port)
        if rank_fn is not None:
            out = rank_fn(engine_dir, rank, rank_device(device, rank), runtime.step_mode)
        else:
            out = run_rank(engine_dir, rank, rank_device(device, rank), requests, block_size, runtime)
        if rank == 0:
            results.put(("ok", out))
    except DFlashError as exc:
        results.put(("error", str(exc)))
    except Exception as exc:  # report, do not hang the parent
        results.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
