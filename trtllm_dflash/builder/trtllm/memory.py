"""Per-GPU memory of a `trtllm` DFlash engine, estimated at build time from TensorRT-LLM's allocation rules.

The drafter's context (K and V of every drafter layer for every context token, in the dtype of the stored drafter
`fc` weight) is held per DFlash attention backend (ContextRules):
- a private dense arena, K and V each [max_batch_size + 1 slots, drafter layers, capacity, kv heads per rank,
  head_dim], capacity = min(max_seq_len, drafter max_position_embeddings) + max_draft_len + 1 (the +1 slot is the
  CUDA-graph padding scratch slot);
- a private paged arena, the same with capacity rounded up to 32-token pages;
- or pages of the draft KV-cache manager's pool, taken per request as sequences grow (no arena; the pool's tokens
  carry the drafter's layers too). That pool binds only when its dtype is the drafter's, so a quantized KV cache
  falls back to the paged arena.
The arena is allocated lazily on the first forward. With KV-cache estimation (the default) that is the estimation
forward, before the KV pool is sized: kv_cache_config.free_gpu_memory_fraction does not bound it; upstream budgets
it at total - 4 GiB runtime overhead - weights per rank - 6 GiB activation reserve. Estimation is skipped for a
VANILLA target attention backend (`attn_backend: VANILLA`), context parallelism (`cp_config`) and under
TRTLLM_SKIP_KV_CACHE_ESTIMATION=1; the pool then commits first and the arena's budget is (1 - fraction) x (total -
weights - overhead) x 0.7, so this plan lowers a default fraction until it fits. Sources:
tensorrt_llm/_torch/speculative/dflash.py@00679c66 (_lazy_init_ctx_buffers, _check_ctx_arena_fits,
_managed_ctx_pool) and the formulas upstream's config-time checks pin
(tests/unittest/_torch/speculative/hw_agnostic/test_dflash_config_budget.py@414ba69f: compute_dflash_ctx_buffer_bytes,
derive_dflash_ctx_memory_budget_bytes, whose worked numbers give the 4 GiB, 6 GiB and 0.7); 1.3.0rc27's rules
from NVIDIA/TensorRT-LLM@58ae162a (dflash.py, DFlashWorker._lazy_init_ctx_buffers).
The hidden-state capture buffer is [max_num_tokens, hidden_size x len(target_layer_ids)] in the model dtype
(dflash.py, DFlashSpecMetadata.__post_init__). The KV pool is the fraction of what weights, overhead, arena and
capture buffer leave; activations and CUDA graphs come out of the rest. Weights per rank are the checkpoints'
tensor bytes at the build dtype split evenly over the ranks; KV heads per rank are ceil(heads / tp).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from packaging.version import Version

from ...checkpoint.hf import tensor_specs, weight_files
from ...utils.errors import DFlashError

GIB = 1 << 30
DEFAULT_FRACTION = 0.85  # this tool's kv_cache_config.free_gpu_memory_fraction (upstream default 0.9)
MIN_FRACTION = 0.10      # below this the KV pool is too small to serve: refuse instead
PAGE_TOKENS = 32         # dflash.py: DFlashWorker._ctx_page_size
OVERHEAD = 4 * GIB       # upstream _DFLASH_BUDGET_RUNTIME_OVERHEAD_BYTES
RESERVE = 6 * GIB        # upstream _DFLASH_BUDGET_ACTIVATION_RESERVE_BYTES
SAFETY = 0.7             # upstream _DFLASH_BUDGET_SAFETY_FACTOR (pool-first budget only)
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
            "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class ContextRules:
    """How a TensorRT-LLM release holds the drafter's context, per DFlash attention backend."""

    paged: tuple[str, ...]    # backends whose private arena is paged
    managed: tuple[str, ...]  # backends that take pages from the draft KV pool instead
    budget_checked: bool      # the release refuses an oversized arena at start (validate_dflash_ctx_buffer_budget)


RULES_1_3 = ContextRules(paged=("TRTLLM", "FA4"), managed=(), budget_checked=False)  # @58ae162a
RULES_1_4 = ContextRules(paged=("TRTLLM",), managed=("TRTLLM",), budget_checked=True)  # @00679c66, @414ba69f


def context_rules(version: str) -> ContextRules:
    return RULES_1_4 if Version(version) >= Version("1.4.0rc1") else RULES_1_3


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
    itemsize: int                # model dtype
    drafter_itemsize: int        # the stored drafter fc weight's dtype: the context's
    budget_gib: float
    rules: ContextRules = RULES_1_4
    arena_first: bool = True     # KV-cache estimation runs (upstream default)
    fraction: float | None = None  # kv_cache_config.free_gpu_memory_fraction set by the user; None: chosen here
    skip_budget_check: bool = False  # speculative_config.skip_ctx_buffer_budget_check

    @property
    def managed(self) -> bool:
        """The drafter's context takes draft KV-pool pages (the pool binds only at the drafter's dtype)."""
        return self.attention_backend in self.rules.managed and self.kv_itemsize == self.drafter_itemsize


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU; `fraction` is what the engine's options write; `arena` is the private arena reserved."""

    weights: int
    arena: int
    arena_budget: int
    placement: str
    capture: int
    kv_bytes_per_token: int
    budget: int
    fraction: float
    kv_pool: int
    kv_tokens: int
    warning: str = ""

    def summary(self) -> str:
        g = lambda n: f"{n / GIB:.2f} GiB"  # noqa: E731
        return (f"memory per GPU (estimate): weights {g(self.weights)}, DFlash context {g(self.arena)} "
                f"({self.placement}), hidden-state capture {g(self.capture)}, KV pool {self.fraction:.2f} of the rest "
                f"= {g(self.kv_pool)} (~{self.kv_tokens} tokens), budget {g(self.budget)}")

    def to_dict(self) -> dict:
        return {**asdict(self), "summary": self.summary()}


