"""Issue 16 on a GPU: the cost policy (`--draft-len auto`) against plain decoding, always drafting the whole block
and never drafting, offline, the built-in pair on one CUDA device in its default step mode (cuda-graphs).

    python benchmarks/gpu_policy.py --out DIR [--repeats 5] [--deadline-s 400] [--plain-path-rounds N]
                                    [--admission-rounds N] [--points short:1,short:4,short:16,1024:1,1024:16]
                                    [--admission-gate]
    python benchmarks/gpu_policy.py --device cpu --step-mode eager --repeats 1 --points short:1 --out /tmp/p  # smoke

The served benchmark's workload without the server (newcomer_admission.py's: held-out snippets and 1024-token
windows, 128 new tokens, EOS ignored, closed loop of `concurrency` requests, 6 per client, after the served
warm-up), run by two generators of the built-in pair (float32) in one process: plain decoding, and DFlash with
the cost policy (calibrated once on this device, a fresh policy per repeat, like a fresh server), with every
step drafting 15 tokens, or with none drafting (the DFlash engine's plain path: its cost over plain decoding's).
The cases alternate order per repeat. Per point: output tokens/s, each DFlash case's ratio to plain per repeat
(median, range), requests that never drafted, and whether every request's output equals plain decoding's token
for token (greedy). Also the calibrated cost model, and per case, repeat and point the steps per (rows, draft
length, rows keeping the drafter's context) with their seconds and tokens, and the admit calls and their seconds.
Writes DIR/gpu_policy.json after every repeat, so a lease that runs out keeps the repeats done; no repeat
starts after --deadline-s. `--plain-path-rounds N` first runs gpu_plain_path.py's measurement on the same
pipelines (DIR/gpu_plain_path.json), `--admission-rounds N` gpu_admission.py's (DIR/gpu_admission.json): one
load and compile for all. `--admission-gate` adds a case: the cost policy with each point's requests admitted through
the serving loop's admission gate (serve/admission.py; its fixed cost measured on this device per repeat, after
the warm-up), as `dflash-serve` admits them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gpu_admission  # noqa: E402
import gpu_plain_path  # noqa: E402
from newcomer_backoff import (capacity, closed_loop, gated_loop, parse_points, served_warm_up,  # noqa: E402
                              write_results)
from serve_dflash_vs_plain import NEW_TOKENS  # noqa: E402

from trtllm_dflash.draft_length.policy import CostBasedDraftLen, FixedDraftLen  # noqa: E402
from trtllm_dflash.serve.admission import AdmissionGate, fixed_cost  # noqa: E402

WARMUP = 4  # requests of each context, as the served benchmark's --warmup 4
CASES = ("plain", "auto (cost policy)", "always 15", "never drafting")
GATED = "auto + admission gate"


def case_policy(name: str, calibrated, max_draft_len: int):
    """A fresh policy per case and repeat, like a fresh server (None: the plain generator's own)."""
    return {"plain": None, "auto (cost policy)": CostBasedDraftLen(calibrated.cost),
            GATED: CostBasedDraftLen(calibrated.cost), "always 15": FixedDraftLen(max_draft_len),
            "never drafting": FixedDraftLen(0)}[name]


class StepTrace:
    """Wraps a generator's step and admit (instance attributes, so the closed loop calls them): per (rows,
    draft length, rows keeping the drafter's context) the steps, their seconds and tokens; and admissions'
    seconds. Each step already ends in a host sync (its tokens are read), so the wall time is the step's."""

    def __init__(self):
        self.steps: dict[str, list] = {}  # "rows k keep" -> [count, seconds, tokens, [ms per step]]
        self.admit_s = 0.0
        self.admits = 0  # admit calls (one batched prefill each)
        self.fixed_cost_s: float | None = None  # the admission gate's fixed cost, where the point used one

    def wrap(self, generator):
        # the class's own, bound: generator.step may already be an earlier point's wrapper (an instance
        # attribute), which would trace this point's steps into that point's cells too
        step, admit = type(generator).step.__get__(generator), type(generator).admit.__get__(generator)

        def traced_step(*a, **kw):
            t0 = time.perf_counter()
            ran = step(*a, **kw)
            dt = time.perf_counter() - t0
            k = max((s.result.draft_lengths[-1] for s in ran), default=0)
            keep = sum(bool(s.drafting) for s in ran)
            cell = self.steps.setdefault(f"{len(ran)} {k} {keep}", [0, 0.0, 0, []])
            cell[0], cell[1] = cell[0] + 1, cell[1] + dt
            cell[2] += sum(s.result.acceptance_lengths[-1] for s in ran)
            cell[3].append(round(dt * 1e3, 3))
            return ran

        def traced_admit(*a, **kw):
            t0 = time.perf_counter()
            out = admit(*a, **kw)
            self.admit_s += time.perf_counter() - t0
            self.admits += 1
            return out

        generator.step, generator.admit = traced_step, traced_admit
        return self

    def summary(self) -> dict:
        steps = {key: {"count": c, "seconds": s, "tokens": t, "median_ms": statistics.median(ms)}
                 for key, (c, s, t, ms) in sorted(self.steps.items())}
        gate = {} if self.fixed_cost_s is None else {"admission_fixed_cost_s": self.fixed_cost_s}
        return {"admit_s": self.admit_s, "admits": self.admits, "steps": steps, **gate}


def one_server(generator, policy, prompts: dict, points: list[tuple[str, int]], outputs: dict,
               traces: dict, gated: bool = False) -> dict:
    """newcomer_backoff.one_server with each point's outputs kept in outputs[point] and its steps traced in
    traces[point] (a StepTrace); gated: admissions through an AdmissionGate, as the serving loop's."""
    if policy is not None:
        generator.policy = policy
    generator.allocate(max(c for _, c in points), capacity(generator), generator.block)
    served_warm_up(generator, prompts, WARMUP)
    fixed = fixed_cost(generator) if gated else 0.0
    run = {}
    try:
        for context, c in points:
            key = f"{context}:{c}"
            outputs[key] = []
            traces[key] = StepTrace().wrap(generator)
            if gated:
                run[key] = gated_loop(generator, prompts[context], c, outputs[key], AdmissionGate(fixed))
                traces[key].fixed_cost_s = fixed
            else:
                run[key] = closed_loop(generator, prompts[context], c, outputs[key])
    finally:
        del generator.step, generator.admit  # the class's own again
    return run


def mismatches(outputs: dict, reference: dict) -> dict:
    """point -> requests whose output differs from plain decoding's (0 where greedy DFlash is exact)."""
    return {key: sum(a != b for a, b in zip(outputs[key], reference[key])) for key in reference}


def plain_path(args, spec, plain, slots: int, started: float, clock: float) -> None:
    """gpu_plain_path.py's cells and profiles on these pipelines (one load for both scripts' measurements)."""
    batches = sorted({1, min(4, slots), slots})
    cells, profiles = gpu_plain_path.measure(spec, plain, batches, [128, 1024], args.plain_path_rounds, 20,
                                             log=gpu_plain_path.stamped(clock, "plain path: "))
    gpu_plain_path.write(args, started, spec, "gpu_plain_path.json", batches=batches, cells=cells, profiles=profiles)


def admission(args, spec, plain, prompts: dict, slots: int, started: float, clock: float) -> None:
    """gpu_admission.py's cells on these pipelines: admit calls with the prefill compiled and eager."""
    cells = gpu_admission.measure(spec, plain, prompts, sorted({1, slots}), args.admission_rounds, 5,
                                  log=gpu_plain_path.stamped(clock, "admission: "))
    gpu_plain_path.write(args, started, spec, "gpu_admission.json", cells=cells)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--points", default="short:1,short:4,short:16,1024:1,1024:16", help="context:concurrency")
    p.add_argument("--deadline-s", type=float, default=1e9, help="no repeat starts after this many seconds")
    p.add_argument("--plain-path-rounds", type=int, default=0,
                   help="first, gpu_plain_path.py's measurement with this many rounds on the same pipelines "
                        "(0: none); written to DIR/gpu_plain_path.json")
    p.add_argument("--admission-rounds", type=int, default=0,
                   help="first, gpu_admission.py's measurement with this many rounds on the same pipelines "
                        "(0: none); written to DIR/gpu_admission.json")
    p.add_argument("--admission-gate", action="store_true", help=f"add the case '{GATED}'")
    gpu_plain_path.device_args(p)
    args = p.parse_args()
    cases = CASES + ((GATED,) if args.admission_gate else ())
    args.output = Path(args.out) / "gpu_policy.json"
    points = parse_points(args.points)
    load_before, started, clock = os.getloadavg(), time.time(), time.perf_counter()
    slots = max(c for _, c in points)
    spec, plain, prompts, calibrated = gpu_plain_path.load(args, slots)
    gpu_plain_path.stamped(clock)("loaded and calibrated")
    if args.plain_path_rounds:
        plain_path(args, spec, plain, slots, started, clock)
    if args.admission_rounds:
        admission(args, spec, plain, prompts, slots, started, clock)
    runs, wrong = {name: [] for name in cases}, {name: [] for name in cases[1:]}
    traces = {name: [] for name in cases}  # per repeat: point -> StepTrace.summary()
    for r in range(args.repeats):
        if time.perf_counter() - clock > args.deadline_s:
            print(f"deadline: {r} repeats done", file=sys.stderr)
            break
        outputs = {}
        for name in (cases if r % 2 == 0 else cases[::-1]):
            policy = case_policy(name, calibrated, spec.generator.block - 1)
            outputs[name], traced = {}, {}
            generator = plain.generator if name == "plain" else spec.generator
            runs[name].append(one_server(generator, policy, prompts, points, outputs[name], traced, name == GATED))
            traces[name].append({key: trace.summary() for key, trace in traced.items()})
        for name in cases[1:]:
            wrong[name].append(mismatches(outputs[name], outputs["plain"]))
        print(f"[{time.perf_counter() - clock:5.0f} s] repeat {r}: " + "; ".join(
            f"{n} " + " ".join(f"{runs[n][-1][k][0] / runs['plain'][-1][k][0]:.2f}" for k in runs[n][-1])
            for n in cases[1:]) + f"; outputs differing from plain: {[wrong[n][-1] for n in cases[1:]]}",
            file=sys.stderr, flush=True)
        write_results(args, started, load_before, runs, points, {
            "device": gpu_plain_path.device_record(args.device), "step_mode": spec.generator.step_mode.mode,
            "warmup": WARMUP, "new_tokens": NEW_TOKENS, "requests_differing_from_plain": wrong,
            "cost_model": calibrated.cost.to_json(), "step_traces": traces})


if __name__ == "__main__":
    main()
