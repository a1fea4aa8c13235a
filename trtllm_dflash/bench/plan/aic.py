"""The AIConfigurator adapter: its silicon database, its target models, its plain-decoding estimate and op queries.

Every call here is aiconfigurator-core 0.12.0's SDK (ai-dynamo/aiconfigurator, package aiconfigurator_core/sdk),
the path its `cli_estimate(mode="static")` takes (src/aiconfigurator/cli/api.py): resolve_query_version -> get_database_view(SILICON) -> build_model_config ->
resolve_context_fmha_by_data / resolve_nvfp4_for_system -> get_model -> get_backend("trtllm").run_static ->
get_result_dict. Its facts that this module encodes, each with the file it is read from, are marked `aic:`.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...utils.errors import DFlashError

BACKEND = "trtllm"
INSTALL_HINT = "dflash-bench plan needs AIConfigurator: pip install '.[plan]' (aiconfigurator-core>=0.12)"
GPU_ALIASES = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "b300": "b300_sxm"}


def sdk():
    """aiconfigurator_core.sdk's modules, imported on first use (the extra is optional)."""
    try:
        from aiconfigurator_core.sdk import common, config_builders, models, operations, perf_database
        from aiconfigurator_core.sdk.backends.factory import get_backend
        from aiconfigurator_core.sdk.config import RuntimeConfig
        from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json
    except ImportError:
        raise DFlashError(INSTALL_HINT) from None
    # aic: its loaders log every low-fidelity fallback table at WARNING; the plan reports sources per op itself
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return _Sdk(common, config_builders, models, operations, perf_database, get_backend, RuntimeConfig,
                EngineHandle, build_ops_json)


@dataclass(frozen=True)
class _Sdk:
    common: Any
    config_builders: Any
    models: Any
    ops: Any
    perf_database: Any
    get_backend: Any
    RuntimeConfig: Any
    EngineHandle: Any
    build_ops_json: Any


@dataclass(eq=False)  # hashed by identity: a cache key of per-database answers
class Database:
    """One system's silicon tables at one TensorRT-LLM version, and an op-level handle over them."""

    system: str
    version: str          # as resolved (an alias such as "current" becomes the slot's version)
    requested: str
    db: Any
    handle: Any           # EngineHandle.for_database: ad-hoc op lists (engine.py, EngineHandle.for_database)
    capacity_gib: float   # memory per GPU (systems/<system>.yaml gpu.mem_capacity, bytes)

    @property
    def label(self) -> str:
        return f"aiconfigurator-core SILICON {self.system} {BACKEND} {self.version}"


def known_systems() -> list[str]:
    """Systems with a spec and TensorRT-LLM data: aic: systems/<system>.yaml beside systems/data/<system>/<op>/
    trtllm/ (perf_database.py get_systems_paths; its get_supported_databases parses every YAML: seconds)."""
    roots = [Path(p) for p in sdk().perf_database.get_systems_paths()]
    return sorted({spec.stem for root in roots for spec in root.glob("*.yaml")
                   if any((root / "data" / spec.stem).glob(f"*/{BACKEND}"))})


def system_name(gpu: str) -> str:
    """An AIConfigurator system with TensorRT-LLM data for `gpu` (h100 | h100_sxm | b300 | gb200 ...)."""
    name = GPU_ALIASES.get(gpu.lower(), gpu.lower())
    known = known_systems()
    if name not in known:
        raise DFlashError(f"--gpu {gpu!r}: AIConfigurator has no {BACKEND} data for it (known: {', '.join(known)})")
    return name


def open_database(gpu: str, version: str) -> Database:
    """aic: perf_database.py resolve_query_version (aliases current/previous/next; other versions outside the
    slots of systems/query_versions.yaml are refused) then get_database_view(database_mode="SILICON")."""
    s = sdk()
    system = system_name(gpu)
    try:
        resolved = s.perf_database.resolve_query_version(system, BACKEND, version)
    except ValueError as exc:
        raise DFlashError(f"--backend-version {version!r}: {exc}") from None
    db = s.perf_database.get_database_view(system, BACKEND, resolved, database_mode="SILICON")
    if db is None:
        raise DFlashError(f"AIConfigurator has no {BACKEND} {resolved} database for {system}")
    capacity = db.system_spec["gpu"]["mem_capacity"] / (1 << 30)
    return Database(system, resolved, version, db, s.EngineHandle.for_database(db), capacity)


@dataclass
class TargetModel:
    """AIConfigurator's model of the target at one TP layout (a fresh object per layout, see `build_target`)."""

    model_id: str
    tp: int
    model: Any
    is_moe: bool
    facts: dict = field(default_factory=dict)  # hidden, vocab, layers: what the drafter's op shapes need


