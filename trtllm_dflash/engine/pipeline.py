"""Load a target (and optionally its DFlash drafter) into a ready Generator."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..checkpoint.loader import LoadedDrafter, LoadedTarget, load_drafter, load_target
from ..compilation.graph_store import recording_timer
from ..compilation.step_mode import StepMode
from ..config.pairing import validate_pair
from ..draft_length.policy import FixedDraftLen
from ..speculative import AutoregressiveProposer, drafter_proposer
from ..utils.errors import DFlashError
from .generator import Generator
from .request import Request
from .warmup import compile_step_shapes


@dataclass
class Pipeline:
    generator: Generator
    target: LoadedTarget
    drafter: LoadedDrafter | None
    startup: dict = field(default_factory=dict)  # seconds per part of the load (engine.load_engine, warm_up)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def warm_up(self, max_batch: int | None = None) -> None:
        """One tiny greedy generation through the real step path, so one-time costs are paid at load and not
        in the first request's TTFT: the context_kv custom op imports torch._dynamo on its first call (about
        1 s on CPU), and kernels initialise on their first pass. The whole block is drafted (the drafter runs);
        every rank of a TP engine runs the same generation, so their collectives match. Compiled steps compile
        every graph here (`step_mode.compile_step_shapes`; max_batch 1: only the one-row graphs)."""
        g = self.generator
        start = time.perf_counter()
        # prompt 2 tokens, then prefill + one full drafting step (block + 1 tokens at most)
        with g.temporarily(FixedDraftLen()):
            with recording_timer() if g.step_mode.graphs else nullcontext([0.0]) as recording:
                g.generate([Request((0, 0), g.block + 1, ignore_eos=True)])
                if g.step_mode.compiled:
                    compile_step_shapes(g, max_batch)
        # graphs: tracing plus compiling (or loading) them; CUDA-graph recording apart
        self.startup.update(graphs_s=time.perf_counter() - start - recording[0], cuda_graphs_s=recording[0])


def load_pipeline(target: str | Path, drafter: str | Path | None = None, dtype: torch.dtype = torch.float32,
                  device: str = "cpu", step_mode: str | None = None) -> Pipeline:
    """step_mode: eager, compile or cuda-graphs (step_mode.py); None: the device's default."""
    check_device(device)
    mode = StepMode.resolve(step_mode, device)
    loaded_target = load_target(target, dtype, device)
    loaded_drafter = None
    proposer = AutoregressiveProposer()
    if drafter is not None:
        loaded_drafter = load_drafter(drafter, dtype, device)
        validate_pair(loaded_target.config, loaded_drafter.config)
        proposer = drafter_proposer(loaded_drafter.model, loaded_target.model)
    generator = Generator(loaded_target.model, proposer, loaded_target.stop_ids)
    generator.set_step_mode(mode)
    pipeline = Pipeline(generator, loaded_target, loaded_drafter)
    pipeline.warm_up()
    return pipeline


def check_device(device: str) -> None:
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise DFlashError(f"unknown device {device!r} (cpu, cuda or cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DFlashError(f"device {device!r} requested but no CUDA GPU is available to torch")
