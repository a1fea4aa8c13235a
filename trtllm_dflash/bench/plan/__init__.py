"""`dflash-bench plan`: DFlash's throughput at fixed interactivity on hardware not at hand, projected from
NVIDIA AIConfigurator's per-op silicon measurements (TensorRT-LLM) and this toolkit's model of a DFlash step.

inputs (PlanSpec, the drafter, the acceptance profile) -> aic (database, target model, plain estimate, op
queries) -> step (one DFlash step's cost) + memory (what DFlash adds per GPU) -> search (grid, frontiers, best
configuration, schedules) -> outputs (plan.json, points.csv, frontier.png, schedule files).
"""

from __future__ import annotations

import time
from pathlib import Path

from . import aic
from .eagle3 import read_eagle3
from .inputs import PlanSpec, acceptance_profile, eagle3_profile, read_drafter, target_id
from .outputs import build_command, frontier_entry, method, schedule_name, write_all
from .search import Grid, best_at, frontier, layout_points, schedule_for

FORMAT = "dflash-plan/1"
# aic: performance_result.py PerformanceResult.source
SOURCES_NOTE = ("op -> AIConfigurator's data source where it is not 'silicon' (its measured tables, interpolated "
                "between their rows): 'empirical' is its formula fallback where no table covers the op or shape, "
                "'sol' a speed-of-light estimate, 'estimated' modelled from measured parts, 'mixed' a sum of parts "
                "from different sources")
MODEL_NOTES = (
    ("plain: AIConfigurator's static estimate (run_static mode 'static'); dflash: the same prefill, then steps of "
    "verify (the target's decode ops at b(k+1) queries; attention per --verify-attention) + drafter block pass + context-KV projection + sampling, "
    "each op from the same database; tokens per step from the acceptance profile"),
    "not modelled: scheduler and CUDA-graph overheads beyond AIConfigurator's, in-flight batching with prefill mixed "
    "in (static batches: AIConfigurator's run_agg takes no drafter step; docs/benchmarking.md)",
)


def make_plan(spec: PlanSpec) -> tuple[dict, list[dict], dict]:
    """(plan.json's object, every grid point, {tp: DraftLenSchedule}) for `spec`."""
    started = time.monotonic()
    drafter, drafter_source, dflash2 = read_drafter(spec.drafter)
    profile = acceptance_profile(spec, drafter)
    database = aic.open_database(spec.gpu, spec.backend_version)
    eagle3, eagle3_acc = (read_eagle3(spec.eagle3), eagle3_profile(spec)) if spec.eagle3 else (None, None)
    grid = Grid(target_id(spec.target), drafter, database, profile, spec.gpus, spec.tp_sizes(), spec.batches,
                spec.isl, spec.osl, spec.verify_attention, eagle3, eagle3_acc,
                min(spec.eagle3_max_draft_len, len(eagle3_acc.per_position)) if eagle3_acc else 0, dflash2)
    methods = ("plain", "dflash", "eagle3") if eagle3 else ("plain", "dflash")
    points = [p for tp in grid.tp_sizes for p in layout_points(grid, tp)]
    schedules: dict = {}
    rows = [table_row(spec, points, level, schedules, f"dflash-bench plan: {database.label}, acceptance "
                      f"{profile.source}") for level in spec.interactivity]
    plan = {
        "format": FORMAT,
        "inputs": inputs_record(spec, grid, drafter_source),
        "provenance": {**provenance(database, profile, points),
                       "eagle3_acceptance": eagle3_acc.source if eagle3_acc else None},
        "frontier": {name: [frontier_entry(p) for p in frontier([p for p in points if method(p) == name])]
                     for name in methods},
        "at_interactivity": rows,
        "draft_len_schedules": {str(tp): s.as_option() if s else None for tp, s in sorted(schedules.items())},
        "points": len(points),
        "run_seconds": round(time.monotonic() - started, 2),
    }
    return plan, points, {tp: s for tp, s in schedules.items() if s}


