"""The `trtllm` backend behind builder/backend.py's interface: engine.py writes the directory, verify.py
re-checks it; the spec's trtllm settings are checked here, against the chosen release's field table."""

from __future__ import annotations

from pathlib import Path

from ...config.manifest import Manifest
from ...config.model import DrafterConfig
from ...utils.errors import DFlashError
from ..backend import Backend
from ..plan import BuildPlan
from ..spec import BuildSpec, check_choice, check_positive_int
from ..verify import checked
from .dflash2 import refuse_dflash2
from .engine import write_trtllm_engine
from .fields import literal_choices
from .options import ATTENTION_BACKENDS, GPU_SM, KV_CACHE_DTYPES, check_pass_through
from .reuse import check_prefix_reuse
from .targets import TrtllmTarget
from .verify import check_trtllm

# TensorRT-LLM's DFlash context arena is dense in max_seq_len (memory.py): the default stays at most this
TRTLLM_DEFAULT_MAX_SEQ_LEN = 8192


class TrtllmBackend(Backend):
    def check_spec(self, spec: BuildSpec) -> None:
        if spec.trtllm_version is not None and (not isinstance(spec.trtllm_version, str) or not spec.trtllm_version):
            raise DFlashError(f"build spec: 'trtllm_version' must be a version string, got {spec.trtllm_version!r}")
        table = spec.trtllm_table
        if spec.gpu is not None:
            check_choice("gpu", spec.gpu, tuple(GPU_SM))
        if spec.dflash_attention_backend is not None:
            check_choice("dflash_attention_backend", spec.dflash_attention_backend, ATTENTION_BACKENDS)
        if spec.moe_backend is not None:
            check_choice("moe_backend", spec.moe_backend, literal_choices(table, "MoeConfig", "backend"))
        check_prefix_reuse(spec.prefix_reuse, table)
        check_choice("kv_cache_dtype", spec.kv_cache_dtype, tuple(KV_CACHE_DTYPES))
        for name in ("rejection_sampling", "chunked_prefill"):  # YAML `"no"` is a string, not false
            if not isinstance(getattr(spec, name), bool):
                raise DFlashError(f"build spec: '{name}' must be true or false, got {getattr(spec, name)!r}")
        if spec.draft_len_schedule is not None and (not isinstance(spec.draft_len_schedule, str)
                                                    or not spec.draft_len_schedule):
            raise DFlashError(f"build spec: 'draft_len_schedule' must be a file path, got {spec.draft_len_schedule!r}")
        gib = spec.gpu_memory_gib
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or gib <= 0:
            raise DFlashError(f"build spec: 'gpu_memory_gib' must be a positive number, got {gib!r}")
        check_graph_batch_sizes(spec.cuda_graph_batch_sizes, spec.max_batch_size)
        check_pass_through(spec.llm_options)

    def read_target(self, data: dict, source: str) -> TrtllmTarget:
        """What TensorRT-LLM's DFlash runs (targets.py), not the torch runtime's model list."""
        return TrtllmTarget.from_dict(data, source)

    def default_max_seq_len(self, target: TrtllmTarget, drafter: DrafterConfig) -> int:
        return min(target.max_position_embeddings, drafter.max_position_embeddings, TRTLLM_DEFAULT_MAX_SEQ_LEN)

    def check_plan(self, plan: BuildPlan) -> None:
        refuse_dflash2(plan.drafter)
        plan.target.check_tp(plan.spec.tp)

    def write(self, plan: BuildPlan, tmp: Path) -> dict:
        return write_trtllm_engine(plan, tmp)

    def verify(self, engine_dir: Path, manifest: Manifest) -> tuple[list[str], list[str]]:
        return checked(lambda: check_trtllm(engine_dir, manifest))

    def inspect_lines(self, engine_dir: Path) -> list[str]:
        return []


def check_graph_batch_sizes(sizes, max_batch_size: int) -> None:
    if sizes is None:
        return
    if not isinstance(sizes, list) or not sizes:
        raise DFlashError(f"build spec: 'cuda_graph_batch_sizes' must be a list of batch sizes, got {sizes!r}")
    for size in sizes:
        check_positive_int("cuda_graph_batch_sizes", size)
    if max(sizes) > max_batch_size:
        raise DFlashError(f"build spec: cuda_graph_batch_sizes {sizes} go above max_batch_size {max_batch_size}")


BACKEND = TrtllmBackend()
