"""gpu_decode.py and gpu_schedule.py in one process, for a short GPU lease: the Qwen3-8B-shaped pair is built
once and each step mode compiled once, then measured by both.

    python benchmarks/gpu_session.py --out DIR [--step-modes eager,cuda-graphs] [--deadline-s 330] [--graphs DIR]
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


def graphs_compiled() -> int:
    """dynamo's unique graphs so far: one that grows after the warm-up is a recompilation a server would pay
    (its reason is logged when TORCH_LOGS=recompiles, as gpu_lease.sh sets)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


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


class Session:
    """One process's measurements: the pair built once, then each step mode's parts, each recorded as it ends."""

    def __init__(self, args):
        self.args, self.out = args, Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.context = gpu_decode.bench_context(args.tiny, args.context)
        self.batches = [int(b) for b in args.batches.split(",")]
        self.started = time.perf_counter()
        self.generator, target, self.dtype = gpu_decode.build_pair(args.tiny, args.device)
        self.decode = gpu_decode.header(args.device, args.tiny, self.dtype)  # gpu_decode.json's record
        self.decode.update(gpu_decode.roofline_fields(target, args.device, args.tiny))

    def due(self) -> bool:
        return time.perf_counter() - self.started < self.args.deadline_s

    def run(self, mode: str) -> None:
        """The mode's warm-up and schedule first (a lease that runs out mid-mode keeps it: issue 16's GPU goal),
        then its decode rows; a failing part is recorded and ends the mode."""
        try:
            progress(self.started, f"{mode}: warm-up")
            loaded = self.load_graphs(mode)
            compile_s = gpu_decode.set_mode(self.generator, mode, self.args.device)
            self.store_graphs(mode, loaded, compile_s)
            progress(self.started, f"{mode}: warm-up took {compile_s:.0f} s ({'graphs loaded from ' if loaded else ''}"
                                   f"{self.args.graphs if loaded else 'compiled'}), {graphs_compiled()} graphs traced; "
                                   "calibration and schedule")
            self.schedule(compile_s, self.out / f"gpu_schedule_{mode}.json")
            if not self.due():
                return
            progress(self.started, f"{mode}: {graphs_compiled()} graphs compiled; decode rows")
            rows = gpu_decode.rows_for(self.generator, self.args.device, self.batches, self.context,
                                       self.args.repeats, self.decode["roofline_step_s"])
            self.decode["modes"][mode] = {"compile_s": compile_s, "rows": rows}  # compiled once, before the schedule
        except Exception as exc:
            traceback.print_exc()
            self.decode["modes"][mode] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            self.save()

    def graph_key(self, mode: str) -> dict:
        from trtllm_dflash.engine.calibrate import device_name

        from trtllm_dflash.compilation.graph_store import triton_version

        return {"device": device_name(torch.device(self.args.device)), "torch": torch.__version__,
                "triton": triton_version(), "shapes": "tiny" if self.args.tiny else "qwen3-8b", "step_mode": mode}

    def load_graphs(self, mode: str) -> bool:
        """--graphs DIR: a set an earlier run stored (graph_store.py; an engine's are stored the same way)."""
        from trtllm_dflash.compilation.graph_store import ArtefactError, GraphStore

        if not self.args.graphs or mode == "eager":
            return False
        try:
            GraphStore(Path(self.args.graphs)).load(self.graph_key(mode))
            return True
        except ArtefactError as exc:
            progress(self.started, f"{mode}: no stored graphs used ({exc}): compiling")
            return False

    def store_graphs(self, mode: str, loaded: bool, compile_s: float) -> None:
        from trtllm_dflash.compilation.graph_store import GraphStore, inductor_cache_dir

        if self.args.graphs and mode != "eager" and not loaded:
            where = GraphStore(Path(self.args.graphs)).save(self.graph_key(mode), inductor_cache_dir(), compile_s)
            progress(self.started, f"{mode}: graphs stored in {where}")

    def schedule(self, compile_s: float, out: Path) -> None:
        """gpu_schedule.py's calibration and schedule for the generator's step mode (already warmed up)."""
        t0, args = time.perf_counter(), self.args
        measured = gpu_schedule.calibrated_schedule(self.generator, args.max_batch, self.context, args.tau,
                                                    args.calibration_repeats)
        record = gpu_schedule.record_of(measured, args.tiny, self.dtype, compile_s, time.perf_counter() - t0)
        gpu_schedule.write(out, record)
        gpu_schedule.report(record, out)

    def save(self) -> None:
        self.decode["wall_s"] = time.perf_counter() - self.started
        if self.args.device.startswith("cuda"):
            self.decode["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
        (self.out / "gpu_decode.json").write_text(json.dumps(self.decode, indent=2) + "\n")


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
    p.add_argument("--graphs", help="directory of compiled graphs: loaded when it holds this machine's, else "
                   "stored there after the warm-up (a later run, or a later lease that carries it, compiles nothing)")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_session.py: no CUDA device here (use --tiny --device cpu --step-modes eager)")
    session = Session(args)
    signal.signal(signal.SIGTERM, stopped)
    try:
        for mode in args.step_modes.split(","):
            if not session.due():
                print(f"gpu_session.py: deadline passed, {mode} not run", file=sys.stderr)
                break
            session.run(mode)
    finally:
        if args.step_modes != "eager":
            progress(session.started, "compile times so far:\n" + compile_times())
    gpu_decode.report({"modes": {m: r for m, r in session.decode["modes"].items() if "rows" in r}})
    print(f"gpu_session.py: {time.perf_counter() - session.started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
