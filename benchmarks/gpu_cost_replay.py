"""Issue 16: the cost policy's choices priced at a GPU's calibrated step costs, run on this CPU.

    python benchmarks/gpu_cost_replay.py [--cost RESULTS/gpu_policy.json] [--points short:1,short:4,short:16,...]

The built-in pair's DFlash generator (float32, eager) runs gpu_policy.py's workload here: the served warm-up, then
per point a closed loop of `concurrency` requests, 6 per client, 128 new tokens, EOS ignored. Greedy decoding makes
the tokens, and so every draft's acceptance, the pair's own on any device (up to float32 rounding). Every step
is priced from a GPU run (default: the H100's of gpu_h100_policy/prefill_e1f6625):
- a step where some request keeps the drafter's context: the run's calibrated seconds for its rows, longest
  context and draft length (calibration times those steps: its plain cells keep the context, capture included);
- a step of plain-only requests alone (plain decoding's ops): the median step of that run's plain decoding at the
  point's context, interpolated over its rows (1, 4 and 16 requests at snippets; 1 and 16 at 1024 tokens).
The policy's live correction is fed those prices instead of this CPU's wall time (the warm-up's steps too), so
it chooses as it would on a GPU whose steps cost exactly that: no host overhead, no noise, no admissions priced.
That isolates the policy's choices from everything else that differed on the GPU.

Cases:
- auto: the cost policy on that model
- always 15: the whole block every step
- never drafting: plain-only admissions, so every step is a plain step

Per point: priced output tokens/s, each case over never drafting, steps, drafting steps and requests that never
drafted. A run is deterministic, so there are no repeats. Writes benchmarks/results/gpu_cost_replay.json.

`--admissions` prices admissions too, at that run's compiled admission cells (gpu_admission.json beside the cost
model: one and 16 prompts of each context, linear between), and runs every case twice, its closed loop admitting
each client's next request as soon as it has a slot (as the serving loop did before serve/admission.py) and through
the serving loop's `AdmissionGate` with that fixed cost, on the priced clock (clients answer at once). Ratios are
over never drafting without the gate. Writes benchmarks/results/gpu_cost_replay_admissions.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from newcomer_backoff import (capacity, closed_loop, gated_loop, offline_pairs, parse_points,  # noqa: E402
                              served_warm_up)

from trtllm_dflash.draft_length.cost import CostModel, interpolate  # noqa: E402
from trtllm_dflash.draft_length.policy import CostBasedDraftLen, FixedDraftLen  # noqa: E402
from trtllm_dflash.serve.admission import AdmissionGate  # noqa: E402

OUT = Path(__file__).parent / "results" / "gpu_cost_replay.json"
OUT_ADMISSIONS = Path(__file__).parent / "results" / "gpu_cost_replay_admissions.json"
COST = Path(__file__).parent / "results" / "gpu_h100_policy" / "prefill_e1f6625" / "gpu_policy.json"
CASES = ("auto (cost policy)", "always 15", "never drafting")


def plain_step_seconds(record: dict, context: str) -> tuple[tuple[int, ...], list[float]]:
    """-> (rows, seconds): the run's plain decoding step at each concurrency measured at `context`, median over its
    repeats of each point's median step."""
    import statistics

    rows = {}
    for run in record["step_traces"]["plain"]:
        for point, trace in run.items():
            name, concurrency = point.split(":")
            cell = trace["steps"].get(f"{concurrency} 0 {concurrency}")
            if name == context and cell:
                rows.setdefault(int(concurrency), []).append(cell["median_ms"] / 1e3)
    ordered = sorted(rows)
    return tuple(ordered), [statistics.median(rows[r]) for r in ordered]


class Priced:
    """Prices each step of `generator`: with a request keeping the drafter's context, at `cost` (rows, longest
    context before the step, largest draft length); else at plain decoding's measured step (`plain`: rows,
    seconds). Feeds the policy's `timed` those prices instead of wall time."""

    def __init__(self, generator, cost: CostModel, plain: tuple[tuple[int, ...], list[float]]):
        self.seconds = 0.0
        self.steps = self.drafting = 0
        step, policy, top = type(generator).step.__get__(generator), generator.policy, generator.block - 1
        timed = policy.timed

        def price(rows: int, context: int, draft_len: int) -> float:
            return float(cost.step_seconds(rows, context, top)[draft_len])

        def priced_step(*a, **kw):
            running = list(generator.slots.running.values())
            context = max((s.start for s in running), default=0)
            keeping = any(s.drafting for s in running)
            ran = step(*a, **kw)
            if ran:
                k = max(s.result.draft_lengths[-1] for s in ran)
                self.seconds += price(len(ran), context, k) if keeping else float(interpolate(*plain, len(ran)))
                self.steps += 1
                self.drafting += k > 0
            return ran

        generator.step = priced_step
        policy.timed = lambda rows, context, draft_len, seconds: timed(rows, context, draft_len,
                                                                        price(rows, context, draft_len))


def case_policy(name: str, cost: CostModel):
    return {"auto (cost policy)": lambda: CostBasedDraftLen(cost), "always 15": lambda: FixedDraftLen(None),
            "never drafting": lambda: FixedDraftLen(0)}[name]()


