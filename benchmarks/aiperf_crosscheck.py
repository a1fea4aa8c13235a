"""dflash-bench against AIPerf 0.13 on the same deployment: do the two clients measure the same numbers?

Serves the built-in pair's torch engine with `dflash-serve --openai-port` (tritonserver + the OpenAI
frontend), then runs, interleaved and alternating which goes first, `dflash-bench sweep --api openai`
and `aiperf profile --endpoint-type completions --streaming --use-server-token-count` at one fixed
concurrency, both on the same held-out prompts with the same output length (EOS ignored, greedy).
AIPerf runs from its own virtual environment (aiperf==0.13.0, created on first use); it is not part of
`make test`. For each metric the JSON holds every repeat and min/median/max per client, and whether
the two repeat ranges overlap, whether each client's median lies inside the other's range, and the ratio of
the medians (dflash-bench / AIPerf).

Run: python benchmarks/aiperf_crosscheck.py [--repeats 3] [--concurrency 4] [--requests 32] [--osl 64]
Writes benchmarks/results/aiperf_crosscheck.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "aiperf_crosscheck.json"
AIPERF = "aiperf==0.13.0"
MODEL = "dflash"
# metric -> (dflash-bench summary key, AIPerf export key and statistic); ms or tokens/s
METRICS = {
    "TTFT p50 (ms)": ("ttft_ms_median", ("time_to_first_token", "p50")),
    "TPOT / ITL p50 (ms)": ("tpot_ms_median", ("inter_token_latency", "p50")),
    "inter-chunk latency p50 (ms)": ("inter_chunk_latency_ms_median", ("inter_chunk_latency", "p50")),
    "E2E p50 (ms)": ("e2e_ms_median", ("request_latency", "p50")),
    "output tok/s": ("output_throughput", ("output_token_throughput", "avg")),
    "total (input+output) tok/s": ("total_throughput", ("total_token_throughput", "avg")),
    "requests/s": ("request_throughput", ("request_throughput", "avg")),
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def aiperf_venv(path: Path) -> tuple[Path, str]:
    """AIPerf in a virtual environment of its own (its dependencies must not meet the project's)."""
    binary = path / "bin" / "aiperf"
    if not binary.exists():
        log(f"installing {AIPERF} into {path}")
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", AIPERF], check=True)
    version = subprocess.run([str(path / "bin" / "python"), "-c", "import importlib.metadata as m; "
                              "print(m.version('aiperf'))"], capture_output=True, text=True, check=True)
    return binary, version.stdout.strip()


def free_port() -> int:
    from trtllm_dflash.engine.loader import free_port as pick

    return pick()


def serve(engine: Path, work: Path) -> tuple[subprocess.Popen, dict]:
    ports = {name: free_port() for name in ("http", "grpc", "metrics", "openai")}
    command = [sys.executable, "-m", "trtllm_dflash.cli.serve", str(engine), "--model-repo", str(work / "repo"),
               "--model-name", MODEL, "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
               "--metrics-port", str(ports["metrics"]), "--openai-port", str(ports["openai"])]
    proc = subprocess.Popen(command, stdout=open(work / "serve.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"dflash-serve exited with {proc.returncode}: {(work / 'serve.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports['openai']}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, ports
        except OSError:
            pass
        time.sleep(1)
    proc.kill()
    raise SystemExit("dflash-serve was not ready after 600 s")


def write_prompts(work: Path, count: int, osl: int) -> tuple[Path, Path]:
    """The same held-out prompts for both clients, in each one's JSONL format."""
    from trtllm_dflash.pairs import held_out_texts

    texts = held_out_texts(count)
    ours, theirs = work / "prompts.jsonl", work / "aiperf_prompts.jsonl"
    ours.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    theirs.write_text("".join(json.dumps({"text": t, "output_length": osl}) + "\n" for t in texts))
    return ours, theirs


def run_dflash_bench(args, engine: Path, ports: dict, prompts: Path, out: Path) -> dict:
    url = f"http://127.0.0.1:{ports['openai']}"
    command = [sys.executable, "-m", "trtllm_dflash.cli.bench", "sweep", "--url", url, "--model", MODEL, "--api",
               "openai", "--concurrency", str(args.concurrency), "--prompts-per-point", str(args.requests),
               "--warmup", str(args.warmup), "--osl", str(args.osl), "--dataset", str(prompts),
               "--tokenizer", str(engine), "--output", str(out), "--no-progress",
               "--metrics-url", f"http://127.0.0.1:{ports['metrics']}/metrics"]
    with open(out.with_suffix(".log"), "w") as log_file:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=log_file)
    point = json.loads((out / "summary.json").read_text())["points"][0]
    values = {name: point[key] for name, (key, _) in METRICS.items()}
    return values | {"command": command, "acceptance_length": point["acceptance_length"]}


def run_aiperf(args, binary: Path, engine: Path, ports: dict, prompts: Path, out: Path) -> dict:
    command = [str(binary), "profile", "--model", MODEL, "--url", f"http://127.0.0.1:{ports['openai']}",
               "--endpoint-type", "completions", "--streaming", "--use-server-token-count",
               "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
               "--warmup-request-count", str(args.warmup), "--input-file", str(prompts),
               "--custom-dataset-type", "single_turn", "--dataset-sampling-strategy", "sequential",
               "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0",
               "--tokenizer", str(engine / "tokenizer"), "--output-artifact-dir", str(out), "--ui-type", "none"]
    env = {**os.environ, "PATH": f"{binary.parent}{os.pathsep}{os.environ['PATH']}"}
    with open(out.with_suffix(".log"), "w") as log_file:
        subprocess.run(command, check=True, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    export = json.loads(next(out.rglob("profile_export_aiperf.json")).read_text())
    values = {name: export.get(key, {}).get(stat) for name, (_, (key, stat)) in METRICS.items()}
    return values | {"command": command}


def spread(values: list[float | None]) -> dict:
    got = [v for v in values if v is not None]
    return {"min": min(got), "median": statistics.median(got), "max": max(got)} if got else None


def compare(runs: dict[str, list[dict]]) -> dict:
    table = {}
    for name in METRICS:
        ours, theirs = spread([r[name] for r in runs["dflash-bench"]]), spread([r[name] for r in runs["aiperf"]])
        inside = overlap = ratio = None
        if ours and theirs:
            inside = (theirs["min"] <= ours["median"] <= theirs["max"]
                      and ours["min"] <= theirs["median"] <= ours["max"])
            overlap = ours["min"] <= theirs["max"] and theirs["min"] <= ours["max"]
            ratio = ours["median"] / theirs["median"] if theirs["median"] else None
        table[name] = {"dflash-bench": ours, "aiperf": theirs, "medians_inside_each_others_range": inside,
                       "ranges_overlap": overlap, "median_ratio": ratio}
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=32, help="measured requests per run")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--osl", type=int, default=64)
    p.add_argument("--aiperf-venv", default=str(ROOT / ".venv-aiperf"))
    p.add_argument("--output", default=str(OUT))
    args = p.parse_args()

    binary, aiperf_version = aiperf_venv(Path(args.aiperf_venv))
    work = Path(tempfile.mkdtemp(prefix="aiperf-crosscheck-"))
    from trtllm_dflash.cli.demo import build

    engine = build(work)
    ours, theirs = write_prompts(work, 4 * (args.requests + args.warmup), args.osl)
    proc, ports = serve(engine, work)
    log(f"serving on :{ports['openai']} (OpenAI), work dir {work}")
    runs: dict[str, list[dict]] = {"dflash-bench": [], "aiperf": []}
    try:
        for rep in range(args.repeats):
            order = ["dflash-bench", "aiperf"] if rep % 2 == 0 else ["aiperf", "dflash-bench"]
            for client in order:
                out = work / f"{client}-{rep}"
                log(f"repeat {rep + 1}/{args.repeats}: {client}")
                runs[client].append(run_dflash_bench(args, engine, ports, ours, out) if client == "dflash-bench"
                                    else run_aiperf(args, binary, engine, ports, theirs, out))
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    table = compare(runs)
    result = {
        "command": "python benchmarks/aiperf_crosscheck.py " + " ".join(sys.argv[1:]),
        "settings": vars(args) | {"model": MODEL, "prompts": "trtllm_dflash.pairs.held_out_texts (stdlib snippets)",
                                  "engine": "built-in pair, torch, float32", "temperature": 0, "ignore_eos": True},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "aiperf": aiperf_version, "note": "a shared 2-core machine: absolute numbers are noisy"},
        "dflash_serve_exit_code": code,
        "runs": runs, "comparison": table,
    }
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'metric':32} {'dflash-bench min/med/max':>26} {'AIPerf min/med/max':>26}  ratio  overlap  inside")
    for name, row in table.items():
        cells = [" / ".join(f"{row[c][k]:.1f}" for k in ("min", "median", "max")) if row[c] else "n/a"
                 for c in ("dflash-bench", "aiperf")]
        ratio = "n/a" if row["median_ratio"] is None else f"{row['median_ratio']:.2f}"
        print(f"{name:32} {cells[0]:>26} {cells[1]:>26}  {ratio:>5}  {row['ranges_overlap']!s:7}  "
              f"{row['medians_inside_each_others_range']}")
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
