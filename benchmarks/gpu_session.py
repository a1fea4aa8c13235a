"""gpu_decode.py and gpu_schedule.py in one process, for a short GPU lease: the Qwen3-8B-shaped pair is built
once and each step mode compiled once, then measured by both.

    python benchmarks/gpu_session.py --out DIR [--step-modes eager,cuda-graphs] [--deadline-s 330]
    python benchmarks/gpu_session.py --tiny --device cpu --step-modes eager --out DIR   # a smoke run (CI)

For each step mode in turn: its warm-up, gpu_schedule.py's calibration and schedule (first: a lease that runs
out mid-mode keeps it), then gpu_decode.py's rows (AR, DFlash, drafter and verify step latency per batch size
against the HBM roofline). Writes DIR/gpu_schedule_<mode>.json with its YAML schedule beside it, and
DIR/gpu_decode.json (gpu_decode.py's format, every mode so far) after each mode. A part that fails is recorded
(its error in the JSON, its traceback on stderr); no part starts after --deadline-s seconds (the parts already
written stay).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gpu_decode  # noqa: E402
import gpu_schedule  # noqa: E402


def progress(started: float, what: str) -> None:
    print(f"gpu_session.py: [{time.perf_counter() - started:6.0f} s] {what}", file=sys.stderr, flush=True)


def stopped(signum, frame):
    """SIGTERM (timeout's) as SystemExit, so that main's finally says where the time went."""
    raise SystemExit(124)


def compile_times() -> str:
    """dynamo's and inductor's time per phase so far (empty when nothing compiled)."""
    try:
        from torch._dynamo.utils import compile_times as times

        return times(repr="str", aggregate=True)
    except Exception as exc:  # a torch without it: the reason instead
        return f"(no compile times: {type(exc).__name__}: {exc})"


def schedule(generator, args, context: int, compile_s: float, decode: dict, out: Path) -> None:
    """gpu_schedule.py's calibration and schedule for the generator's step mode (already warmed up)."""
    t0 = time.perf_counter()
    measured = gpu_schedule.calibrated_schedule(generator, args.max_batch, context, args.tau, args.calibration_repeats)
    record = {"command": "python " + " ".join(sys.argv), "date_utc": decode["date_utc"], "torch": torch.__version__,
              "shapes": decode["shapes"], "dtype": decode["dtype"], "compile_s": compile_s, **measured,
              "wall_s": time.perf_counter() - t0}
    gpu_schedule.write(out, record)
    gpu_schedule.report(record, out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--step-modes", default="eager,cuda-graphs")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=10, help="gpu_decode.py's repeats per row")
    p.add_argument("--max-batch", type=int, default=64, help="gpu_schedule.py's largest calibrated batch")
    p.add_argument("--calibration-repeats", type=int, default=3)
    p.add_argument("--tau", type=float, default=gpu_decode.TAU)
    p.add_argument("--deadline-s", type=float, default=float("inf"), help="no part starts after this many seconds")
    p.add_argument("--tiny", action="store_true", help="tiny shapes, float32: a smoke run of the script")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_session.py: no CUDA device here (use --tiny --device cpu --step-modes eager)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape, dtype = (gpu_decode.TINY, torch.float32) if args.tiny else (gpu_decode.QWEN3_8B, torch.bfloat16)
    context = min(args.context, 64) if args.tiny else args.context
    started = time.perf_counter()
    decode = gpu_decode.header(args.device, args.tiny, dtype)
    generator, target = gpu_decode.build(shape, 2 if args.tiny else 5, args.device, dtype)
    decode.update(gpu_decode.roofline_fields(target, args.device, args.tiny))
    batches = [int(b) for b in args.batches.split(",")]

    def due() -> bool:
        return time.perf_counter() - started < args.deadline_s

    signal.signal(signal.SIGTERM, stopped)
    try:
        for mode in args.step_modes.split(","):
            if not due():
                print(f"gpu_session.py: deadline passed, {mode} not run", file=sys.stderr)
                break
            try:  # the schedule first: a lease that runs out mid-mode keeps it (issue 16's GPU goal)
                progress(started, f"{mode}: warm-up")
                compile_s = gpu_decode.set_mode(generator, mode, args.device)
                progress(started, f"{mode}: warm-up took {compile_s:.0f} s; calibration and schedule")
                schedule(generator, args, context, compile_s, decode, out / f"gpu_schedule_{mode}.json")
            except Exception as exc:
                traceback.print_exc()
                decode["modes"][mode] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            if not due():
                break
            try:
                progress(started, f"{mode}: decode rows")
                rows = gpu_decode.rows_for(generator, args.device, batches, context, args.repeats,
                                           decode["roofline_step_s"])
                decode["modes"][mode] = {"compile_s": compile_s, "rows": rows}  # compiled once, before the schedule
            except Exception as exc:
                traceback.print_exc()
                decode["modes"][mode] = {"error": f"{type(exc).__name__}: {exc}"}
            decode["wall_s"] = time.perf_counter() - started
            if args.device.startswith("cuda"):
                decode["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
            (out / "gpu_decode.json").write_text(json.dumps(decode, indent=2) + "\n")
    finally:
        if args.step_modes != "eager":
            progress(started, "compile times so far:\n" + compile_times())
    gpu_decode.report({"modes": {m: r for m, r in decode["modes"].items() if "rows" in r}})
    print(f"gpu_session.py: {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