class AdmissionPrices:
    """Seconds of an admission of n prompts of a context, from a run's compiled admission cells (1 and 16 prompts,
    linear between); `fixed` is the saving per grouped request, as serve/admission.py's `fixed_cost` measures it."""

    def __init__(self, path: Path):
        self.cells = json.loads(path.read_text())["cells"]
        self.path = path

    def ends(self, context: str) -> tuple[float, float]:
        return tuple(self.cells[f"dflash compiled batch {n} context {context}"]["median_ms"] / 1e3 for n in (1, 16))

    def seconds(self, n: int, context: str) -> float:
        one, many = self.ends(context)
        return one + (n - 1) * (many - one) / 15

    def fixed(self, context: str) -> float:
        one, many = self.ends(context)
        return max(0.0, (16 * one - many) / 15)


def one_case(generator, name: str, cost: CostModel, record: dict, prompts: dict, points, outputs: dict,
             prices: AdmissionPrices | None = None, gated: bool = False) -> dict:
    """A fresh policy serves the warm-up, then every point in order; -> point -> priced figures. prices: admissions
    priced too, each point's closed loop admitting at once or (gated) through an AdmissionGate."""
    generator.policy = case_policy(name, cost)
    generator.allocate(max(c for _, c in points), capacity(generator), generator.block)
    Priced(generator, cost, plain_step_seconds(record, "short"))  # the warm-up priced too: nothing timed here
    try:
        served_warm_up(generator, prompts, 2)
    finally:
        del generator.step
    out = {}
    for context, c in points:
        priced = Priced(generator, cost, plain_step_seconds(record, context))
        done: list = []
        try:
            if prices is None:
                _, never = closed_loop(generator, prompts[context], c, done)
            else:
                calls = []

                def admitted(n: int, context=context) -> None:
                    priced.seconds += prices.seconds(n, context)
                    calls.append(n)

                gate = AdmissionGate(prices.fixed(context)) if gated else None
                _, never = gated_loop(generator, prompts[context], c, done, gate, lambda: priced.seconds, admitted)
        finally:
            del generator.step
        outputs[f"{context}:{c}"] = done
        tokens = sum(len(ids) for ids in done)
        out[f"{context}:{c}"] = {"priced_tokens_per_s": tokens / priced.seconds, "priced_seconds": priced.seconds,
                                 "steps": priced.steps, "drafting_steps": priced.drafting, "never_drafted": never}
        if prices is not None:
            out[f"{context}:{c}"]["admission_calls"] = len(calls)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cost", type=Path, default=COST, help="a gpu_policy.json whose cost model prices the steps")
    p.add_argument("--points", default="short:1,short:4,short:16,1024:1,1024:16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--admissions", action="store_true", help="price admissions (gpu_admission.json beside --cost) "
                   "and run every case without and with the serving loop's admission gate")
    p.add_argument("--output", type=Path)
    args = p.parse_args()
    started = time.time()
    points = parse_points(args.points)
    record = json.loads(args.cost.read_text())
    cost = CostModel.from_json(record["cost_model"], str(args.cost))
    prices = AdmissionPrices(args.cost.parent / "gpu_admission.json") if args.admissions else None
    spec, _, prompts, _ = offline_pairs(args.threads, max(c for _, c in points))
    cases = [(name, False) for name in CASES] + ([(name, True) for name in CASES] if prices else [])
    label = {(name, gated): name + (" + admission gate" if gated else "") for name, gated in cases}
    runs, outputs = {}, {}
    for name, gated in cases:
        key = label[name, gated]
        outputs[key] = {}
        runs[key] = one_case(spec.generator, name, cost, record, prompts, points, outputs[key], prices, gated)
        print(f"[{time.time() - started:5.0f} s] {key} done", flush=True)
    table = []
    for context, c in points:
        point = f"{context}:{c}"
        base = runs["never drafting"][point]["priced_tokens_per_s"]
        reference = outputs["never drafting"][point]
        row = {"point": point, "differing_from_never_drafting": {
            key: sum(a != b for a, b in zip(outputs[key][point], reference)) for key in runs}}
        for key in runs:
            row[key] = {**runs[key][point], "over_never_drafting": runs[key][point]["priced_tokens_per_s"] / base}
        table.append(row)
        print(f"{point:>9}: " + "; ".join(
            f"{key} {row[key]['over_never_drafting']:.2f} ({row[key]['drafting_steps']} drafting of "
            f"{row[key]['steps']} steps" + (f", {row[key]['admission_calls']} admissions" if prices else "") + ")"
            for key in runs) + f"; outputs differing {row['differing_from_never_drafting']}")
    meta = {"admission_cells_from": str(prices.path), "fixed_cost_s": {c: prices.fixed(c) for c in ("short", "1024")}
            } if prices else {}
    output = args.output or (OUT_ADMISSIONS if prices else OUT)
    output.write_text(json.dumps({
        "command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": time.time() - started, "cost_model_from": str(args.cost),
        "cost_device": record["cost_model"]["meta"].get("device"), "threads": args.threads, **meta, "table": table},
        indent=1) + "\n")


if __name__ == "__main__":
    main()