def build_target(model_id: str, tp: int, database: Database) -> TargetModel:
    """aic: config_builders.build_model_config(tp, pp, attention_dp, moe_tp, moe_ep); the estimate path's
    resolve_context_fmha_by_data, resolve_dsv4_moe_arch, resolve_nvfp4_for_system (ai-dynamo/aiconfigurator
    src/aiconfigurator/cli/api.py, _run_static_estimate, which core 0.12.0's SDK serves); models.get_model.
    MoE experts are split by expert parallelism (moe_tp 1, moe_ep tp): gpt-oss's MXFP4 MoE (w4a16_mxfp4) has
    silicon data only for that split (other splits raise PerfDataNotAvailableError)."""
    s = sdk()
    try:
        is_moe = bool(s.models.check_is_moe(model_id))
        mc = s.config_builders.build_model_config(tp, 1, 1, 1 if is_moe else tp, tp if is_moe else 1)
        mc.fmha_quant_mode = context_fmha(model_id, database)
        s.models.resolve_dsv4_moe_arch(mc, model_id, system_name=database.system, backend_name=BACKEND)
        s.models.resolve_nvfp4_for_system(mc, database.system, model_id, backend_name=BACKEND)
        model = s.models.get_model(model_id, mc, BACKEND)
    except (AssertionError, ValueError, KeyError, OSError) as exc:
        raise DFlashError(f"target {model_id!r} at TP {tp}: AIConfigurator cannot model it ({exc})") from None
    # aic: models/base.py BaseModel.__init__ keeps the shapes as _hidden_size, _vocab_size, _num_layers
    facts = {"hidden_size": model._hidden_size, "vocab_size": model._vocab_size, "num_layers": model._num_layers}
    return TargetModel(model_id, tp, model, is_moe, facts)


@functools.cache
def _context_fmha(model_id: str, database: Database):
    s = sdk()
    probe = s.config_builders.build_model_config(1, 1, 1, 1, 1)
    s.models.resolve_context_fmha_by_data(probe, model_id, database.db, BACKEND, is_context_role=True)
    return probe.fmha_quant_mode


def context_fmha(model_id: str, database: Database):
    """aic: models/helpers.py resolve_context_fmha_by_data: the context FMHA mode the database has data for. It
    depends on the model and the database, not the layout, and costs seconds (it reads the version slots'
    YAML): resolved once per model and database."""
    return _context_fmha(model_id, database)


@dataclass(frozen=True)
class PlainEstimate:
    """AIConfigurator's static estimate of plain decoding at one batch (inference_summary.get_result_dict)."""

    batch: int
    tpot_ms: float
    ttft_ms: float
    tok_s_user: float
    tok_s_gpu: float
    memory_gib: float
    oom: bool
    sources: dict  # op name -> data source (silicon | mixed | empirical | ...), generation phase


def plain_estimate(target: TargetModel, database: Database, batch: int, isl: int, osl: int) -> PlainEstimate:
    """aic: backends/base_backend.py run_static(mode "static"): prefill of the whole batch, then osl - 1 decode
    steps; tpot = generation latency / (osl - 1), tokens/s/gpu = batch x osl / request latency / tp.
    A fresh backend per call: the backend object caches results by shape, not by model."""
    s = sdk()
    summary = s.get_backend(BACKEND).run_static(target.model, database.db,
                                                s.RuntimeConfig(batch_size=batch, isl=isl, osl=osl), "static")
    r = summary.get_result_dict()
    return PlainEstimate(batch, r["tpot"], r["ttft"], r["tokens/s/user"], r["tokens/s/gpu"], r["memory"],
                         bool(summary.check_oom()), dict(summary.get_generation_source_dict() or {}))


@dataclass(frozen=True)
class DecodeStep:
    """The target's mean decode step over `queries` decode queries, ms; `attention_ms` is its attention ops' share."""

    queries: int
    total_ms: float
    attention_ms: float
    sources: dict


def decode_step(target: TargetModel, database: Database, queries: int, isl: int, osl: int) -> DecodeStep:
    """Mean decode-step latency of the target over `queries` decode queries at once, over the contexts isl .. isl +
    osl: run_static(mode "static_gen") at batch `queries`, its generation latency / (osl - 1). A verify of k + 1
    tokens for each of b requests is b(k + 1) decode queries, AIConfigurator's own modelling of MTP's verify
    (rust_engine_step.py: "the (nextn + 1) decode-batch scaling") without its (L + nextn) / L MTP-layer compute
    factor (models/helpers.py mtp_scale_factor): a DFlash drafter is not an MTP layer and is costed apart."""
    s = sdk()
    summary = s.get_backend(BACKEND).run_static(target.model, database.db,
                                                s.RuntimeConfig(batch_size=queries, isl=isl, osl=osl), "static_gen")
    r, per_op = summary.get_result_dict(), summary.get_generation_latency_dict()
    attention = sum(ms for name, ms in per_op.items() if "attention" in name) / (osl - 1)
    return DecodeStep(queries, r["tpot"], attention, dict(summary.get_generation_source_dict() or {}))


def evaluate_ops(database: Database, ops: list, tokens: int, s_ctx: int) -> list[tuple[str, float, str]]:
    """[(op name, ms, source)] of an op list at decode shape: `tokens` rows, attention over `s_ctx` keys.
    aic: engine.py EngineHandle.evaluate_ops_json(is_context=False, batch_size, s): generation-phase shapes,
    GEMM rows = batch_size."""
    if tokens <= 0 or not ops:
        return [(op._name, 0.0, "none") for op in ops]
    out = database.handle.evaluate_ops_json(sdk().build_ops_json(ops), is_context=False,
                                            batch_size=math.ceil(tokens), s=int(s_ctx))
    return [(name, float(ms), source) for name, ms, _energy, source in out]
