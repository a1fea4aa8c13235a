"""Served output tokens/s of this tree's serving loop against a baseline commit's, plain and DFlash servers.

    python benchmarks/serve_loop_overhead.py [--baseline ff7ff5f] [--repeats 3] [--threads 2]
                                             [--points short:1,short:16,1024:1] [--decodings plain,dflash]
                                             [--warmup N]

The serving loop's host work between steps (metrics, cancellation checks, answers) talks to the Triton
server process; trtllm_dflash/serve/loop.py batches it (METRICS_FLUSH_S, CANCEL_POLL_S). This measures what
that changes where users see it: real tritonservers up at once (two per decoding in `--decodings`) on the
engine, calibration and prompts of benchmarks/serve_dflash_vs_plain.py (built-in pair, float32, max_batch_size 16, `--draft-len auto`), plain
decoding and DFlash each served by this tree and by the baseline commit (its package exported with `git
archive` and put first on the path of the servers' model files). Every point runs on the baseline's server and this
tree's back to back, order alternating from point to point and between repeats (the servers start fresh
every repeat). Output tokens/s per point and the ratio this tree / baseline per repeat, median and range.
Writes benchmarks/results/serve_loop_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_dflash_vs_plain import prompt_sets, run_point, serve, served_engine, warm_up  # noqa: E402

OUT = Path(__file__).parent / "results" / "serve_loop_overhead.json"
ROOT = Path(__file__).resolve().parent.parent


def export_package(commit: str, dest: Path) -> Path:
    """The baseline's trtllm_dflash package under dest; -> the directory to put first on sys.path."""
    archive = dest / "baseline.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), commit, "trtllm_dflash"], check=True)
    with tarfile.open(archive) as tar:  # git's own archive of the repository: trusted members
        try:
            tar.extractall(dest / "baseline", filter="data")
        except TypeError:  # Python without extraction filters (before 3.10.12 / 3.11.4)
            tar.extractall(dest / "baseline")
    return dest / "baseline"


def run_repeat(engine, root, baseline, args, prompts, rep: int) -> list[dict]:
    from trtllm_dflash.serve.server import stop_server

    trees = ("baseline", "this") if rep % 2 == 0 else ("this", "baseline")
    servers = {}
    try:
        for decoding in args.decodings:
            for tree in trees:
                servers[tree, decoding] = serve(engine, root, decoding, "auto", args.threads, f"{tree}-{decoding}",
                                                baseline if tree == "baseline" else None)
        for _, ends in servers.values():  # serve_dflash_vs_plain.py's warm-up (--warmup: N of each context)
            warm_up(f"{ends.http_url}/v2/models/m/generate", prompts, args.warmup)
        rows = []
        for i, (context, c) in enumerate(args.points):
            for decoding in args.decodings:
                for tree in trees if i % 2 == 0 else trees[::-1]:
                    ends = servers[tree, decoding][1]
                    row = run_point(f"{ends.http_url}/v2/models/m/generate", ends.metrics_url, prompts[context], c,
                                    6 * c)
                    rows.append({"tree": tree, "decoding": decoding, "context": context, **row, "repeat": rep})
                    print(f"  {tree:8} {decoding:6} {context:>5} c={c:<3} {row['output_tokens_per_s']:8.1f} tok/s "
                          f"plain steps {row['plain_step_share']}", file=sys.stderr, flush=True)
        return rows
    finally:
        for proc, _ in servers.values():
            stop_server(proc)


def summarize(rows: list[dict], args) -> list[dict]:
    table = []
    for context, c in args.points:
        for decoding in args.decodings:
            def rate(tree, rep):
                return next(r["output_tokens_per_s"] for r in rows if (r["tree"], r["decoding"], r["context"],
                            r["concurrency"], r["repeat"]) == (tree, decoding, context, c, rep))
            ratios = [rate("this", i) / rate("baseline", i) for i in range(args.repeats)]
            table.append({"context": context, "concurrency": c, "decoding": decoding,
                          "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                          "ratio_max": max(ratios), "ratios": ratios,
                          "baseline_tok_s_median": statistics.median(rate("baseline", i) for i in range(args.repeats)),
                          "this_tok_s_median": statistics.median(rate("this", i) for i in range(args.repeats)),
                          "plain_step_share": {tree: [r["plain_step_share"] for r in rows if (r["tree"], r["decoding"],
                                               r["context"], r["concurrency"]) == (tree, decoding, context, c)]
                                               for tree in ("baseline", "this")}})
    return table


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--baseline", default="ff7ff5f", help="the commit to compare with (before the loop's batching)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--points", default="short:1,short:16,1024:1")
    p.add_argument("--decodings", default="plain,dflash", help="the servers' --decoding, each served by both trees")
    p.add_argument("--warmup", type=int, default=0, help="untimed requests of each context per server before timing")
    p.add_argument("--output", default=str(OUT))
    args = p.parse_args()
    args.decodings = args.decodings.split(",")
    args.points = [(ctx, int(c)) for ctx, c in (point.split(":") for point in args.points.split(","))]
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    from transformers import AutoTokenizer

    from trtllm_dflash.pairs import stdlib_pair

    torch.set_num_threads(args.threads)
    this = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                          text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        baseline = export_package(args.baseline, root)
        engine, _ = served_engine(root, max(c for _, c in args.points), "benchmarks/serve_loop_overhead.py")
        prompts = prompt_sets(AutoTokenizer.from_pretrained(stdlib_pair()[0]), quick=False)
        rows = []
        for rep in range(args.repeats):
            print(f"repeat {rep + 1}/{args.repeats}", file=sys.stderr, flush=True)
            rows += run_repeat(engine, root, baseline, args, prompts, rep)
    table = summarize(rows, args)
    record = {"command": "python " + " ".join(sys.argv), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "baseline": args.baseline, "this": this, "threads": args.threads, "load_average_at_end": os.getloadavg(),
              "table": table, "rows": rows}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'context':>7} {'conc':>4} {'decoding':>8} {'baseline tok/s':>14} {'this tok/s':>10} {'this/base':>9} "
          f"{'min':>5} {'max':>5}")
    for t in table:
        print(f"{t['context']:>7} {t['concurrency']:>4} {t['decoding']:>8} {t['baseline_tok_s_median']:>14.1f} "
              f"{t['this_tok_s_median']:>10.1f} {t['ratio_median']:>9.2f} {t['ratio_min']:>5.2f} "
              f"{t['ratio_max']:>5.2f}")
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