def inputs_record(spec: PlanSpec, grid: Grid, drafter_source: str) -> dict:
    """plan.json's `inputs`: the flags as resolved, the drafters' shapes and the acceptance planned with."""
    d, d2, e3, profile = grid.drafter, grid.dflash2, grid.eagle3, grid.profile
    eagle3 = None if e3 is None else {**vars(e3), "max_draft_len": grid.eagle3_max_draft_len,
                                      "acceptance_per_position": [round(a, 4) for a in grid.eagle3_profile.per_position]}
    return {**spec.to_dict(), "target_model": grid.target, "drafter_config": drafter_source,
            "drafter_shape": {"method": "dflash2" if d2 else "dflash", "layers": d.num_hidden_layers,
                              "hidden_size": d.hidden_size, "block_size": d.block_size,
                              "target_layer_ids": list(d.target_layer_ids), "dflash2": vars(d2) if d2 else None},
            "acceptance_per_position": [round(a, 4) for a in profile.per_position],
            "acceptance_observations": list(profile.observations) if profile.observations else None,
            "max_draft_len": grid.max_draft_len, "eagle3_shape": eagle3}


def table_row(spec: PlanSpec, points: list[dict], level: float, schedules: dict, source: str) -> dict:
    """The best plain and DFlash configurations at or above `level` tok/s/user; fills `schedules` per winning TP."""
    best_plain = best_at([p for p in points if method(p) == "plain"], level)
    best_dflash = best_at([p for p in points if method(p) == "dflash"], level)
    config = None
    if best_dflash:
        tp = best_dflash["tp"]
        if tp not in schedules:
            schedules[tp] = schedule_for(points, tp, source)
        config = {**_config(best_dflash), "draft_len_schedule": schedule_name(tp) if schedules[tp] else None,
                  "build_command": build_command(spec, best_dflash, schedules[tp], Path(spec.output or "."))}
    ratio = best_dflash["tok_s_gpu"] / best_plain["tok_s_gpu"] if best_plain and best_dflash else None
    row = {"tok_s_user": level, "plain_tok_s_gpu": _round(best_plain and best_plain["tok_s_gpu"]),
           "dflash_tok_s_gpu": _round(best_dflash and best_dflash["tok_s_gpu"]), "ratio": _round(ratio),
           "config": config, "plain_config": _config(best_plain) if best_plain else None}
    eagle3 = [p for p in points if method(p) == "eagle3"]
    if eagle3:
        best = best_at(eagle3, level)
        row.update(eagle3_tok_s_gpu=_round(best and best["tok_s_gpu"]), eagle3_config=_config(best) if best else None,
                   dflash_over_eagle3=_round(best_dflash["tok_s_gpu"] / best["tok_s_gpu"]) if best and best_dflash
                   else None)
    return row


def provenance(database: aic.Database, profile, points: list[dict]) -> dict:
    flagged = {name: src for p in points for name, src in (p.get("flagged_ops") or {}).items()}
    return {"database": database.label, "system": database.system, "backend": aic.BACKEND,
            "backend_version": database.version, "requested_version": database.requested,
            "acceptance": profile.source, "model": list(MODEL_NOTES),
            "ops_not_silicon": dict(sorted(flagged.items())), "ops_not_silicon_note": SOURCES_NOTE}


def run_plan(spec: PlanSpec) -> tuple[dict, list[Path]]:
    plan, points, schedules = make_plan(spec)
    paths = write_all(Path(spec.output), plan, points, schedules) if spec.output else []
    return plan, paths


def _config(p: dict) -> dict:
    keys = ("tp", "replicas", "batch", "draft_len", "tok_s_user", "tok_s_gpu", "tpot_ms", "ttft_ms",
            "tokens_per_step", "step_ms", "memory_gib")
    return {k: _round(p[k]) for k in keys if k in p}


def _round(v):
    return round(v, 3) if isinstance(v, float) else v
