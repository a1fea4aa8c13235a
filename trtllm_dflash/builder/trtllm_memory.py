"""Per-GPU memory of a `trtllm` DFlash engine, estimated at build time from TensorRT-LLM's allocation rules.

Rules (NVIDIA/TensorRT-LLM@58ae162a):
- The KV-cache pool takes `kv_cache_config.free_gpu_memory_fraction` of the memory free once the model is loaded
  (tensorrt_llm/llmapi/llm_args.py, KvCacheConfig.free_gpu_memory_fraction).
- DFlash's draft-context arena is allocated lazily on the first forward, after the pool
  (tensorrt_llm/_torch/speculative/dflash.py, DFlashWorker._lazy_init_ctx_buffers), dense in max_seq_len:
      slots    = max_batch_size + 1                    (one scratch slot for CUDA-graph padding)
      context  = min(max_seq_len, drafter max_position_embeddings)
      capacity = context + max_draft_len + 1           (+ the draft block)
      VANILLA: K and V, each [slots, drafter layers, capacity, kv heads per rank, head_dim]
      TRTLLM/FA4: [drafter layers, slots * ceil(capacity / 32), K/V, kv heads per rank, 32, head_dim]
  in the drafter's weight dtype. The fraction does not bound it, so this plan lowers the fraction until the
  arena fits beside the share the default fraction leaves for activations.
- The hidden-state capture buffer: [max_num_tokens, hidden_size * len(target_layer_ids)] in the model dtype
  (dflash.py, DFlashSpecMetadata.__post_init__).
Weights per rank are the checkpoint's tensor bytes (at the build dtype) split evenly over the ranks; KV heads
per rank are ceil(heads / tp) (replicated when fewer than ranks). Activations and CUDA graphs are not modelled:
they come out of the share outside the pool.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..checkpoint import tensor_specs, weight_files
from ..errors import DFlashError

GIB = 1 << 30
DEFAULT_FRACTION = 0.85  # this tool's kv_cache_config.free_gpu_memory_fraction (upstream default 0.9)
MIN_FRACTION = 0.10      # below this the KV pool is too small to serve: refuse instead
PAGE_TOKENS = 32         # dflash.py: DFlashWorker._ctx_page_size
PAGED_BACKENDS = ("TRTLLM", "FA4")
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
            "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class MemoryInputs:
    """Shapes and settings, per engine (not per rank)."""

    tp: int
    max_batch_size: int
    max_seq_len: int
    max_num_tokens: int
    max_draft_len: int
    attention_backend: str
    weight_bytes: int            # target + drafter, all ranks together
    target_kv_layers: int
    target_kv_heads: int
    target_head_dim: int
    kv_itemsize: float           # bytes per KV element (fp8: 1, nvfp4: 0.5 + one fp8 scale per 16)
    hidden_size: int
    num_capture_layers: int
    drafter_layers: int
    drafter_kv_heads: int
    drafter_head_dim: int
    drafter_max_positions: int
    itemsize: int                # model and drafter dtype
    budget_gib: float
    fraction: float | None = None  # kv_cache_config.free_gpu_memory_fraction set by the user; None: chosen here


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU; `fraction` is what the engine's options write."""

    weights: int
    arena: int
    capture: int
    kv_bytes_per_token: int
    budget: int
    fraction: float
    kv_pool: int
    kv_tokens: int
    warning: str = ""

    def summary(self) -> str:
        g = lambda n: f"{n / GIB:.2f} GiB"  # noqa: E731
        return (f"memory per GPU (estimate): weights {g(self.weights)}, DFlash context arena {g(self.arena)}, "
                f"hidden-state capture {g(self.capture)}, KV pool {self.fraction:.2f} x {g(self.budget - self.weights)}"
                f" = {g(self.kv_pool)} (~{self.kv_tokens} tokens), budget {g(self.budget)}")

    def to_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary()}


def arena_bytes(m: MemoryInputs) -> int:
    capacity = min(m.max_seq_len, m.drafter_max_positions) + m.max_draft_len + 1
    if m.attention_backend in PAGED_BACKENDS:
        capacity = math.ceil(capacity / PAGE_TOKENS) * PAGE_TOKENS
    heads = math.ceil(m.drafter_kv_heads / m.tp)
    return (m.max_batch_size + 1) * m.drafter_layers * capacity * 2 * heads * m.drafter_head_dim * m.itemsize


def plan_memory(m: MemoryInputs) -> MemoryPlan:
    """Raise when weights and the dense arena exceed the budget or leave too little for the KV pool."""
    weights = math.ceil(m.weight_bytes / m.tp)
    arena = arena_bytes(m)
    capture = m.max_num_tokens * m.hidden_size * m.num_capture_layers * m.itemsize
    budget = int(m.budget_gib * GIB)
    free = budget - weights
    if weights + arena + capture > budget:
        raise DFlashError(f"weights {weights / GIB:.2f} GiB + DFlash context arena {arena / GIB:.2f} GiB + capture "
                          f"buffer {capture / GIB:.2f} GiB per GPU exceed the {m.budget_gib:g} GiB budget: lower "
                          f"--max-seq-len or --max-batch-size, raise --tp, or set --gpu-memory-gib")
    after_pool = arena + capture
    warning = ""
    if m.fraction is None:
        fraction = math.floor((DEFAULT_FRACTION - after_pool / free) * 100) / 100
        if fraction < MIN_FRACTION:
            raise DFlashError(f"the DFlash context arena ({arena / GIB:.2f} GiB per GPU, dense in max_seq_len "
                              f"{m.max_seq_len} x {m.max_batch_size + 1} slots) leaves less than {MIN_FRACTION:.0%} of "
                              f"free memory for the KV cache: lower --max-seq-len or --max-batch-size, or raise --tp")
    else:
        fraction = m.fraction
        if (1 - fraction) * free < after_pool:
            warning = (f"kv_cache_config.free_gpu_memory_fraction {fraction} leaves {(1 - fraction) * free / GIB:.2f} "
                       f"GiB outside the KV pool, less than the DFlash arena and capture buffer "
                       f"({after_pool / GIB:.2f} GiB) allocated after it: expect out-of-memory at the first request")
    kv_per_token = math.ceil(m.target_kv_layers * 2 * math.ceil(m.target_kv_heads / m.tp) * m.target_head_dim
                             * m.kv_itemsize)
    pool = int(fraction * free)
    return MemoryPlan(weights, arena, capture, kv_per_token, budget, fraction, pool, pool // kv_per_token, warning)


def checkpoint_bytes(model_dir, float_itemsize: float, linear_itemsize: float | None = None,
                     exclude: tuple[str, ...] = ()) -> int:
    """Tensor bytes of a checkpoint once loaded: floating tensors at `float_itemsize`, others as stored.
    `linear_itemsize`: the quantized size of 2-D weights other than embeddings and the LM head (which
    Model Optimizer leaves unquantized by default). `exclude`: tensors the engine does not load (a speculators
    drafter's copies of its verifier's embedding and head)."""
    total = 0
    for path in weight_files(model_dir):
        for name, (dtype, shape) in tensor_specs(path).items():
            if name in exclude:
                continue
            size = float_itemsize if dtype in FLOAT_DTYPES else ITEMSIZE.get(dtype, 1)
            if linear_itemsize and dtype in FLOAT_DTYPES and len(shape) == 2 and not _unquantized(name):
                size = linear_itemsize
            total += math.ceil(math.prod(shape) * size)
    return total


def _unquantized(name: str) -> bool:
    return "embed" in name or "lm_head" in name
