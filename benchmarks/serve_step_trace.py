"""Where a served step's time goes: a per-step trace of fresh plain and DFlash servers at one point.

    python benchmarks/serve_step_trace.py [--repeats 6] [--context short] [--concurrency 16]

Diagnostic, not a rate. This tree's trtllm_dflash is copied to a temporary directory and
benchmarks/results/serve_step_trace/instrument.patch applied to the copy (timers in `ServingLoop.iterate` and
`Generator.step`, one line per step appended to /tmp/dflash_step_trace/trace-PID-POLICY.jsonl); real tritonservers
serve that copy (the engine, calibration, prompts and warm-up of benchmarks/serve_dflash_vs_plain.py with
`--warmup 4`, `--draft-len auto`), both up at once, started fresh each repeat, the point run on one then the
other in alternating order. Per server and repeat, over the timed point only: drafting steps (rows, draft length,
rows keeping the drafter's context, ms), and for plain steps of 16 rows, split by whether some row keeps the
drafter's context, the median of each phase of `Generator.step` (choosing, the target's pass, the rest), and
(`aligned_with_plain`) against the plain server's steps at the same index of the point.
Writes benchmarks/results/serve_step_trace/trace.json (or --output) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_dflash_vs_plain import prompt_sets, run_point, serve, served_engine, warm_up  # noqa: E402

HERE = Path(__file__).resolve().parent
PATCH = HERE / "results" / "serve_step_trace" / "instrument.patch"
OUT = HERE / "results" / "serve_step_trace" / "trace.json"
TRACES = Path("/tmp/dflash_step_trace")  # where the patched loop writes (the Python backend stub ignores env)
PHASES = ("choose", "prepare", "target pass", "accept", "read", "context and state", "policy and emit")


def instrumented_package(dest: Path) -> Path:
    shutil.copytree(HERE.parent / "trtllm_dflash", dest / "trtllm_dflash",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["patch", "-p1", "-s", "-i", str(PATCH)], cwd=dest, check=True)
    return dest


def read_trace(path: Path, start: float, end: float) -> list[dict]:
    """The trace lines of steps that began and ended within [start, end] (perf_counter: one clock for all
    processes of the machine)."""
    rows = []
    for line in path.read_text().splitlines():
        f = line.split()
        row = {"t0": float(f[0]), "rows": int(f[1]), "k": int(f[2]), "keep": int(f[3]), "step_s": float(f[6]),
               "t4": float(f[10]), "phases": [float(x) for x in f[11:18]]}
        if start <= row["t0"] and row["t4"] <= end:
            rows.append(row)
    return rows


def summarize(steps: list[dict], span: float) -> dict:
    drafting = [s for s in steps if s["k"] > 0]
    out = {"span_s": span, "steps": len(steps), "step_s_total": sum(s["step_s"] for s in steps),
           "drafting_steps": [{"rows": s["rows"], "draft_len": s["k"], "keeping": s["keep"],
                               "ms": 1e3 * s["step_s"]} for s in drafting],
           "drafting_s": sum(s["step_s"] for s in drafting)}
    for name, keep in (("plain_keeping", True), ("plain_only", False)):
        sel = [s for s in steps if s["k"] == 0 and s["rows"] == 16 and (s["keep"] > 0) == keep and s["phases"]]
        out[name] = {"steps": len(sel)} | ({
            "step_ms_median": 1e3 * statistics.median(s["step_s"] for s in sel),
            "phase_us_median": {p: 1e6 * statistics.median(s["phases"][i] for s in sel) for i, p in enumerate(PHASES)},
        } if sel else {})
    return out


def aligned(dflash: list[dict], plain: list[dict]) -> dict:
    """DFlash's plain steps of 16 rows, split by whether some row keeps the drafter's context, against the plain
    server's steps at the same index of the point (the same place in the same wave of requests: a step's cost
    grows through a wave as its requests' contexts grow, and the waves that keep the context are not the average
    ones; a drafting step shifts the later indices by the tokens it gained, a few steps of a 128-step wave)."""
    out = {}
    for name, keep in (("plain_keeping", True), ("plain_only", False)):
        idx = [i for i in range(min(len(dflash), len(plain)))
               if dflash[i]["k"] == 0 and dflash[i]["rows"] == 16 and (dflash[i]["keep"] > 0) == keep
               and plain[i]["k"] == 0 and plain[i]["rows"] == 16 and dflash[i]["phases"] and plain[i]["phases"]]
        if not idx:
            out[name] = {"steps": 0}
            continue
        def median_ms(steps, value):
            return 1e3 * statistics.median(value(steps[i]) for i in idx)
        out[name] = {"steps": len(idx),
                     "step_ms_median": {"dflash": median_ms(dflash, lambda s: s["step_s"]),
                                        "plain": median_ms(plain, lambda s: s["step_s"])},
                     "target_pass_ms_median": {"dflash": median_ms(dflash, lambda s: s["phases"][2]),
                                               "plain": median_ms(plain, lambda s: s["phases"][2])},
                     "step_s_sum_difference": sum(dflash[i]["step_s"] - plain[i]["step_s"] for i in idx)}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--context", default="short")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from transformers import AutoTokenizer

    from trtllm_dflash.pairs import stdlib_pair
    from trtllm_dflash.serve.server import stop_server

    shutil.rmtree(TRACES, ignore_errors=True)
    TRACES.mkdir(parents=True)
    servers_out = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        package = instrumented_package(root / "package")
        engine, _ = served_engine(root, args.concurrency, "benchmarks/serve_step_trace.py")
        prompts = prompt_sets(AutoTokenizer.from_pretrained(stdlib_pair()[0]), quick=False)
        for rep in range(args.repeats):
            names = ("plain", "dflash") if rep % 2 == 0 else ("dflash", "plain")
            servers, traced = {}, {}
            try:
                for decoding in names:
                    servers[decoding] = serve(engine, root, decoding, "auto", args.threads, package=package)
                for _, ends in servers.values():
                    warm_up(f"{ends.http_url}/v2/models/m/generate", prompts, 4)
                for decoding in names:
                    ends = servers[decoding][1]
                    start = time.perf_counter()
                    row = run_point(f"{ends.http_url}/v2/models/m/generate", ends.metrics_url,
                                    prompts[args.context], args.concurrency, 6 * args.concurrency)
                    end = time.perf_counter()
                    # the server that ran in [start, end] is the one whose trace has steps there (the stub's pid is
                    # not tritonserver's)
                    steps = max((read_trace(t, start, end) for t in TRACES.glob("trace-*")), key=len)
                    traced[decoding] = steps
                    servers_out.append({"repeat": rep, "decoding": decoding, "tok_s": row["output_tokens_per_s"],
                                        **summarize(steps, end - start)})
                    print(json.dumps(servers_out[-1]), file=sys.stderr, flush=True)
                entry = next(e for e in servers_out if e["repeat"] == rep and e["decoding"] == "dflash")
                entry["aligned_with_plain"] = aligned(traced["dflash"], traced["plain"])
                print(json.dumps({"repeat": rep, "aligned_with_plain": entry["aligned_with_plain"]}), file=sys.stderr,
                      flush=True)
            finally:
                for proc, _ in servers.values():
                    stop_server(proc)
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "load_average_at_end": os.getloadavg(), "point": {"context": args.context, "concurrency": args.concurrency},
              "servers": servers_out}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