def ctx_arena_bytes(m: MemoryInputs, paged: bool) -> int:
    """A private arena's bytes per GPU (upstream compute_dflash_ctx_buffer_bytes)."""
    capacity = min(m.max_seq_len, m.drafter_max_positions) + m.max_draft_len + 1
    if paged:
        capacity = math.ceil(capacity / PAGE_TOKENS) * PAGE_TOKENS
    heads = math.ceil(m.drafter_kv_heads / m.tp)
    return (m.max_batch_size + 1) * m.drafter_layers * capacity * 2 * heads * m.drafter_head_dim * m.drafter_itemsize


def arena_budget_bytes(total: int, weights: int, fraction: float, arena_first: bool) -> int:
    """What upstream lets the arena have (derive_dflash_ctx_memory_budget_bytes)."""
    if arena_first:
        return max(0, total - OVERHEAD - weights - RESERVE)
    return max(0, int((total - weights - OVERHEAD) * (1 - fraction) * SAFETY))


def kv_bytes_per_token(m: MemoryInputs) -> int:
    target = m.target_kv_layers * 2 * math.ceil(m.target_kv_heads / m.tp) * m.target_head_dim * m.kv_itemsize
    drafter = m.drafter_layers * 2 * math.ceil(m.drafter_kv_heads / m.tp) * m.drafter_head_dim * m.drafter_itemsize
    return math.ceil(target + (drafter if m.managed else 0))


def plan_memory(m: MemoryInputs) -> MemoryPlan:
    """Raise when the weights, or an arena TensorRT-LLM would refuse, do not fit the budget; -> the plan."""
    weights, total = math.ceil(m.weight_bytes / m.tp), int(m.budget_gib * GIB)
    if weights + OVERHEAD >= total:
        raise DFlashError(f"weights {weights / GIB:.2f} GiB + {OVERHEAD // GIB} GiB runtime overhead per GPU exceed "
                          f"the {m.budget_gib:g} GiB budget: raise --tp, quantize (--quant), or set --gpu-memory-gib")
    checked = ctx_arena_bytes(m, m.attention_backend in m.rules.paged)  # the fallback, when managed
    arena = 0 if m.managed else checked
    capture = m.max_num_tokens * m.hidden_size * m.num_capture_layers * m.itemsize
    fraction = m.fraction if m.fraction is not None else pool_first_fraction(m, checked, total, weights)
    budget = arena_budget_bytes(total, weights, fraction, m.arena_first)
    warning = check_arena(m, checked, budget)
    free = total - weights - OVERHEAD - capture - (arena if m.arena_first else 0)
    if free <= 0 or weights + OVERHEAD + arena + capture > total:
        raise DFlashError(f"weights {weights / GIB:.2f} GiB + DFlash context arena {arena / GIB:.2f} GiB + capture "
                          f"buffer {capture / GIB:.2f} GiB + {OVERHEAD // GIB} GiB runtime overhead per GPU exceed the "
                          f"{m.budget_gib:g} GiB budget: lower --max-seq-len or --max-batch-size, raise --tp, or set "
                          "--gpu-memory-gib")
    pool, per_token = int(fraction * free), kv_bytes_per_token(m)
    return MemoryPlan(weights, arena, budget, placement(m), capture, per_token, total, fraction, pool,
                      pool // per_token, warning)


def pool_first_fraction(m: MemoryInputs, arena: int, total: int, weights: int) -> float:
    """The default fraction, lowered when the pool commits first and would leave the arena too little."""
    if m.arena_first or m.managed:
        return DEFAULT_FRACTION
    fits = math.floor((1 - arena / ((total - weights - OVERHEAD) * SAFETY)) * 100) / 100
    fraction = min(DEFAULT_FRACTION, fits)
    if fraction < MIN_FRACTION:
        raise DFlashError(f"the DFlash context arena ({arena / GIB:.2f} GiB per GPU, dense in max_seq_len "
                          f"{m.max_seq_len} x {m.max_batch_size + 1} slots) comes after the KV pool here and leaves "
                          f"less than {MIN_FRACTION:.0%} of free memory for it: lower --max-seq-len or "
                          "--max-batch-size, or raise --tp")
    return fraction


def check_arena(m: MemoryInputs, arena: int, budget: int) -> str:
    """Upstream's arena check: a refusal naming the largest max_batch_size that fits, or a warning where upstream
    only warns (a managed pool, a release without the check, skip_ctx_buffer_budget_check)."""
    if arena <= budget:
        return ""
    per_slot = arena // (m.max_batch_size + 1)
    fitting = max(0, budget // per_slot - 1)
    when = "before the KV pool is sized" if m.arena_first else "after the KV pool commits"
    text = (f"the DFlash context arena needs {arena / GIB:.2f} GiB per GPU (max_batch_size + 1 = "
            f"{m.max_batch_size + 1} slots, dense in max_seq_len {m.max_seq_len}) but TensorRT-LLM budgets "
            f"{budget / GIB:.2f} GiB for it {when}: lower --max-batch-size to {fitting} or lower --max-seq-len, "
            "raise --tp, or set --gpu-memory-gib")
    if m.managed:
        return f"{text} (the TRTLLM backend normally takes draft KV-pool pages; this is its fallback arena)"
    if not m.rules.budget_checked or m.skip_budget_check:
        return text
    raise DFlashError(text)


def placement(m: MemoryInputs) -> str:
    if m.managed:
        return "pages of the draft KV pool"
    return "allocated before the KV pool" if m.arena_first else "allocated after the KV pool"


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
