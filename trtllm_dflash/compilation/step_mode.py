"""How a decode step runs its forwards: eagerly, compiled, or compiled into CUDA graphs.

- eager: PyTorch ops one by one (the default on a CPU; every model family).
- compile: the target's cached pass (a plain step's and the verify's) and the drafter's pass go through
  `torch.compile` (whole graphs, `fullgraph=True`). Rows and tokens are symbolic from the first graph, the key
  span and the caches' sizes from their first change (automatic dynamic), so the load-time warm-up
  (`compile_step_shapes`) compiles everything a server later meets (tested): a size of 1 stays specialised
  (one row or several, one token or a block: four target graphs, two more of plain decoding's pass that
  captures no features, two drafter graphs; with the prefill's two, `dflash-build compile` stores ten; caches keep at least 2
  slots for that reason). The target's prefill is compiled too (`compile_prefill`), with symbolic rows and
  prompt length (right-padded to `PREFILL_ALIGN`): an eager admission is host-bound, its cost the same at
  any prompt length (benchmarks/results/gpu_h100_policy/RUN.md).
- cuda-graphs (the default on CUDA): `compile` in inductor's "reduce-overhead" mode, which records one
  CUDA graph per input shape and replays it: one launch per pass instead of hundreds. The running
  batch, the verify width and the key span are padded to buckets (`StepShapes`), which bounds the
  number of graphs (each recorded on its first use); rows and width start at 2 (`GRAPH_SHAPES`), so one
  target graph and one drafter graph are compiled instead of four and two; caches are static
  addresses (every replay writes them in place); tensors kept past a step are copied out of the graphs'
  memory, which the next replay reuses. Prefill is compiled as in compile mode, without CUDA graphs: prompt
  lengths vary too much for a graph each.
Compiled modes load the graphs `dflash-build compile` stored in the engine for this machine instead of compiling
them (graph_store.py, docs/compiled-engines.md); the warm-up then traces and records, and compiles nothing.
Every mode computes the same function; greedy output stays equal to the target's (tests compare the
compiled and padded steps against transformers on the CPU, where `torch.compile` runs too). The
CUDA-graph recording itself is inductor's and runs only on a GPU: not exercised on a CPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config.runtime import AUTO
from ..config.runtime import STEP_MODES as MODES
from ..utils.errors import DFlashError

# a compiled prefill's prompt length is right-padded to a multiple of this (up to the cache's positions): one
# compiled graph for every length, where inductor on CUDA would otherwise specialise on whether a size is a
# multiple of 8 (`StepShapes.align`), and no length of 1 to specialise on either
PREFILL_ALIGN = 16


def pow2_ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class StepShapes:
    """The buckets a CUDA-graph step pads to (each a power of two): rows from `min_rows` up to the generator's
    slots (padding rows are free slots, whose results are dropped), the verify width (anchor + drafts) from
    `min_width` up to the block (padding drafts are past each row's draft length, never accepted; a plain
    step's padding token is dropped after the pass), the key span from `min_span` up (keys past a row's query
    positions are never visible). Graphs: about log2(slots) x log2(block) x log2(capacity / min_span).

    min_rows = min_width = 2 (`GRAPH_SHAPES`) keeps every size of a compiled pass above 1, which torch.compile
    specialises: one target graph and one drafter graph to compile instead of four and two (one row or
    several, one token or a block), about half the warm-up. The price: a lone request steps as two rows and a
    plain step that keeps the drafter's context as two tokens per row. Plain-only requests alone step one token
    per row (`Runner.padded`: plain decoding's pass, one more target graph), since the padded plain step cost
    more than plain decoding's (benchmarks/results/gpu_h100_policy/plain_path/)."""

    min_span: int = 256  # keys
    min_rows: int = 1
    min_width: int = 1
    # cache positions per slot are a multiple of this (`capacity`), so every key span (a power of two from
    # min_span, or the whole capacity) is too: inductor on CUDA guards a graph on whether a size is a multiple
    # of 8 (16-byte alignment of bf16 rows, `is_aligned_realized_tensor` in torch/_inductor/ir.py, torch 2.11),
    # so an unaligned warm-up capacity recompiles every graph at the first aligned span; 16 covers one-byte dtypes
    align: int = 16

    def capacity(self, positions: int) -> int:
        """Cache positions per slot for a request of `positions`: rounded up to `align`."""
        return -(-positions // self.align) * self.align

    def rows(self, running: int, slots: int) -> int:
        return min(max(pow2_ceil(running), self.min_rows), slots)

    def width(self, tokens: int, block: int) -> int:
        return min(max(pow2_ceil(tokens), self.min_width), block)

    def span(self, keys: int) -> int:
        return max(pow2_ceil(keys), self.min_span)


GRAPH_SHAPES = StepShapes(min_rows=2, min_width=2)  # cuda-graphs' buckets


@dataclass(frozen=True)
class StepMode:
    """One validated choice of how steps run (see the module docstring); `resolve` applies the device's default."""

    mode: str = "eager"
    shapes: StepShapes | None = None  # padding buckets; cuda-graphs sets them (tests may set them in any mode)

    def __post_init__(self):
        if self.mode not in MODES:
            raise DFlashError(f"step mode must be one of {', '.join(MODES)} (or {AUTO}), got {self.mode!r}")
        if self.mode == "cuda-graphs" and self.shapes is None:
            object.__setattr__(self, "shapes", GRAPH_SHAPES)

    @classmethod
    def resolve(cls, mode: str | None, device: torch.device | str) -> StepMode:
        """mode None or 'auto': cuda-graphs on a CUDA device, eager elsewhere."""
        cuda = torch.device(device).type == "cuda"
        if mode in (None, AUTO):
            return cls("cuda-graphs" if cuda else "eager")
        if mode == "cuda-graphs" and not cuda:
            raise DFlashError(f"step mode cuda-graphs needs a CUDA device, got {str(device)!r} (use compile or eager)")
        return cls(mode)

    @property
    def compiled(self) -> bool:
        return self.mode != "eager"

    @property
    def graphs(self) -> bool:
        return self.mode == "cuda-graphs"

    @property
    def settle_calls(self) -> int:
        """Calls a pass makes at a new padded shape before its time is steady: under CUDA graphs two (inductor's
        cudagraph trees run a new shape once to warm it up, record its graph on the next call and replay from
        the third: `CUDAGraphTreeManager._run` in torch/_inductor/cudagraph_trees.py, torch 2.11 and 2.13),
        else one (a first call's allocations; compile mode's shapes are symbolic, so no recompilation)."""
        return 2 if self.graphs else 1

    def compile(self, module: torch.nn.Module) -> Callable:
        """module's forward(x, ctx) for cached passes: compiled in this mode."""
        return CompiledPass(module, self) if self.compiled else module

    def compile_prefill(self, module: torch.nn.Module) -> Callable:
        """module's forward(x, ctx) for prefill: compiled in compiled modes, never into CUDA graphs."""
        return CompiledPass(module, self, prefill=True) if self.compiled else module

    def prefill_length(self, longest: int, positions: int) -> int:
        """Tokens per row of a prefill whose longest prompt is `longest`, in a cache of `positions` per slot:
        compiled, right-padded to PREFILL_ALIGN (the padding writes K/V past each prompt, never read)."""
        if not self.compiled:
            return longest
        return max(longest, min(-(-longest // PREFILL_ALIGN) * PREFILL_ALIGN, positions))

    def caches(self, tensors: list[tuple[torch.Tensor, tuple[int, ...]]]) -> None:
        """Caches that compiled passes read and write in place, each with its dims that vary between allocations
        (slots, capacity): symbolic, so a new allocation (`Generator.generate` sizes one per call) compiles
        nothing; under CUDA graphs static addresses (written in place by every replay, never copied in), unguarded:
        a server's allocation after the warm-up's re-records its graphs at the new addresses instead of
        recompiling them."""
        if not self.compiled:
            return
        for t, dims in tensors:
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(t, dim)
            if self.graphs:
                torch._dynamo.mark_static_address(t, guard=False)

    def begin_step(self) -> None:
        """A new step: the graphs' outputs of the last one may be overwritten from here on."""
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()

    def keep(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """A pass's output kept past this step (deferred drafter context): copied out of graph memory."""
        return t.clone() if self.graphs and t is not None else t


# Graphs per compiled function: one row or several, one token or a block (a size of 1 is always specialised),
# and more where a pass meets a specialisation the warm-up did not (a new kind of cache, a model's own guards):
# torch's default of 8 leaves no margin, and with fullgraph=True running out of it is an error
RECOMPILE_LIMIT = 32


def compile_errors() -> tuple[type[Exception], ...]:
    """What torch.compile raises when a function cannot be compiled (imported on use: torch._dynamo takes about
    a second to import, which an eager engine never pays)."""
    from torch._dynamo import exc
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    # a branch on a tensor's value (MoE's per-expert loop where no grouped GEMM runs) is raised as the latter
    return exc.TorchDynamoException, exc.FailOnRecompileLimitHit, GuardOnDataDependentSymNode


class CompiledPass:
    """A module's cached pass (or its prefill) through torch.compile. A pass that cannot compile as one graph
    (data-dependent control flow, an op without a compiled kernel: torch's grouped GEMM compiles for bf16 only)
    runs eager from then on, with one warning line: it fails at the load-time warm-up, before any request."""

    def __init__(self, module: torch.nn.Module, mode: StepMode, prefill: bool = False):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        graphs = mode.graphs and not prefill
        if graphs:  # one CUDA graph per bucket of shapes: more than inductor warns about (50) by design
            import torch._inductor.config as inductor

            inductor.triton.cudagraph_dynamic_shape_warn_limit = None
        rotary = getattr(module, "rotary", None)
        if rotary is not None:  # its device copy of the RoPE frequencies made now: made by the first graph, it
            rotary.freqs_on(next(module.parameters()).device)  # was a dict guard that failed in the second
        for m in module.modules():  # kernel probes that a traced pass reads but cannot run (`moe.grouped_mm_ok`)
            if hasattr(m, "probe_kernels"):
                m.probe_kernels()
        self.module, self.prefill = module, prefill
        self.compiled = torch.compile(module, fullgraph=True, dynamic=None,
                                      mode="reduce-overhead" if graphs else "default")
        self.failed: str | None = None

    def __call__(self, x: torch.Tensor, ctx):
        if self.failed:
            return self.module(x, ctx)
        # rows and tokens vary from call to call: symbolic from the first graph on (a size of 1 stays
        # specialised), instead of one recompilation per new size
        for t, dims in ((x, (0, 1)), (ctx.positions, (0, 1)), (ctx.slots, (0,)), (ctx.keys, (0,)),
                        (ctx.lengths, (0,))):  # keys: a cached pass's; lengths: a prefill's
            for dim in dims if t is not None else ():
                torch._dynamo.maybe_mark_dynamic(t, dim)
        try:
            return self.compiled(x, ctx)
        except Exception as exc:  # raised while compiling, before the pass ran: nothing was written
            if not isinstance(exc, compile_errors()):
                raise
            cause = exc
            while (cause.__cause__ or cause.__context__) is not None:  # the innermost error says what failed
                cause = cause.__cause__ or cause.__context__
            self.failed = f"{type(cause).__name__}: {str(cause).strip().splitlines()[0][:300]}"
            what = f"{type(self.module).__name__} {'prefill' if self.prefill else 'pass'}"
            print(f"trtllm_dflash: warning: the {what} does not compile, it runs eager: "
                  f"{self.failed}", file=sys.stderr, flush=True)
            return self.module(x, ctx)
