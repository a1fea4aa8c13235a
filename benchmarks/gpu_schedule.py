"""A calibrated draft-length schedule at Qwen3-8B shapes on one GPU (issue 16): step cost measured, draft length
chosen per running batch size for a stated acceptance profile.

    python benchmarks/gpu_schedule.py [--device cuda] [--step-mode cuda-graphs] [--max-batch 64] \\
        [--context 1024] [--tau 6.49] [--repeats 3]
    python benchmarks/gpu_schedule.py --tiny --device cpu --step-mode eager   # a smoke run of the script (CI)

The model pair is gpu_decode.py's (Qwen3-8B shapes, bf16, random weights, a 5-layer block-16 drafter). The
runtime's own calibration (`draft_length.calibrate.measure`, what `dflash-build calibrate` runs) times whole
steps over batch sizes 1, 2, 4, ... --max-batch, draft lengths 0, 1, 2, 4, 8, 15 and contexts 128 and --context.
Random weights accept nothing, so acceptance is a stated profile: every draft position accepted with the same
probability a, chosen so that a whole block's expected tokens per step are --tau (1 + a + ... + a^15 = tau; the
default 6.49 is the τ issue 15 projects from). Expected tokens at draft length k: (1 - a^(k+1)) / (1 - a).
For each calibrated batch size B the chosen k maximises B x tokens(k) / seconds(B, k, --context); the schedule
follows TensorRT-LLM's rules (draft_len_schedule.py: the smallest threshold maps to the longest length, later
lengths are capped by it). It describes this runtime's step costs on this GPU: a TensorRT-LLM deployment's own
schedule comes from `dflash-bench tune` against its server. Writes benchmarks/results/gpu_schedule.json and the
schedule as YAML beside it; prints a table last.

    python benchmarks/gpu_schedule.py --from benchmarks/results/gpu_h100/gpu_schedule_cuda-graphs.json \
        --taus 1.5,2,3,4.5,6.49 --output benchmarks/results/gpu_h100/gpu_schedule_taus.json

re-chooses from a committed record's measured cost model (no GPU, no model) for each acceptance profile in
--taus: the schedule that GPU's step costs give a drafter accepted that well, and the gain over plain decoding.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_decode import BLOCK, bench_context, build_pair, set_mode

OUT = Path(__file__).parent / "results" / "gpu_schedule.json"


def acceptance_for_tau(tau: float, max_draft_len: int) -> float:
    """The per-position acceptance a with 1 + a + ... + a^max_draft_len = tau (bisection; tau in [1, K + 1])."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens(mid, max_draft_len) < tau else (low, mid)
    return (low + high) / 2


def expected_tokens(a: float, k: int) -> float:
    return float(sum(a ** i for i in range(k + 1)))


def choose(cost, a: float, context: int, max_draft_len: int) -> list[dict]:
    """Per calibrated batch size: expected output tokens/s of the batch at every draft length, and the best."""
    rows = []
    for batch in cost.batch_sizes:
        seconds = cost.step_seconds(batch, context, max_draft_len)  # [K + 1]
        rates = [batch * expected_tokens(a, k) / s for k, s in enumerate(seconds)]
        best = int(np.argmax(rates))
        rows.append({"batch": batch, "seconds": [float(s) for s in seconds], "tokens_per_s": rates, "best": best,
                     "gain_over_plain": rates[best] / rates[0]})
    return rows


def calibrated_schedule(generator, max_batch: int, context: int, tau: float, repeats: int) -> dict:
    """Calibrate the generator's steps (allocated here for max_batch requests of context tokens) and choose the
    schedule for tau: the JSON record's measured part, with "schedule" as {batch: draft length}."""
    from trtllm_dflash.engine.calibrate import CalibrationPlan, measure

    max_draft_len = BLOCK - 1
    generator.allocate(max_batch, context + 2 * BLOCK + 2, BLOCK)
    with torch.inference_mode():
        cost = measure(generator, CalibrationPlan.covering(max_batch, max_draft_len, context, repeats))
    a, rows, schedule = schedule_for(cost, tau, context)
    return {"device": cost.meta["device"], "step_mode": generator.step_mode.mode, "context": context, "tau": tau,
            "acceptance_per_position": a, "cost_model": cost.to_json(), "rows": rows,
            "schedule": {str(b): k for b, k in schedule.items()}}


def schedule_for(cost, tau: float, context: int) -> tuple[float, list[dict], dict[int, int]]:
    """-> (per-position acceptance for tau, `choose`'s rows, {batch: draft length}): each batch's best length,
    capped by the first batch's (TensorRT-LLM's rule)."""
    max_draft_len = BLOCK - 1
    a = acceptance_for_tau(tau, max_draft_len)
    rows = choose(cost, a, context, max_draft_len)
    return a, rows, {r["batch"]: min(r["best"], rows[0]["best"]) for r in rows}


