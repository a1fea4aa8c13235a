"""The grid of configurations (TP, batch, draft length), its frontiers, the best one at each interactivity, and
the draft-length schedule of a TP layout.

A configuration is TP t with gpus / t replicas, each running `batch` requests; per-GPU throughput is a replica's
output tokens per second over its t GPUs (as AIConfigurator's tokens/s/gpu), interactivity is 1000 / TPOT (ms).
For DFlash, TPOT = step latency / E[tokens per step], and a request lasts TTFT + TPOT x (osl - 1), the static
form AIConfigurator's run_static uses for plain decoding (backends/base_backend.py, run_static), so k = 0 is its
plain estimate exactly. The best configuration at an interactivity floor is read from the grid's points, not
interpolated between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...draft_length.schedule import DraftLenSchedule
from ..frontier import pareto_frontier
from . import aic
from .acceptance import AcceptanceProfile
from .memory import dflash_extra_gib
from .dflash2 import Dflash2Shape
from .eagle3 import Eagle3Drafter, Eagle3Steps
from .step import StepModel


@dataclass(frozen=True)
class Grid:
    """Everything the grid needs, resolved."""

    target: str
    drafter: object          # DrafterConfig
    database: aic.Database
    profile: AcceptanceProfile
    gpus: int
    tp_sizes: tuple[int, ...]
    batches: tuple[int, ...]
    isl: int
    osl: int
    verify_attention: str = "per-query"
    eagle3: Eagle3Drafter | None = None            # the baseline drafter, where the user gives one
    eagle3_profile: AcceptanceProfile | None = None
    eagle3_max_draft_len: int = 0
    dflash2: Dflash2Shape | None = None            # the drafter's DFlash2 shape; None: a DFlash drafter

    @property
    def max_draft_len(self) -> int:
        """The drafter's block less its anchor, or fewer where the acceptance profile covers fewer positions."""
        return min(self.drafter.block_size - 1, len(self.profile.per_position))


def point(tp: int, replicas: int, batch: int, k: int, tpot_ms: float, ttft_ms: float, osl: int, **extra) -> dict:
    latency_ms = ttft_ms + tpot_ms * (osl - 1)  # one request, end to end
    return {"batch": batch, "draft_len": k, "tok_s_user": 1000.0 / tpot_ms,
            "tok_s_gpu": batch * osl / latency_ms * 1000.0 / tp, "tp": tp, "replicas": replicas,
            "tpot_ms": tpot_ms, "ttft_ms": ttft_ms, **extra}


def layout_points(grid: Grid, tp: int) -> list[dict]:
    """Every (batch, k) point of one TP layout: plain (k = 0), DFlash (k = 1 .. grid.max_draft_len) and, with a
    baseline drafter, EAGLE-3 (k = 1 .. grid.eagle3_max_draft_len); each point names its `method`."""
    target = aic.build_target(grid.target, tp, grid.database)
    steps = StepModel(target, grid.drafter, grid.database, grid.isl, grid.osl, grid.verify_attention, grid.dflash2)
    eagle = Eagle3Steps(steps, grid.eagle3) if grid.eagle3 else None
    sm = grid.database.db.system_spec["gpu"]["sm_version"]
    replicas, out = grid.gpus // tp, []
    for batch in grid.batches:
        plain = aic.plain_estimate(target, grid.database, batch, grid.isl, grid.osl)
        if plain.oom:
            break  # larger batches need more memory still
        out.append(point(tp, replicas, batch, 0, plain.tpot_ms, plain.ttft_ms, grid.osl, method="plain",
                         tokens_per_step=1.0, memory_gib=round(plain.memory_gib, 3), source="aiconfigurator run_static"))
        extra = dflash_extra_gib(grid.drafter, target.facts["hidden_size"], tp, batch, grid.isl + grid.osl,
                                 grid.database.version, sm, grid.dflash2.extra_params(grid.drafter) if grid.dflash2 else 0)
        memory = plain.memory_gib + extra["total"]
        if memory <= grid.database.capacity_gib:
            ttft = plain.ttft_ms + steps.prefill_extra_ms(batch)
            for k in range(1, grid.max_draft_len + 1):
                tokens = grid.profile.tokens_per_step(k)
                cost = steps.cost(batch, k, tokens)
                out.append(point(tp, replicas, batch, k, cost.total_ms / tokens, ttft, grid.osl, method="dflash",
                                 tokens_per_step=tokens, step_ms=cost.parts(), memory_gib=round(memory, 3),
                                 memory_dflash_gib=extra, flagged_ops=cost.flagged))
        if eagle:
            out += eagle3_points(grid, eagle, plain, tp, replicas, batch)
    return out


def eagle3_points(grid: Grid, eagle: Eagle3Steps, plain: aic.PlainEstimate, tp: int, replicas: int,
                  batch: int) -> list[dict]:
    memory = plain.memory_gib + eagle.extra_gib(batch, grid.isl + grid.osl)
    if memory > grid.database.capacity_gib:
        return []
    ttft, out = plain.ttft_ms + eagle.prefill_extra_ms(batch), []
    for k in range(1, grid.eagle3_max_draft_len + 1):
        tokens = grid.eagle3_profile.tokens_per_step(k)
        cost = eagle.cost(batch, k)
        out.append(point(tp, replicas, batch, k, cost.total_ms / tokens, ttft, grid.osl, method="eagle3",
                         tokens_per_step=tokens, step_ms=cost.parts(), memory_gib=round(memory, 3),
                         flagged_ops=cost.flagged))
    return out


def frontier(points: list[dict]) -> list[dict]:
    """The Pareto points (bench.frontier's rule), by rising interactivity; one record per frontier point."""
    keep = set(pareto_frontier((p["tok_s_user"], p["tok_s_gpu"]) for p in points))
    seen, out = set(), []
    for p in sorted(points, key=lambda p: p["tok_s_user"]):
        xy = (p["tok_s_user"], p["tok_s_gpu"])
        if xy in keep and xy not in seen:
            seen.add(xy)
            out.append(p)
    return out


def best_at(points: list[dict], level: float) -> dict | None:
    """The most throughput per GPU among points at or above `level` tok/s/user; None if none reaches it."""
    reach = [p for p in points if p["tok_s_user"] >= level]
    return max(reach, key=lambda p: p["tok_s_gpu"]) if reach else None


def schedule_for(points: list[dict], tp: int, source: str) -> DraftLenSchedule | None:
    """Per batch of layout `tp`, the draft length (0 = plain) of most throughput per GPU, as TensorRT-LLM's
    draft_len_schedule: no step above the first (max_draft_len), equal neighbours merged into the larger
    threshold, a trailing run of 0 dropped (above the last threshold TensorRT-LLM drafts 0). None: plain wins at
    batch 1 already."""
    best: dict[int, dict] = {}
    for p in points:
        if p["tp"] == tp and p["method"] != "eagle3" and (p["batch"] not in best or p["tok_s_gpu"] > best[p["batch"]]["tok_s_gpu"]):
            best[p["batch"]] = p
    steps: list[tuple[int, int]] = []
    for batch in sorted(best):
        k = best[batch]["draft_len"] if not steps else min(best[batch]["draft_len"], steps[0][1])
        if steps and steps[-1][1] == k:
            steps[-1] = (batch, k)
        else:
            steps.append((batch, k))
    while steps and steps[-1][1] == 0:
        steps.pop()
    return DraftLenSchedule(tuple(steps), source) if steps else None