def schedules_for_taus(record: dict, taus: list[float]) -> dict:
    """A committed record's cost model, re-chosen at each tau: {"taus": [{tau, acceptance_per_position, schedule,
    gain_over_plain at the scheduled length}], and where the record was measured}."""
    from trtllm_dflash.draft_length.cost import CostModel

    cost = CostModel.from_json(record["cost_model"], "the record's cost_model")
    out = []
    for tau in taus:
        a, rows, schedule = schedule_for(cost, tau, record["context"])
        out.append({"tau": tau, "acceptance_per_position": a, "schedule": {str(b): k for b, k in schedule.items()},
                    "gain_over_plain": {str(r["batch"]): r["tokens_per_s"][schedule[r["batch"]]] / r["tokens_per_s"][0]
                                        for r in rows}})
    return {"command": "python " + " ".join(sys.argv), "device": record["device"], "step_mode": record["step_mode"],
            "context": record["context"], "measured_utc": record["date_utc"], "taus": out}


def report_taus(result: dict) -> None:
    print(f"{result['device']}, {result['step_mode']}, context {result['context']}: draft length (gain over plain) "
          "per running batch", file=sys.stderr)
    for row in result["taus"]:
        cells = "  ".join(f"{b}: {k} ({row['gain_over_plain'][b]:.2f}x)" for b, k in row["schedule"].items())
        print(f"  tau {row['tau']:5.2f}  {cells}", file=sys.stderr)


def record_of(measured: dict, tiny: bool, dtype, compile_s: float, wall_s: float) -> dict:
    """The JSON record: how it was run, and `calibrated_schedule`'s measured part."""
    return {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "torch": torch.__version__, "shapes": "tiny" if tiny else "Qwen3-8B",
            "dtype": str(dtype).removeprefix("torch."), "compile_s": compile_s, **measured, "wall_s": wall_s}


def write(out: Path, record: dict) -> None:
    """The JSON record, and the schedule as TensorRT-LLM's YAML beside it."""
    from trtllm_dflash.draft_length.schedule import DraftLenSchedule, write_schedule

    schedule = DraftLenSchedule(tuple((int(b), k) for b, k in record["schedule"].items()),
                                f"benchmarks/gpu_schedule.py on {record['device']}, tau {record['tau']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    write_schedule(out.with_suffix(".yaml"), schedule)


def report(record: dict, out: Path) -> None:
    print(f"{record['device']}, {record['step_mode']}, context {record['context']}, tau {record['tau']} "
          f"(a = {record['acceptance_per_position']:.3f})", file=sys.stderr)
    for row in record["rows"]:
        print(f"  batch {row['batch']:3}: k = {row['best']:2}  {row['gain_over_plain']:.2f}x plain  "
              f"(plain step {row['seconds'][0] * 1e3:.2f} ms)", file=sys.stderr)
    worst = record["cost_model"]["meta"].get("worst_cell")
    if worst:
        print(f"calibration's widest cell: {worst}", file=sys.stderr)
    print(f"schedule: {record['schedule']} -> {out.with_suffix('.yaml')}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--step-mode", default="cuda-graphs", help="eager, compile or cuda-graphs")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--tau", type=float, default=6.49, help="expected tokens per step drafting the whole block")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="tiny shapes, float32: a smoke run of the script")
    p.add_argument("--output", default=str(OUT))
    p.add_argument("--from", dest="source", help="a committed record: re-choose its cost model at --taus, no GPU")
    p.add_argument("--taus", default="1.5,2,3,4.5,6.49", help="with --from: acceptance profiles to choose for")
    args = p.parse_args()
    if args.source:
        taus = [float(t) for t in args.taus.split(",")]
        if not all(1 <= t <= BLOCK for t in taus):
            raise SystemExit(f"gpu_schedule.py: every tau must be in [1, {BLOCK}], got {args.taus}")
        result = schedules_for_taus(json.loads(Path(args.source).read_text()), taus)
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        report_taus(result)
        return
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_schedule.py: no CUDA device here (use --tiny --device cpu --step-mode eager)")
    if not 1 <= args.tau <= BLOCK:
        raise SystemExit(f"gpu_schedule.py: --tau must be in [1, {BLOCK}], got {args.tau}")
    started = time.perf_counter()
    generator, _, dtype = build_pair(args.tiny, args.device)
    compile_s = set_mode(generator, args.step_mode, args.device)
    measured = calibrated_schedule(generator, args.max_batch, bench_context(args.tiny, args.context), args.tau,
                                   args.repeats)
    record = record_of(measured, args.tiny, dtype, compile_s, time.perf_counter() - started)
    write(Path(args.output), record)
    report(record, Path(args.output))


if __name__ == "__main__":
    main()
